"""Load a target or draft model: a GGUF file or a Hugging Face directory -> model + tokenizer."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.tokenizer import Tokenizer

# architecture (GGUF general.architecture / HF model_type) -> model class
MODEL_REGISTRY: dict[str, type[LlamaForCausalLM]] = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
}


@dataclass
class LoadedModel:
    model: LlamaForCausalLM | None  # None when loaded with load_weights=False (tokenizer and config only)
    config: ModelConfig             # of the loaded layers
    tokenizer: Tokenizer
    source: Path
    total_layers: int               # layers in the checkpoint (config.num_layers may be fewer)


def _build(arch: str, config: ModelConfig, weights, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    cls = MODEL_REGISTRY[arch]
    with torch.device("meta"):
        model = cls(config)
    model = model.to_empty(device=device).to(dtype)
    model.model.rotary.rebuild()  # float32 table, rebuilt after the dtype cast
    model.load_weights(weights)
    return model.eval().requires_grad_(False)


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               max_layers: int | None = None, progress: bool = True, load_weights: bool = True) -> LoadedModel:
    """Load a Llama-family checkpoint. ``max_layers`` keeps only the first layers (layer-skip
    drafts); ``load_weights=False`` reads only the config and tokenizer."""
    path = Path(path)
    device = torch.device(device)
    if path.is_dir():
        from engine.models.weights import hf_loader

        config = hf_loader.model_config(path)
        arch = hf_loader.read_config(path)["model_type"]
        tokenizer = Tokenizer.from_hf_dir(path)
        total = config.num_layers
        if max_layers is not None:
            config = config.truncated(max_layers)
        weights = hf_loader.iter_tensors(path, dtype, max_layers=max_layers, progress=progress)
    elif path.is_file():
        from engine.models.weights import gguf_loader

        f = gguf_loader.open_gguf(path)
        config = gguf_loader.model_config(f)
        arch = f.arch
        tokenizer = Tokenizer.from_gguf_metadata(f.metadata, source=str(path))
        total = config.num_layers
        if max_layers is not None:
            config = config.truncated(max_layers)
        weights = gguf_loader.iter_tensors(f, config, dtype, max_layers=max_layers, progress=progress)
    else:
        raise FileNotFoundError(f"model: {path} is neither a GGUF file nor a Hugging Face directory")
    if not load_weights:
        return LoadedModel(model=None, config=config, tokenizer=tokenizer, source=path, total_layers=total)
    model = _build(arch, config, weights, device, dtype)
    if progress:
        n = sum(p.numel() for p in model.parameters())
        print(f"tandem: loaded {config.name} ({n / 1e6:.0f}M parameters, {config.num_layers} layers) "
              f"on {device} as {str(dtype).removeprefix('torch.')}", file=sys.stderr)
    return LoadedModel(model=model, config=config, tokenizer=tokenizer, source=path, total_layers=total)
