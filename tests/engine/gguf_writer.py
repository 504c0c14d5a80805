"""GGUF test files written the way llama.cpp's convert_hf_to_gguf.py writes them (tests/engine/test_model_formats.py):
tensor names, llama.cpp's q/k row permutation, llama3 ``rope_freqs``, quantized tensor types."""

from __future__ import annotations

import math
import re
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType

_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}
_GGUF_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}


def gguf_tensor_name(hf: str) -> str:
    if hf in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[hf]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", hf)
    return f"blk.{m.group(1)}.{_GGUF_LAYER[m.group(2)]}"


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (HF rotate_half rows -> llama.cpp's interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(head_dim: int, rope: dict) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors for rope_type llama3."""
    base = rope["rope_theta"]
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_context_len = rope["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_gguf(path: Path, arch: str, model, qtype_of, tokenizer_kv: list | None, *,
               rope_freqs: np.ndarray | None = None, skip: tuple[str, ...] = (),
               extra: dict[str, np.ndarray] | None = None) -> dict[str, torch.Tensor]:
    """Write ``model`` as a GGUF, each 2-D weight in the type ``qtype_of(hf_name)``; return the HF-layout
    weights the file really holds (the quantization round trip), for the transformers reference."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_string("general.name", f"tiny-{arch}")
    w.add_uint32(f"{arch}.block_count", cfg.num_hidden_layers)
    w.add_uint32(f"{arch}.context_length", cfg.max_position_embeddings)
    w.add_uint32(f"{arch}.embedding_length", cfg.hidden_size)
    w.add_uint32(f"{arch}.feed_forward_length", cfg.intermediate_size)
    w.add_uint32(f"{arch}.attention.head_count", cfg.num_attention_heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", cfg.num_key_value_heads)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    w.add_float32(f"{arch}.rope.freq_base", cfg.rope_parameters["rope_theta"])
    w.add_uint32(f"{arch}.vocab_size", cfg.vocab_size)
    for key, value, types in tokenizer_kv or ():
        if types[0] == GGUFValueType.ARRAY:
            w.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=types[1])
        else:
            w.add_key_value(key, value, types[0])
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs)
    permute = arch in ("llama", "mistral")
    held: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():  # named_parameters() lists a tied head once, as the embedding
        if name in skip:
            continue
        arr = p.detach().numpy().astype(np.float32)
        n_head = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}.get(name.split(".")[-2])
        order = None
        if permute and n_head and name.endswith(".weight"):
            order = llamacpp_permute(np.arange(arr.shape[0]), n_head)
            arr = llamacpp_permute(arr, n_head)
            assert np.array_equal(arr, p.detach().numpy()[order])
        if arr.ndim == 1:  # norms and biases stay F32, as llama.cpp writes them
            w.add_tensor(gguf_tensor_name(name), arr)
            deq = arr
        else:
            qtype = qtype_of(name)
            data = gguf.quants.quantize(arr, qtype)
            if qtype in (QT.F32, QT.F16):
                assert data.dtype == {QT.F32: np.float32, QT.F16: np.float16}[qtype]
                w.add_tensor(gguf_tensor_name(name), data)
            else:  # raw bytes [rows, bytes per row]; the writer turns that into the element shape
                assert data.dtype == np.uint8
                w.add_tensor(gguf_tensor_name(name), data, raw_dtype=qtype)
            deq = gguf.quants.dequantize(data, qtype).reshape(arr.shape)
        if order is not None:
            unpermuted = np.empty_like(deq)
            unpermuted[order] = deq
            deq = unpermuted
        held[name] = torch.from_numpy(np.array(deq, dtype=np.float32))
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def layer_types(embed: QT, head: QT, layers: tuple[QT, ...]):
    """qtype_of for write_gguf: token_embd, output and each layer's weights in their own type."""
    def qtype_of(name: str) -> QT:
        if name == "model.embed_tokens.weight":
            return embed
        if name == "lm_head.weight":
            return head
        return layers[int(name.split(".")[2]) % len(layers)]
    return qtype_of
