"""Attention over the paged cache with every shape fixed in advance: what a CUDA graph can hold.

A ``StaticAttention`` serves one *bucket*: at most ``rows`` sequences, each appending exactly
``q_len`` tokens (1 for plain decode, k + 1 for a verify), each holding at most
``max_blocks * block_size`` tokens after the forward. Its inputs live in persistent device
buffers that ``load`` / ``set_rows`` refill before every replay (host -> device copies, outside
the graph); the torch path's ``prepare`` turns them into slots and a mask inside the graph, once
per forward, shared by every layer. Rows past the batch are padding: they hold exactly their q_len tokens, written to
the scratch block, and attend to those alone, so they never touch a real sequence.

Two implementations. On CUDA one Triton launch per layer (``kernels.static_attention``) rotates
q and k, writes the new K/V and attends over exactly each row's length (``fused_rotary``: the
model hands it q and k unrotated). Elsewhere (the CPU, where the static path runs eagerly and is
tested) the plain torch steps: KV write, a gather of the pages of every row (in a graph all ``max_blocks``;
eagerly, those the longest row reaches) and a masked ``scaled_dot_product_attention``; reading whole pages costs
bandwidth a paged kernel would not spend, and context buckets (``StepGraphs``) keep ``max_blocks`` close to the
longest row.
"""

from __future__ import annotations

import copy
from typing import Sequence

import numpy as np
import torch

from engine.attention.base import AttentionMetadata
from engine.attention.sdpa import attend
from engine.kv_cache import PagedKVCache


class StaticAttention:
    name = "static"

    def __init__(self, cache: PagedKVCache, num_heads: int, rows: int, q_len: int, max_blocks: int,
                 scratch_block: int, use_kernel: bool | None = None, own_keys: bool = False,
                 tree: torch.Tensor | None = None) -> None:
        """use_kernel: the Triton launch (None: when the cache is on CUDA; True on the CPU needs TRITON_INTERPRET).
        own_keys (the torch path): every row is a whole prompt from position 0, so its queries see exactly the keys
        this forward writes: causal attention over those (flash), no gather of the cache's pages, no mask.
        tree: [q_len] int64, the new tokens each new token sees, as bits (a draft tree's ancestors, engine/rounds/
        tree.py), instead of those before it; every cached key is seen either way."""
        dev = cache.k.device
        self.fused_rotary = dev.type == "cuda" if use_kernel is None else use_kernel
        if own_keys and (self.fused_rotary or tree is not None):
            raise ValueError("own_keys: the torch path's (use_kernel=False), causal")
        self.own_keys, self.tree = own_keys, tree
        self.cache = cache
        self.num_heads = num_heads
        self.rows, self.q_len, self.max_blocks = rows, q_len, max_blocks
        self.scratch_block = scratch_block
        bs = cache.block_size
        self.block_table = torch.full((rows, max_blocks), scratch_block, dtype=torch.long, device=dev)  # [B, M]
        self._tables = HeldTables(rows, max_blocks, scratch_block)  # what block_table holds, on the host
        self.kv_lens = torch.full((rows,), q_len, dtype=torch.long, device=dev)                          # [B]
        self._lens = np.zeros(rows, dtype=np.int64)  # [B] set_rows' KV lengths, on the host (one array, refilled)
        self.slots: torch.Tensor | None = None                                                         # [B*Q]
        self._cols = torch.arange(max_blocks * bs, device=dev)                                         # [S]
        self._offsets = torch.arange(q_len, device=dev) - q_len + 1                                    # [Q]
        self.mask: torch.Tensor | None = None  # [B, 1, Q, S]: S, the keys a row gathers, is whole pages
        self.splits = 1
        if self.fused_rotary:
            from kernels.static_attention import split_plan

            self.splits = split_plan(rows, cache.k.shape[-2], self.max_tokens)

    @property
    def max_tokens(self) -> int:
        return self.max_blocks * self.cache.block_size

    def with_kv_lens(self, kv_lens: torch.Tensor) -> "StaticAttention":
        """This bucket (cache, block table, shapes) over other KV lengths: [rows] int64, contiguous (a row of a
        tensor computed in the graph, e.g. every draft step's lengths at once)."""
        view = copy.copy(self)
        view.kv_lens = kv_lens
        return view

    def fits(self, meta: AttentionMetadata) -> bool:
        return (len(meta.q_lens) <= self.rows and all(q == self.q_len for q in meta.q_lens)
                and max(meta.kv_lens) <= self.max_tokens)

    def load(self, meta: AttentionMetadata) -> None:
        """Copy one forward's layout into the buffers (outside the graph); padding rows go to scratch."""
        if not self.fits(meta):
            raise ValueError(f"static attention: batch of {len(meta.q_lens)} rows, q_lens {set(meta.q_lens)}, "
                             f"longest {max(meta.kv_lens)} tokens does not fit the bucket "
                             f"({self.rows} rows, q_len {self.q_len}, {self.max_tokens} tokens)")
        self.set_rows(meta.block_tables, meta.kv_lens)

    def set_rows(self, tables: Sequence[Sequence[int]], kv_lens: Sequence[int] | None) -> None:
        """Block tables (whole: a table may reach past its row's length, for later steps of the same
        graph) and KV lengths (after the forward) of the first len(tables) rows; the rest are padding:
        they hold exactly their own q_len tokens, all in the scratch block. ``kv_lens`` None: the tables
        only (the lengths already lie on the device, chained from the round before)."""
        n = len(tables)
        if self._tables.update(tables):  # (it checks that they fit)
            self.block_table.copy_(torch.from_numpy(self._tables.table), non_blocking=True)
        if kv_lens is not None:  # (the driver stages pageable memory before the call returns: the array is free)
            self._lens[:n], self._lens[n:] = kv_lens, self.q_len
            self.kv_lens.copy_(torch.from_numpy(self._lens), non_blocking=True)

    def share_table(self, other: "StaticAttention") -> None:
        """Read ``other``'s block table (one table serving several forwards: a drafter's catch-up and its steps);
        only ``other`` sets its rows."""
        self.block_table, self._tables = other.block_table, other._tables

    def prepare(self) -> None:
        """Inside the graph, from the buffers, once per forward: the torch path's slots (where the new
        K/V go) and mask (query j of row b sits at position kv_len[b] - q_len + j and sees keys 0 .. that
        position). The kernel computes both itself."""
        if self.fused_rotary:
            return
        q_pos = self.kv_lens[:, None] + self._offsets[None, :] - 1                  # [B, Q]
        bs = self.cache.block_size
        self.slots = (self.block_table.gather(1, q_pos // bs) * bs + q_pos % bs).reshape(-1)  # [B*Q]
        if not self.own_keys:
            cols = self._cols
            if not q_pos.is_cuda:  # no graph to hold the shape: only the pages the longest row reaches
                pages = -(-int(self.kv_lens.max()) // bs)  # ceil(longest / page size)
                cols = cols[:pages * bs]
            if self.tree is None:
                self.mask = (cols[None, None, :] <= q_pos[:, :, None])[:, None]         # [B, 1, Q, S]
            else:
                from kernels.static_attention import tree_mask

                self.mask = tree_mask(cols, q_pos, self.kv_lens - self.q_len, self.tree)[:, None]

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        # q: [B*Q, Hq, D]; k, v: [B*Q, Hkv, D] -> [B*Q, Hq, D]; q and k unrotated when fused_rotary
        if self.fused_rotary:
            from kernels.static_attention import static_attention

            return static_attention(q, k, v, *rope, self.cache.k[layer], self.cache.v[layer], self.block_table,
                                    self.kv_lens, self.q_len, self.splits, self.tree)
        self.cache.write(layer, self.slots, k, v)
        b, n = self.rows, self.q_len
        hkv, d = k.shape[1:]
        qs = q.view(b, n, -1, d).transpose(1, 2)                                           # [B, Hq, Q, D]
        if self.own_keys:  # query j at position j sees keys 0 .. j, all written just now (padding comes after)
            o = attend(qs, k.view(b, n, hkv, d).transpose(1, 2), v.view(b, n, hkv, d).transpose(1, 2), is_causal=True)
            return o.transpose(1, 2).reshape(b * n, -1, d)
        s = self.mask.shape[-1]  # the pages prepare() chose
        # index_select: a copy per block (advanced indexing: 6x slower on a CPU)
        rows = self.block_table[:, :s // self.cache.block_size].reshape(-1)
        keys = self.cache.k[layer].flatten(1).index_select(0, rows).view(b, s, hkv, d).transpose(1, 2)  # [B, Hkv, S, D]
        values = self.cache.v[layer].flatten(1).index_select(0, rows).view(b, s, hkv, d).transpose(1, 2)
        o = attend(qs, keys, values, self.mask)
        return o.transpose(1, 2).reshape(b * n, -1, d)


class HeldTables:
    """The host's copy of a bucket's block table, row by row as last uploaded: a round rewrites only the rows whose
    table changed (a row's table grows by a block every ``block_size`` tokens, and changes with the batch), and
    uploads nothing when none did. A table is compared by value: the allocator's lists grow in place."""

    def __init__(self, rows: int, max_blocks: int, scratch_block: int) -> None:
        self.scratch = scratch_block
        self.table = np.full((rows, max_blocks), scratch_block, dtype=np.int64)  # [B, M]
        self.held: list[list[int]] = [[] for _ in range(rows)]  # each row's table (a copy); []: padding

    def update(self, tables: Sequence[Sequence[int]]) -> bool:
        """Rows 0 .. len(tables) - 1 take these tables, the rest none (padding). Returns whether any row changed;
        raises (changing nothing) where the tables do not fit."""
        (rows, width), changed = self.table.shape, []
        for i, held in enumerate(self.held):
            t = tables[i] if i < len(tables) else []
            if not isinstance(t, list):  # (a tuple never equals a list)
                t = list(t)
            if t != held:
                changed.append((i, list(t)))  # a copy: the allocator's lists grow in place
        if len(tables) > rows or any(len(t) > width for _, t in changed):  # (unchanged rows fit already)
            raise ValueError(f"static attention: {len(tables)} rows, longest table "
                             f"{max(map(len, tables), default=0)} blocks do not fit the bucket ({rows} rows, "
                             f"{width} blocks)")
        for i, t in changed:
            row, held = self.table[i], self.held[i]
            row[:len(t)] = t
            row[len(t):len(held)] = self.scratch  # (past its own table a row holds the scratch block)
            self.held[i] = t
        return bool(changed)
