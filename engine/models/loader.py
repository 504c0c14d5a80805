"""Load a target or draft model: a GGUF file, a Hugging Face directory or a ``synthetic:`` spec (published
shapes, random weights: ``engine/models/synthetic.py``) -> model + tokenizer."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.models import synthetic
from engine.models.llama import LlamaForCausalLM
from engine.models.meta import build_empty
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
    source: Path | str              # the file or directory; a synthetic: spec as text
    total_layers: int               # layers in the checkpoint (config.num_layers may be fewer)
    synthetic: bool = False         # random weights (a synthetic: spec): speed is meaningful, acceptance is not


def model_source(model: str | Path | None, quiet: bool = False) -> Path | str:
    """A ``--model`` value -> what ``load_model`` takes: a ``synthetic:`` spec stays text, anything else is a
    path; None (or empty): the default model."""
    if not model:
        from engine.assets import default_model_path

        return default_model_path(quiet=quiet)
    return model if synthetic.is_synthetic(model) else Path(model)


def _allocate(arch: str, config: ModelConfig, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    """The model built on the meta device, then allocated once on ``device`` in ``dtype``; weights unset."""
    model = build_empty(lambda: MODEL_REGISTRY[arch](config), device, dtype)
    model.model.rotary.rebuild()  # float32 table, rebuilt after the dtype cast
    return model


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               max_layers: int | None = None, progress: bool = True, load_weights: bool = True) -> LoadedModel:
    """Load a Llama-family checkpoint, or build a ``synthetic:NAME[:layers=N][:seed=S]`` target (a str).
    ``max_layers`` keeps only the first layers (layer-skip drafts); ``load_weights=False`` reads only the
    config and tokenizer."""
    device = torch.device(device)
    is_synthetic = synthetic.is_synthetic(path)
    path = path if is_synthetic else Path(path)
    if is_synthetic:
        spec = synthetic.parse(path)
        path = str(spec)
        config, arch, tokenizer = synthetic.model_config(spec), "llama", synthetic.tokenizer()
        total = config.num_layers
        if max_layers is not None:
            config = config.truncated(max_layers)
    elif path.is_dir():
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
        raise FileNotFoundError(f"model: {path} is neither a GGUF file nor a Hugging Face directory "
                                f"(nor a {synthetic.PREFIX}NAME spec)")
    if not load_weights:
        return LoadedModel(model=None, config=config, tokenizer=tokenizer, source=path, total_layers=total,
                           synthetic=is_synthetic)
    model = _allocate(arch, config, device, dtype)
    if is_synthetic:
        synthetic.init_weights(model, spec.seed, progress=progress)  # in place: no second copy of the weights
    else:
        model.load_weights(weights)
    model.eval().requires_grad_(False)
    if progress:
        n = sum(p.numel() for p in model.parameters())
        layers = f"{config.num_layers} layers" if config.num_layers == total else \
            f"its first {config.num_layers} of {total} layers"
        print(f"tandem: loaded {config.name} ({layers}: {n / 1e6:.0f}M parameters) "
              f"on {device} as {str(dtype).removeprefix('torch.')}", file=sys.stderr)
    return LoadedModel(model=model, config=config, tokenizer=tokenizer, source=path, total_layers=total,
                       synthetic=is_synthetic)
