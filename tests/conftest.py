"""Shared fixtures: the real SmolLM2 model, loaded once per session on the CPU in float32."""

from __future__ import annotations

import os

import pytest
import torch

from engine.assets import default_model_path
from engine.config import EngineConfig
from engine.factory import decoder_for
from engine.models.loader import LoadedModel, load_model
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


@pytest.fixture(scope="session")
def hf_smollm(smollm_path):
    """transformers' LlamaForCausalLM on the same GGUF weights (its own dequantization), float32."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(smollm_path.parent), gguf_file=smollm_path.name,
                                                dtype=torch.float32).eval()
