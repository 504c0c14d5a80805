"""Shared fixtures: the real SmolLM2 model, loaded once per session on the CPU in float32."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest
import torch

from engine.assets import default_model_path
from engine.config import EngineConfig, SamplingParams
from engine.factory import decoder_for
from engine.models.loader import LoadedModel, load_model
from engine.request import RequestOutput
from engine.spec import SpecDecoder


if os.environ.get("PYTEST_XDIST_WORKER"):
    # one pytest worker per core (``make test``: -n 2): a worker's torch takes its one core, not all of them
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm_path():
    return default_model_path(quiet=True)


@pytest.fixture(scope="session")
def smollm(smollm_path) -> LoadedModel:
    return load_model(smollm_path, device="cpu", progress=False)


def make_decoder(model: LoadedModel, draft: str = "none", k: int = 4, kv_cache_tokens: int = 8192,
                 max_batch_size: int = 64, **overrides) -> SpecDecoder:
    config = EngineConfig(kv_cache_tokens=kv_cache_tokens, k=k, max_k=max(8, k), max_batch_size=max_batch_size,
                          **overrides)
    return decoder_for(model, config, draft)


_EAGER: dict[tuple, list[RequestOutput]] = {}


def eager_outputs(model: LoadedModel, draft: str, k: int, prompts: Sequence[Sequence[int]],
                  params: SamplingParams | Sequence[SamplingParams], **overrides) -> list[RequestOutput]:
    """The eager engine's outputs (no graphs) for ``prompts``: what a test checks another path against. Decoded
    once per worker for each (drafter, k, prompts, params, config): several tests and parameter cases check
    different paths against the same eager decoding. Sampled params need a seed (else no two runs agree)."""
    plist = tuple([params] * len(prompts) if isinstance(params, SamplingParams) else params)
    assert all(p.greedy or p.seed is not None for p in plist), "an unseeded sampled reference is not one"
    key = (id(model), draft, k, tuple(tuple(p) for p in prompts), plist, tuple(sorted(overrides.items())))
    if key not in _EAGER:
        _EAGER[key] = make_decoder(model, draft, k=k, cuda_graphs=False, **overrides).generate(prompts, list(plist))
    return list(_EAGER[key])


@pytest.fixture(scope="session")
def hf_smollm(smollm_path):
    """transformers' LlamaForCausalLM on the same GGUF weights (its own dequantization), float32: converted once
    per machine and kept in the tandem cache (``bench.hf.hf_directory``)."""
    from bench.hf import load_hf

    return load_hf(smollm_path, "cpu", torch.float32)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` hands out the heaviest remaining test file first (tests/scheduling.py)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    from tests.scheduling import load, make_scheduler

    return make_scheduler(LoadFileScheduling, load())(config, log)
