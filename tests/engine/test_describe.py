"""A drafter in words (``tandem demo``): named for what it is, from its files, with nothing loaded on a device."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.drafters import TRAINED_DIR
from engine.drafters.describe import describe_draft, model_name, parameter_count
from engine.models.loader import load_model


@pytest.fixture(scope="module")
def target(smollm_path):
    return load_model(smollm_path, load_weights=False, progress=False)


def test_the_default_drafter_is_the_eagle_head_shipped_for_smollm2(target):
    text = describe_draft("auto", target)
    assert text.startswith("an EAGLE head trained for SmolLM2-135M-Instruct, 5.2M parameters")
    assert "layers 1, 14, 26" in text
    assert parameter_count(TRAINED_DIR / "smollm2-135m-instruct-eagle") == 5_200_704


@pytest.mark.parametrize("draft, words", [
    ("ngram", "prompt lookup (n-grams of up to 3 tokens"), ("ngram:5", "up to 5 tokens"),
    ("layerskip:4", "SmolLM2-135M-Instruct's own first 4 of 30 layers"), ("none", "plain decoding")])
def test_other_drafters(target, draft, words):
    assert words in describe_draft(draft, target)


@pytest.mark.parametrize("source, name", [
    (Path("/c/SmolLM2-135M-Instruct.Q4_1.gguf"), "SmolLM2-135M-Instruct"), (Path("/c/llama-3.2-1b.F16.gguf"), "llama-3.2-1b"),
    (Path("/models/Qwen2-0.5B"), "Qwen2-0.5B"), ("synthetic:llama-3.2-1b", "synthetic:llama-3.2-1b")])
def test_model_name(source, name):
    assert model_name(source) == name
