"""Write a model as a Hugging Face checkpoint: config.json, model.safetensors and the tokenizer files.

The directory loads in Tandem (``--model DIR`` / ``--draft DIR``), in transformers
(``AutoModelForCausalLM.from_pretrained(DIR)``) and in vLLM (``LLM(model=DIR)``), so engines are compared
on the very same weights. A Llama-family model is written as ``LlamaForCausalLM``, one with q/k/v biases
as ``Qwen2ForCausalLM`` (a Llama config's ``attention_bias`` would add an o_proj bias too). A Llama 3
GGUF's ``rope_freqs`` become the llama3 ``rope_scaling`` they were computed from. ``save_hf_config``
writes the config and tokenizer only: what a serving engine needs to build the model with dummy weights.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from engine.config import ModelConfig, RopeScaling
from engine.models.layers import inv_freq
from engine.models.llama import LlamaForCausalLM
from engine.tokenizer import Tokenizer

# what Llama 3.1 / 3.2 publish; llama.cpp folds it into per-frequency factors (rope_freqs)
_LLAMA3_PUBLISHED = dict(low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192)


def hf_config(cfg: ModelConfig, dtype: torch.dtype = torch.bfloat16, tokenizer: Tokenizer | None = None) -> dict:
    """config.json for ``cfg`` with weights in ``dtype``; ``tokenizer`` adds its BOS / EOS ids."""
    arch = "qwen2" if cfg.attention_bias else "llama"
    dtype_name = str(dtype).removeprefix("torch.")
    out = {
        "architectures": ["Qwen2ForCausalLM" if arch == "qwen2" else "LlamaForCausalLM"],
        "model_type": arch,
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
        "hidden_act": "silu",
        "torch_dtype": dtype_name,  # transformers 4.x and the vLLM releases built on it
        "dtype": dtype_name,        # transformers 5
    }
    if arch == "qwen2":
        out["use_sliding_window"] = False
    else:
        out.update(attention_bias=False, mlp_bias=False)
    s = cfg.rope_scaling
    if s.kind == "linear":
        out["rope_scaling"] = {"rope_type": "linear", "factor": s.factor}
    elif s.kind == "llama3":
        out["rope_scaling"] = {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                               "high_freq_factor": s.high_freq_factor,
                               "original_max_position_embeddings": s.original_max_position}
    if tokenizer is not None:
        if tokenizer.bos_token_id is not None:
            out["bos_token_id"] = tokenizer.bos_token_id
        eos = sorted(tokenizer.eos_token_ids)
        if eos:
            out["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    return out


def exported_config(model: LlamaForCausalLM) -> ModelConfig:
    """The model's config, a GGUF's llama3 ``rope_freqs`` (kept by its rotary) turned back into ``rope_scaling``."""
    return with_rope_freqs(model.config, model.model.rotary.freq_factors)


def with_rope_freqs(cfg: ModelConfig, factors: torch.Tensor | None) -> ModelConfig:
    """``cfg`` with per-frequency rotary factors (a llama3 GGUF's ``rope_freqs``) expressed as the llama3
    ``rope_scaling`` they were computed from; ValueError naming ``rope_freqs`` where none matches."""
    if factors is None:
        return cfg
    factors = factors.float().cpu()
    candidate = RopeScaling(kind="llama3", factor=float(factors.max()), **_LLAMA3_PUBLISHED)
    loaded = inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling) / factors
    if cfg.rope_scaling.kind == "none" and torch.allclose(
            loaded, inv_freq(cfg.head_dim, cfg.rope_theta, candidate), rtol=1e-5, atol=0):
        return dataclasses.replace(cfg, rope_scaling=candidate)
    raise ValueError("rope_freqs: the model's per-frequency rotary factors (a GGUF's rope_freqs) are not llama3 "
                     "scaling with low_freq_factor 1, high_freq_factor 4 and original_max_position_embeddings "
                     "8192, so no Hugging Face config holds them; export from the model's Hugging Face directory")


def hf_tensors(model: LlamaForCausalLM, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Our fused weights -> Hugging Face names (q/k/v and gate/up split again), in ``dtype`` on the CPU."""
    cfg = model.config
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if name.startswith("model.rotary."):
            continue
        t = t.detach().to(dtype).cpu()
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


def save_hf_config(cfg: ModelConfig, tokenizer: Tokenizer, directory: Path, dtype: torch.dtype = torch.bfloat16,
                   extra: dict | None = None) -> None:
    """config.json and the tokenizer files (tokenizer.json, tokenizer_config.json with the chat template,
    generation_config.json): a checkpoint without weights."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {**hf_config(cfg, dtype, tokenizer), **(extra or {})}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer.save_hf(directory)


def save_hf(model: LlamaForCausalLM, tokenizer: Tokenizer, directory: Path, extra: dict | None = None,
            dtype: torch.dtype = torch.bfloat16) -> None:
    """The whole checkpoint: ``save_hf_config`` plus model.safetensors with the weights in ``dtype``."""
    from safetensors.torch import save_file

    cfg = exported_config(model)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(hf_tensors(model, dtype), str(directory / "model.safetensors"), metadata={"format": "pt"})
    save_hf_config(cfg, tokenizer, directory, dtype, extra)
