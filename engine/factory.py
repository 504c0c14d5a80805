"""Assemble an engine from edge settings: load the target, size the KV cache, build the drafter."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.assets import default_model_path
from engine.config import EngineConfig
from engine.drafters import DraftSpec, build_drafter
from engine.models.loader import LoadedModel, load_model
from engine.runner import ModelRunner
from engine.spec import SpecDecoder

GiB = 1 << 30
DEFAULT_KV_BYTES = {"cpu": 1 * GiB, "cuda": 8 * GiB}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> str:
    return "float32" if device == "cpu" else "bfloat16"


def kv_tokens_for(model: LoadedModel, dtype: torch.dtype, budget_bytes: int) -> int:
    cfg = model.config
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * torch.finfo(dtype).bits // 8
    return max(1024, budget_bytes // per_token)


@dataclass
class Engine:
    decoder: SpecDecoder
    target: LoadedModel
    config: EngineConfig
    draft: DraftSpec


def build_engine(model: str | Path | None, draft: str | DraftSpec, config: EngineConfig,
                 kv_cache_bytes: int | None = None, progress: bool = True) -> Engine:
    """``config.kv_cache_tokens`` None means: size the cache from ``kv_cache_bytes`` (or the default)."""
    path = Path(model) if model else default_model_path(quiet=not progress)
    spec = draft if isinstance(draft, DraftSpec) else DraftSpec.parse(draft)
    target = load_model(path, device=config.device, dtype=config.torch_dtype, progress=progress)
    if config.kv_cache_tokens is None:
        budget = kv_cache_bytes or DEFAULT_KV_BYTES["cpu" if config.device == "cpu" else "cuda"]
        config = dataclasses.replace(config, kv_cache_tokens=kv_tokens_for(target, config.torch_dtype, budget))
    runner = ModelRunner(target.model, config)
    drafter = build_drafter(spec, target, config)
    return Engine(SpecDecoder(runner, target.tokenizer, config, drafter), target, config, spec)
