"""Read a Llama-family GGUF file: architecture metadata, dequantized weights, tokenizer metadata.

The container is parsed by ``gguf_file`` (fast: the tokenizer's 100k strings); tensors are dequantized
with the ``gguf`` package (F32, F16, BF16, Q8_0, Q4_0, Q4_1, K-quants
and whatever else it supports) and renamed to Hugging Face names, so the model sees one
naming scheme whatever the file format. llama.cpp stores the q/k projections of the
``llama`` architecture permuted for its interleaved rotary layout; they are permuted back.
"""

from __future__ import annotations

import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from tqdm import tqdm

from engine.config import ModelConfig, RopeScaling

SUPPORTED_ARCHS = ("llama", "qwen2", "mistral")

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


@dataclass
class GGUFFile:
    """Metadata of a GGUF file, with lazy access to its tensors."""

    path: Path
    metadata: dict[str, Any]
    reader: Any

    @property
    def arch(self) -> str:
        return self.metadata["general.architecture"]

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_key(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.arch}.{key}", default)


def open_gguf(path: str | Path) -> GGUFFile:
    from engine.models.weights.gguf_file import GGUFContents

    path = Path(path)
    try:
        reader = GGUFContents(path)
    except (ValueError, struct.error, IndexError) as exc:  # bad magic, a cut-off file, bad UTF-8
        raise ValueError(f"{path}: not a readable GGUF file ({exc})") from exc
    f = GGUFFile(path=path, metadata=reader.fields, reader=reader)
    if f.arch not in SUPPORTED_ARCHS:
        raise ValueError(f"{path}: architecture {f.arch!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_ARCHS)})")
    return f


def model_config(f: GGUFFile) -> ModelConfig:
    hidden = int(f.arch_key("embedding_length"))
    heads = int(f.arch_key("attention.head_count"))
    kv_heads = int(f.arch_key("attention.head_count_kv", heads))
    tensor_names = {t.name for t in f.reader.tensors}
    vocab = f.arch_key("vocab_size") or len(f.get("tokenizer.ggml.tokens", []))
    scaling = RopeScaling()
    scale_type = f.arch_key("rope.scaling.type")
    if scale_type == "linear":
        scaling = RopeScaling(kind="linear", factor=float(f.arch_key("rope.scaling.factor")))
    elif scale_type not in (None, "none"):
        raise ValueError(f"{f.path}: rope scaling {scale_type!r} is not supported")
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(f.arch_key("feed_forward_length")),
        num_layers=int(f.arch_key("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(f.arch_key("attention.key_length", hidden // heads)),
        rms_norm_eps=float(f.arch_key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(f.arch_key("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position=int(f.arch_key("context_length", 4096)),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        name=str(f.get("general.name", f.arch)),
    )


def rope_freqs(f: GGUFFile) -> torch.Tensor | None:
    """The file's ``rope_freqs`` (llama3 scaling as per-frequency factors) in float32, if it has them."""
    t = next((t for t in f.reader.tensors if t.name == "rope_freqs.weight"), None)
    if t is None:
        return None
    return torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)).flatten()


def dequantize(data: np.ndarray, qtype) -> np.ndarray:
    """A tensor's raw GGUF data -> float32, flat or in the ``gguf`` package's shape. Q4_1 and Q8_0 (most of a
    SmolLM2 file) here over the whole tensor at once, with the ``gguf`` package's own operations (so the same bits;
    it runs them 16 rows at a time, 4x slower); any other type through the package."""
    import gguf

    kind = gguf.GGMLQuantizationType
    if qtype == kind.Q4_1:  # blocks of 32: scale d and minimum m (float16), then 16 bytes of two 4-bit values each
        blocks = data.view(np.uint8).reshape(-1, 20)
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        out = np.empty((len(blocks), 2, 16), dtype=np.float32)  # the low 4 bits of the 16 bytes, then the high
        np.bitwise_and(blocks[:, 4:], np.uint8(0x0F), out=out[:, 0], casting="unsafe")
        np.right_shift(blocks[:, 4:], np.uint8(4), out=out[:, 1], casting="unsafe")
        out = out.reshape(len(blocks), 32)
        out *= d  # d * q + m, as the package computes it
        out += m
        return out.reshape(-1)
    if qtype == kind.Q8_0:  # blocks of 32: scale d (float16), then 32 signed bytes
        blocks = data.view(np.uint8).reshape(-1, 34)
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        out = blocks[:, 2:].view(np.int8).astype(np.float32)
        out *= d
        return out.reshape(-1)
    return gguf.quants.dequantize(data, qtype)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved rotary halves -> HF's rotate_half)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK.match(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return None


def iter_tensors(f: GGUFFile, config: ModelConfig, dtype: torch.dtype,
                 max_layers: int | None = None, progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, dequantized tensor) pairs, with a progress bar."""
    permute = f.arch in ("llama", "mistral")
    tensors = list(f.reader.tensors)
    for t in tqdm(tensors, desc=f"load {f.path.name}", unit="tensor", disable=not progress, file=sys.stderr):
        name = hf_name(t.name)
        if name is None:
            raise ValueError(f"{f.path}: unexpected tensor {t.name!r}")
        m = _BLOCK.match(t.name)
        if max_layers is not None and m and int(m.group(1)) >= max_layers:
            continue
        arr = dequantize(t.data, t.tensor_type)
        arr = arr.reshape(tuple(reversed([int(d) for d in t.shape])))
        if permute and name.endswith(("q_proj.weight", "q_proj.bias")):
            arr = _unpermute(arr, config.num_heads)
        elif permute and name.endswith(("k_proj.weight", "k_proj.bias")):
            arr = _unpermute(arr, config.num_kv_heads)
        arr = arr if arr.flags.writeable and arr.flags.c_contiguous else np.array(arr, order="C")
        # rope_freqs feed the float32 rotary table: rounding them to a half dtype skews long-context angles
        yield name, torch.from_numpy(arr).to(torch.float32 if name == "rope_freqs" else dtype)
