"""Reference attention in plain torch: runs on any device, the whole batch in one call per layer.

Every sequence is padded to the batch's longest query and to the whole blocks of its longest KV: ``plan``
builds, once per forward, the padded block tables and a mask in which query j of a sequence (at position
kv_len - q_len + j) sees its keys 0 .. that position and no padding. Each layer then writes the new K/V,
gathers the padded keys and values block by block in one indexing op each and calls
``scaled_dot_product_attention`` once (``engine.attention.sdpa``: no cuDNN). Padding costs memory and FLOPs where
lengths are uneven, never Python work per sequence (which made a 64-prompt prefill on a GPU take 0.7 s).
"""

from __future__ import annotations

import torch

from engine.attention.base import AttentionMetadata
from engine.attention.sdpa import attend
from engine.kv_cache import PagedKVCache
from engine.upload import upload


class TorchAttention:
    name = "torch"
    fused_rotary = False

    def __init__(self, cache: PagedKVCache, num_heads: int) -> None:
        self.cache = cache
        self.num_heads = num_heads

    def plan(self, meta: AttentionMetadata) -> None:
        device = self.cache.k.device
        bs = self.cache.block_size
        b = len(meta.q_lens)
        q_max, kv_max = max(meta.q_lens), max(meta.kv_lens)
        blocks = -(-kv_max // bs)
        tables = upload([list(t[:blocks]) + [0] * (blocks - len(t[:blocks])) for t in meta.block_tables],
                        device)                                                         # [B, M]
        q_lens = upload(meta.q_lens, device)                                            # [B]
        kv_lens = upload(meta.kv_lens, device)                                          # [B]
        cols = torch.arange(blocks * bs, device=device)                                 # [S]: whole blocks
        self._tables = tables
        j = torch.arange(q_max, device=device)                                          # [Q]
        q_pos = kv_lens[:, None] - q_lens[:, None] + j[None, :]                         # [B, Q]
        self._mask = ((cols[None, None, :] <= q_pos[:, :, None])
                      & (cols[None, None, :] < kv_lens[:, None, None]))[:, None]        # [B, 1, Q, S]
        starts = torch.cumsum(q_lens, 0) - q_lens                                       # [B]
        live = j[None, :] < q_lens[:, None]                                             # [B, Q]
        # padded query (b, j) <- flat token starts[b] + j (padding repeats a real token; its output is dropped)
        self._q_index = torch.where(live, starts[:, None] + j[None, :], starts[:, None])  # [B, Q]
        # flat token t of sequence b (query j = t - starts[b]) <- padded row b * q_max + j; the repeat's output
        # size is known here, so nothing waits on the device (a boolean mask index would)
        t = sum(meta.q_lens)
        self._out_index = torch.repeat_interleave(torch.arange(b, device=device) * q_max - starts, q_lens,
                                                  output_size=t) + torch.arange(t, device=device)  # [T]
        self._slots = meta.slot_mapping

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [T, Hq, D]; k, v: [T, Hkv, D] -> [T, Hq, D]
        self.cache.write(layer, self._slots, k, v)
        hkv, d = k.shape[1:]
        b, rows = self._tables.shape[0], self._tables.reshape(-1)  # rows: every block of every sequence
        # whole blocks gathered with index_select: a copy per block, not per token (6x faster on a CPU)
        keys = self.cache.k[layer].flatten(1).index_select(0, rows).view(b, -1, hkv, d)    # [B, S, Hkv, D]
        values = self.cache.v[layer].flatten(1).index_select(0, rows).view(b, -1, hkv, d)
        qs = q.index_select(0, self._q_index.reshape(-1)).view(b, -1, *q.shape[1:])  # [B, Q, Hq, D]
        o = attend(qs.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), self._mask)  # [B, Hq, Q, D]
        return o.transpose(1, 2).reshape(-1, *q.shape[1:]).index_select(0, self._out_index)
