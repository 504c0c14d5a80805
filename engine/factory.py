"""Assemble an engine from edge settings: load the target, size the KV cache, build the drafter."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.drafters import DraftSpec, build_drafter, resolve_draft
from engine.models.loader import LoadedModel, load_model, model_source
from engine.runner import ModelRunner
from engine.spec import SpecDecoder


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> str:
    return "float32" if device == "cpu" else "bfloat16"


@dataclass
class Engine:
    decoder: SpecDecoder
    target: LoadedModel
    config: EngineConfig
    draft: DraftSpec


def build_engine(model: str | Path | None, draft: str | DraftSpec, config: EngineConfig,
                 progress: bool = True) -> Engine:
    """``config.kv_cache_tokens`` None: each runner sizes its cache from the device's default budget."""
    path = model_source(model, quiet=not progress)
    spec = draft if isinstance(draft, DraftSpec) else DraftSpec.parse(draft)
    target = load_model(path, device=config.device, dtype=config.torch_dtype, progress=progress)
    spec = resolve_draft(spec, target.config, quiet=not progress)
    runner = ModelRunner(target.model, config)
    drafter = build_drafter(spec, target, config)
    return Engine(SpecDecoder(runner, target.tokenizer, config, drafter), target, config, spec)
