"""Read a Hugging Face model directory: config.json and (sharded) safetensors."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterator

import torch
from tqdm import tqdm

from engine.config import ModelConfig, RopeScaling

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: no config.json (a Hugging Face model directory needs one)")
    return json.loads(path.read_text())


def _rope_scaling(cfg: dict[str, Any]) -> tuple[float, RopeScaling]:
    # transformers 4.x: rope_theta + rope_scaling; 5.x: rope_parameters holding both
    params = cfg.get("rope_parameters") or {}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    scaling = cfg.get("rope_scaling") or params
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if kind in ("default", None):
        return theta, RopeScaling()
    if kind == "linear":
        return theta, RopeScaling(kind="linear", factor=float(scaling["factor"]))
    if kind == "llama3":
        return theta, RopeScaling(
            kind="llama3", factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position=int(scaling["original_max_position_embeddings"]))
    raise ValueError(f"rope_scaling: type {kind!r} is not supported")


def model_config(directory: Path) -> ModelConfig:
    return config_from_dict(read_config(directory), str(directory), default_name=directory.name)


def config_from_dict(cfg: dict[str, Any], source: str, default_name: str = "llama") -> ModelConfig:
    """A config.json's contents -> ModelConfig (``source`` names where it came from in errors)."""
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{source}: model_type {model_type!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    heads = int(cfg["num_attention_heads"])
    theta, scaling = _rope_scaling(cfg)
    max_position = int(cfg.get("max_position_embeddings", 4096))
    window = cfg.get("sliding_window")
    if window and cfg.get("use_sliding_window", model_type == "mistral"):
        # full attention over at most `window` tokens is exactly sliding-window attention
        max_position = min(max_position, int(window))
    return ModelConfig(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position=max_position,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
        name=str(cfg.get("_name_or_path") or default_name),
    )


def safetensor_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [directory / s for s in shards]
    else:
        files = sorted(directory.glob("*.safetensors"))
    missing = [f for f in files if not f.is_file()]
    if not files or missing:
        raise FileNotFoundError(f"{directory}: no safetensors weights"
                                + (f" (missing shards: {[m.name for m in missing]})" if missing else ""))
    return files


def iter_tensors(directory: Path, dtype: torch.dtype, max_layers: int | None = None,
                 progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = safetensor_files(directory)
    names: list[tuple[Path, str]] = []
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            names.extend((f, n) for n in st.keys())
    handles: dict[Path, Any] = {}
    try:
        for f, name in tqdm(names, desc=f"load {directory.name}", unit="tensor", disable=not progress,
                            file=sys.stderr):
            if max_layers is not None and name.startswith("model.layers."):
                if int(name.split(".")[2]) >= max_layers:
                    continue
            if f not in handles:
                handles[f] = safe_open(str(f), framework="pt")
            yield name, handles[f].get_tensor(name).to(dtype)
    finally:
        handles.clear()
