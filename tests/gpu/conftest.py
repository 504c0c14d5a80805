"""GPU test fixtures: the real SmolLM2 weights on CUDA in float32 (exact comparisons with the eager engine)."""

from __future__ import annotations

import pytest
import torch

from engine.models.loader import load_model


@pytest.fixture(scope="session")
def f32(smollm_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return load_model(smollm_path, device="cuda", dtype=torch.float32, progress=False)
