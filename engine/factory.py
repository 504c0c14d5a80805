"""Assemble an engine from edge settings: load the target, size the KV cache, build the drafter."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from engine.config import EngineConfig
from engine.drafters import DraftSpec, Drafter, build_drafter, resolve_draft
from engine.models.loader import LoadedModel, load_model, model_source
from engine.runner import ModelRunner
from engine.spec import SpecDecoder


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def use_device(device: str) -> None:
    """Make ``cuda:N`` the process's current CUDA device: a graph captured on a device that is not the current
    one fails (the capture stream and the allocations would belong to different devices)."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is not None:
        torch.cuda.set_device(dev)


def engine_thread(name: str, device: str) -> ThreadPoolExecutor:
    """A service's one engine thread, with ``device`` its current CUDA device: the current device is a thread's own,
    so a thread that captures or replays graphs on ``cuda:1`` must make it current itself."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=use_device, initargs=(device,))


def default_dtype(device: str) -> str:
    return "float32" if device == "cpu" else "bfloat16"


@dataclass
class Engine:
    decoder: SpecDecoder
    target: LoadedModel
    config: EngineConfig
    draft: DraftSpec


def decoder_for(model: LoadedModel, config: EngineConfig, drafter: str | DraftSpec | Drafter | None = "none",
                local: Drafter | None = None) -> SpecDecoder:
    """A decoder over an already-loaded target: its runner, and ``drafter`` (a spec such as ``auto`` or ``ngram``,
    built here, or a drafter already made; none: plain decoding). ``local``: as ``SpecDecoder``'s."""
    if isinstance(drafter, (str, DraftSpec)):
        drafter = build_drafter(drafter if isinstance(drafter, DraftSpec) else DraftSpec.parse(drafter), model, config)
    return SpecDecoder(ModelRunner(model.model, config), model.tokenizer, config, drafter, local=local)


def build_engine(model: str | Path | None, draft: str | DraftSpec, config: EngineConfig,
                 progress: bool = True, drafter: Callable[[LoadedModel], Drafter] | None = None,
                 local: str = "none") -> Engine:
    """``config.kv_cache_tokens`` None: each runner sizes its cache from the device's default budget. ``drafter``:
    builds the drafter from the loaded target instead of ``draft`` (which must then be none), e.g. a drafter
    service the verifier calls (verifier_svc/remote_drafter.py); ``local``, with it: a drafter spec (ngram) that
    drafts inside the round's graph for the requests whose rounds with that drafter do not pay (engine/spec.py)."""
    use_device(config.device)
    path = model_source(model, quiet=not progress)
    spec = draft if isinstance(draft, DraftSpec) else DraftSpec.parse(draft)
    target = load_model(path, device=config.device, dtype=config.torch_dtype, progress=progress)
    spec = resolve_draft(spec, target.config, quiet=not progress)
    if drafter is not None and spec.kind != "none":
        raise ValueError(f"draft: {spec} given beside a drafter of another kind; give one")
    made = drafter(target) if drafter is not None else build_drafter(spec, target, config)
    own = build_drafter(DraftSpec.parse(local), target, config) if drafter is not None else None
    return Engine(decoder_for(target, config, made, local=own), target, config, spec)
