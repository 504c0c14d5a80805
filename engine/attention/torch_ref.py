"""Reference attention in plain torch: runs on any device, one sequence at a time.

Readable rather than fast: it gathers each sequence's pages into a contiguous K/V and calls
``scaled_dot_product_attention`` with a bottom-right-aligned causal mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.base import AttentionMetadata
from engine.kv_cache import PagedKVCache


class TorchAttention:
    name = "torch"
    fused_rotary = False

    def __init__(self, cache: PagedKVCache, num_heads: int) -> None:
        self.cache = cache
        self.num_heads = num_heads
        self._seqs: list[tuple[int, int, torch.Tensor, torch.Tensor]] = []

    def plan(self, meta: AttentionMetadata) -> None:
        device = self.cache.k.device
        bs = self.cache.block_size
        self._seqs = []
        start = 0
        for q_len, kv_len, table in zip(meta.q_lens, meta.kv_lens, meta.block_tables):
            blocks = torch.tensor(table[: -(-kv_len // bs)], dtype=torch.long, device=device)
            # query j sits at position kv_len - q_len + j and sees keys 0 .. that position
            q_pos = torch.arange(kv_len - q_len, kv_len, device=device)
            mask = torch.arange(kv_len, device=device)[None, :] <= q_pos[:, None]  # [q_len, kv_len]
            self._seqs.append((start, q_len, blocks, mask))
            start += q_len
        self._kv_lens = meta.kv_lens
        self._slots = meta.slot_mapping

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [T, Hq, D]; k, v: [T, Hkv, D]
        self.cache.write(layer, self._slots, k, v)
        hkv, d = k.shape[1:]
        out = torch.empty_like(q)
        k_layer, v_layer = self.cache.k[layer], self.cache.v[layer]
        for (start, q_len, blocks, mask), kv_len in zip(self._seqs, self._kv_lens):
            keys = k_layer[blocks].reshape(-1, hkv, d)[:kv_len]      # [kv_len, Hkv, D]
            values = v_layer[blocks].reshape(-1, hkv, d)[:kv_len]
            qs = q[start:start + q_len].transpose(0, 1)                # [Hq, q_len, D]
            o = F.scaled_dot_product_attention(qs, keys.transpose(0, 1), values.transpose(0, 1),
                                               attn_mask=mask, enable_gqa=True)  # [Hq, q_len, D]
            out[start:start + q_len] = o.transpose(0, 1)
        return out
