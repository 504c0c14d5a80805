"""flashinfer attention over the paged cache (CUDA only).

One plan per forward pass, shared by every layer: the decode wrapper when every sequence
appends a single token, the paged prefill wrapper (causal, bottom-right aligned) otherwise,
which covers prompt prefill and the k+1-token verify.
"""

from __future__ import annotations

import torch

from engine.attention.base import AttentionMetadata
from engine.kv_cache import PagedKVCache

WORKSPACE_BYTES = 128 * 1024 * 1024


def _import_flashinfer():
    try:
        import flashinfer
    except ImportError as exc:
        raise RuntimeError("attention backend 'flashinfer' needs the gpu extra: "
                           "pip install 'tandem[gpu]' (or pass --attention torch)") from exc
    return flashinfer


class FlashInferAttention:
    name = "flashinfer"
    fused_rotary = False

    def __init__(self, cache: PagedKVCache, num_heads: int, device: torch.device) -> None:
        flashinfer = _import_flashinfer()
        if cache.k.device.type != "cuda":
            raise RuntimeError("attention backend 'flashinfer' needs the KV cache on a CUDA device")
        self.cache = cache
        self.num_heads = num_heads
        self.num_kv_heads, self.head_dim = cache.k.shape[-2:]
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self._wrapper = None
        self._slots: torch.Tensor | None = None

    def plan(self, meta: AttentionMetadata) -> None:
        bs = self.cache.block_size
        device = self.cache.k.device
        kv_indptr, kv_indices, last_len = [0], [], []
        for kv_len, table in zip(meta.kv_lens, meta.block_tables):
            n = -(-kv_len // bs)
            kv_indices.extend(table[:n])
            kv_indptr.append(kv_indptr[-1] + n)
            last_len.append(kv_len - (n - 1) * bs)

        def i32(values):
            return torch.tensor(values, dtype=torch.int32, device=device)

        common = dict(q_data_type=self.cache.k.dtype, kv_data_type=self.cache.k.dtype)
        if meta.is_decode:
            self._decode.plan(i32(kv_indptr), i32(kv_indices), i32(last_len), self.num_heads,
                              self.num_kv_heads, self.head_dim, bs, **common)
            self._wrapper = self._decode
        else:
            qo_indptr = [0]
            for q_len in meta.q_lens:
                qo_indptr.append(qo_indptr[-1] + q_len)
            self._prefill.plan(i32(qo_indptr), i32(kv_indptr), i32(kv_indices), i32(last_len),
                               self.num_heads, self.num_kv_heads, self.head_dim, bs, causal=True, **common)
            self._wrapper = self._prefill
        self._slots = meta.slot_mapping

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [T, Hq, D]; k, v: [T, Hkv, D]
        self.cache.write(layer, self._slots, k, v)
        return self._wrapper.run(q.contiguous(), (self.cache.k[layer], self.cache.v[layer]))
