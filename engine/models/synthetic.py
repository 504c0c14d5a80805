"""Synthetic targets: the published shapes of models users run, with seeded random weights.

``synthetic:NAME[:layers=N][:seed=S]`` (``--model``, ``load_model``) is NAME's published Hugging Face
config (``CONFIGS``: Llama-3.2-1B, Llama-3.1-8B, read by the same code as a config.json) with random
weights: normal(0, 0.02) as transformers initialises a Llama, norms at 1. Each tensor is drawn from its own
generator, seeded by S (default 0) and the tensor's name, so a spec gives the same weights every time (on
one device, in one dtype) and ``layers=N`` (the first N layers only, for tests) is exactly the first N
layers of the whole model. The model is built on the meta device, allocated on the target device in the
target dtype and filled in place, one tensor at a time: the 8B model in bfloat16 (16 GB) never exists in
float32, on the host or twice.

The tokenizer is the default model's (SmolLM2-135M-Instruct, ``engine.assets.default_model_path``): its
49,152 ids are all valid in a 128,256-token vocabulary, so prompts and chat templates work; ids above
them, which the random model emits too, decode to nothing. Speed is meaningful on these weights,
acceptance is not: what a drafter accepts of a random target says nothing about the real model.

``hf_directory`` writes the config and tokenizer only, what vLLM's ``load_format="dummy"`` needs to build
the same shapes with its own random weights.
"""

from __future__ import annotations

import copy
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from engine.config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.tokenizer import Tokenizer

PREFIX = "synthetic:"
INIT_STD = 0.02  # transformers' initializer_range for Llama

# config.json of meta-llama/Llama-3.2-1B and meta-llama/Llama-3.1-8B, as published
CONFIGS: dict[str, dict] = {
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 8192,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 128256,
    },
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 128256,
    },
}


@dataclass(frozen=True)
class SyntheticSpec:
    name: str                 # a key of CONFIGS
    layers: int | None = None  # keep only the first layers (None: all)
    seed: int = 0

    def __str__(self) -> str:
        opts = ([f"layers={self.layers}"] if self.layers is not None else []) + \
               ([f"seed={self.seed}"] if self.seed else [])
        return ":".join([PREFIX + self.name, *opts])


def is_synthetic(model: object) -> bool:
    """Whether ``model`` (a ``--model`` value) is a ``synthetic:`` spec rather than a path."""
    return isinstance(model, str) and model.startswith(PREFIX)


def parse(text: str) -> SyntheticSpec:
    """``synthetic:NAME[:layers=N][:seed=S]`` -> SyntheticSpec; ValueError naming ``model`` otherwise."""
    if not is_synthetic(text):
        raise ValueError(f"model: {text!r} is not a {PREFIX}NAME spec")
    name, *options = text[len(PREFIX):].split(":")
    name = name.strip().lower()
    if name not in CONFIGS:
        raise ValueError(f"model: unknown synthetic model {name!r} (known: "
                         f"{', '.join(PREFIX + n for n in CONFIGS)})")
    values: dict[str, int] = {}
    for option in options:
        key, _, value = option.partition("=")
        if key not in ("layers", "seed") or key in values:
            raise ValueError(f"model: {text!r}: option {option!r} is not layers=N or seed=S (each at most once)")
        try:
            values[key] = int(value)
        except ValueError:
            raise ValueError(f"model: {text!r}: {key} takes an integer, got {value!r}") from None
    total = CONFIGS[name]["num_hidden_layers"]
    layers = values.get("layers")
    if layers is not None and not 1 <= layers <= total:
        raise ValueError(f"model: {text!r}: layers must be in [1, {total}], got {layers}")
    seed = values.get("seed", 0)
    if not 0 <= seed < 2**31:
        raise ValueError(f"model: {text!r}: seed must be in [0, 2**31), got {seed}")
    return SyntheticSpec(name, layers, seed)


def published_config(name: str) -> dict:
    """A copy of ``CONFIGS[name]`` (consumers such as transformers' configs edit the dicts they are given)."""
    return copy.deepcopy(CONFIGS[name])


def model_config(spec: SyntheticSpec) -> ModelConfig:
    """The published config (first ``spec.layers`` layers only, when given), named after the spec."""
    from engine.models.weights.hf_loader import config_from_dict

    config = config_from_dict(published_config(spec.name), str(spec), default_name=str(spec))
    return config if spec.layers is None else config.truncated(spec.layers)


def tokenizer() -> Tokenizer:
    """The default model's tokenizer (SmolLM2-135M-Instruct; see the module docstring)."""
    from engine.assets import default_model_path
    from engine.models.weights.gguf_loader import open_gguf

    path = default_model_path(quiet=True)
    return Tokenizer.from_gguf_metadata(open_gguf(path).metadata, source=str(path))


def init_weights(model: LlamaForCausalLM, seed: int = 0, progress: bool = True) -> None:
    """Fill every parameter of ``model`` in place, where it lies and in its dtype: norms at 1, biases at 0, the
    rest normal(0, 0.02), each from a generator seeded by ``seed`` and the parameter's name."""
    params = list(model.named_parameters())
    with torch.no_grad():
        for name, p in tqdm(params, desc=f"init {model.config.name}", unit="tensor", disable=not progress,
                            file=sys.stderr):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                # 32 bits: the CPU generator (mt19937) keeps no more of a seed
                generator = torch.Generator(device=p.device).manual_seed(zlib.crc32(name.encode(), seed & 0xFFFFFFFF))
                p.normal_(0.0, INIT_STD, generator=generator)


def hf_directory(name: str, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write ``name``'s (``llama-3.1-8b`` or a whole ``synthetic:`` spec) config.json and the tokenizer files,
    no weights: a directory for vLLM's ``LLM(model=out_dir, load_format="dummy")``. Returns ``out_dir``."""
    from engine.models.weights.hf_writer import save_hf_config

    spec = parse(name if is_synthetic(name) else PREFIX + name)
    out = Path(out_dir)
    save_hf_config(model_config(spec), tokenizer(), out, dtype)
    return out
