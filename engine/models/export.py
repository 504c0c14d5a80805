"""Export what ``load_model`` reads as a Hugging Face directory (``tandem export-hf``), so another engine
(transformers, vLLM) runs the very same weights and tokenizer as Tandem.

A GGUF is dequantized as Tandem loads it and written in the chosen dtype; a ``synthetic:`` target is
written with its seeded random weights. ``config_only`` writes config.json and the tokenizer files but no
weights: what vLLM's ``load_format="dummy"`` needs to build the same shapes (an 8B synthetic target's
16 GB of random weights are never made).
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.models.loader import load_model, model_source
from engine.models.weights.hf_writer import save_hf, save_hf_config, with_rope_freqs

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def export_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"`` / ``"float32"`` (or that torch dtype) -> the torch dtype; ValueError naming ``dtype``."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype: must be {' or '.join(DTYPES)}, got {dtype!r}")


def export_hf(model: str | Path | None, out_dir: str | Path, dtype: str | torch.dtype = "bfloat16",
              config_only: bool = False, progress: bool = False) -> Path:
    """Write ``model`` (a GGUF file, a Hugging Face directory, a ``synthetic:`` spec; None: the default
    model) into ``out_dir``: config.json, model.safetensors (unless ``config_only``), tokenizer.json,
    tokenizer_config.json (with the chat template) and generation_config.json. Returns ``out_dir``."""
    torch_dtype = export_dtype(dtype)
    source = model_source(model, quiet=not progress)
    out = Path(out_dir)
    # loaded in the export dtype: a GGUF dequantizes to float32 first either way, a checkpoint is cast once
    loaded = load_model(source, device="cpu", dtype=torch_dtype, progress=progress, load_weights=not config_only)
    if loaded.model is not None:
        save_hf(loaded.model, loaded.tokenizer, out, dtype=torch_dtype)
        return out
    config = loaded.config
    if isinstance(source, Path) and source.is_file():  # a GGUF: its rope_freqs are a tensor, not metadata
        from engine.models.weights import gguf_loader

        config = with_rope_freqs(config, gguf_loader.rope_freqs(gguf_loader.open_gguf(source)))
    save_hf_config(config, loaded.tokenizer, out, torch_dtype)
    return out

