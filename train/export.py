"""Write a draft LM as a Hugging Face Llama checkpoint: config.json + model.safetensors + tokenizer.

The same directory loads in Tandem (``--draft DIR``) and in transformers
(``AutoModelForCausalLM.from_pretrained(DIR)``, e.g. as ``assistant_model`` for its assisted
generation), so both are compared on the very same draft.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.tokenizer import Tokenizer


def hf_config(cfg: ModelConfig) -> dict:
    out = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": cfg.attention_bias,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }
    s = cfg.rope_scaling
    if s.kind == "linear":
        out["rope_scaling"] = {"rope_type": "linear", "factor": s.factor}
    elif s.kind == "llama3":
        out["rope_scaling"] = {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                               "high_freq_factor": s.high_freq_factor,
                               "original_max_position_embeddings": s.original_max_position}
    return out


def hf_tensors(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """Our fused weights -> Hugging Face names (q/k/v and gate/up split again), bf16 on the CPU."""
    cfg = model.config
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if name.startswith("model.rotary."):
            continue
        t = t.detach().to(torch.bfloat16).cpu()
        prefix, _, leaf = name.rpartition(".")
        if prefix.endswith("qkv_proj"):
            base = prefix.removesuffix("qkv_proj")
            for part, piece in zip(("q_proj", "k_proj", "v_proj"), t.split([q, kv, kv], dim=0)):
                out[f"{base}{part}.{leaf}"] = piece.contiguous()
        elif prefix.endswith("gate_up_proj"):
            base = prefix.removesuffix("gate_up_proj")
            gate, up = t.chunk(2, dim=0)
            out[f"{base}gate_proj.{leaf}"], out[f"{base}up_proj.{leaf}"] = gate.contiguous(), up.contiguous()
        else:
            out[name] = t.contiguous()
    return out


def save_hf(model: LlamaForCausalLM, tokenizer: Tokenizer, directory: Path, extra: dict | None = None) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(hf_tensors(model), str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps({**hf_config(model.config), **(extra or {})}, indent=2) + "\n")
    tokenizer.save_hf(directory)
