"""The co-located fast path: a whole greedy round for a batch in one CUDA graph, one host sync.

A *fused round* takes R rows (requests), each with its last committed token t0 (not yet in the
target's KV, at position L) and k pending drafts, and in one graph
1. verifies: the target runs over ``[t0, d1 .. dk]`` of every row (StaticAttention, q_len k + 1,
   plus the aux features a feature-fed drafter reads);
2. accepts: ``greedy_verify`` against the target's argmax -> committed tokens ``[R, k+1]``
   (accepted drafts, then the recovered or bonus token) and ``num_accepted`` [R];
3. drafts: the drafter's ``DraftProgram`` catches up on the committed tokens and drafts the next
   round's k tokens, on the device (for EAGLE: engine/drafters/eagle_graph.py).
Outputs land in one ``[R, 2k + 2]`` buffer (committed tokens, accepted count, next drafts) that the
host reads once per round; everything else the next round needs stays in the two KV caches.
With k = 0 and no drafter it is plain greedy decoding through one graph per step.

Host work per round: grow each row's KV allocation for the round, copy the tokens and block
tables in, replay, read the one buffer, roll each row's KV back to its committed length. Graphs
are keyed by (rows bucket, context bucket), captured lazily into one pool; on the CPU the same
code runs eagerly (``capture=False``), which is how it is tested without a GPU. Sampled
requests take the eager round (``SpecDecoder.run_round``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from engine.attention.static import StaticAttention
from engine.graphs import BATCH_BUCKETS, CONTEXT_BUCKETS, PAD_SEQ, capture
from engine.sampling import greedy_verify

if TYPE_CHECKING:
    from engine.drafters.base import DraftProgram, Drafter
    from engine.runner import ModelRunner


@dataclass(frozen=True)
class RowResult:
    committed: list[int]  # accepted drafts + the recovered / bonus token (num_accepted + 1 tokens)
    num_accepted: int
    next_drafts: list[int]  # k drafts for the next round (empty with k = 0)


@dataclass
class _RoundGraph:
    attn: StaticAttention           # the target's verify, q_len k + 1
    program: "DraftProgram | None"  # the drafter's part
    tokens: torch.Tensor            # [R, k+1] long: t0 and the k pending drafts of each row
    out: torch.Tensor | None = None  # [R, 2k+2] long: committed (k+1), num_accepted (1), next drafts (k)
    graph: "torch.cuda.CUDAGraph | None" = None


class FusedRounds:
    def __init__(self, target: "ModelRunner", drafter: "Drafter | None", k: int, max_batch: int,
                 max_context: int, capture: bool) -> None:
        if k and (drafter is None or not drafter.graph_rounds):
            raise ValueError("fused rounds: k > 0 needs a drafter that drafts inside a graph (graph_rounds)")
        self.target, self.drafter, self.k = target, drafter, k
        self.capture = capture
        self.aux_layers = tuple(drafter.target_features) if drafter is not None and k else ()
        self.batch_buckets = tuple(b for b in BATCH_BUCKETS if b < max_batch) + (max_batch,)
        self.context_buckets = tuple(c for c in CONTEXT_BUCKETS if c < max_context) + (max_context,)
        self.max_context = max_context
        alloc = target.allocator
        if PAD_SEQ not in alloc:
            alloc.extend(PAD_SEQ, 1)
        self.scratch_block = alloc.block_table(PAD_SEQ)[0]
        self._offsets = torch.arange(k + 1, device=target.device)
        self._graphs: dict[tuple[int, int], _RoundGraph] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None

    # ------------------------------------------------------------------ host side
    def fits(self, committed: int) -> bool:
        """Whether a row with this many committed tokens can take a round (its KV and drafts fit)."""
        return committed + 2 * self.k + 1 <= self.max_context

    def run(self, rows: Sequence[tuple[str, list[int], list[int]]]) -> list[RowResult]:
        """One round for rows of (request id, committed tokens, k pending drafts)."""
        k, n = self.k, len(rows)
        lengths = [len(tokens) - 1 for _, tokens, _ in rows]  # L: everything but t0 is in the target's KV
        rows_b = next(b for b in self.batch_buckets if b >= n)
        ctx = next(c for c in self.context_buckets if c >= max(lengths) + 2 * k + 1)
        g = self._graphs.get((rows_b, ctx)) or self._build(rows_b, ctx)
        alloc = self.target.allocator
        for (rid, _, _), length in zip(rows, lengths):
            alloc.extend(rid, length + k + 1)
        g.attn.set_rows([alloc.block_table(rid) for rid, _, _ in rows], [length + k + 1 for length in lengths])
        if g.program is not None:
            g.program.load([(rid, length) for (rid, _, _), length in zip(rows, lengths)])
        tokens = torch.zeros(rows_b, k + 1, dtype=torch.long)
        tokens[:n] = torch.tensor([[t[-1]] + list(d) for _, t, d in rows], dtype=torch.long).view(n, k + 1)
        g.tokens.copy_(tokens, non_blocking=True)
        if g.graph is not None:
            g.graph.replay()
        else:
            with torch.inference_mode():
                self._compute(g)
        out = g.out[:n].tolist()  # the round's one host sync
        results = []
        for (rid, _, _), length, row in zip(rows, lengths, out):
            a = row[k + 1]
            alloc.truncate(rid, length + a + 1)
            if g.program is not None:
                g.program.commit(rid, length + a + 1)
            results.append(RowResult(row[: a + 1], a, row[k + 2:]))
        return results

    # ------------------------------------------------------------------ the graph
    def _compute(self, g: _RoundGraph) -> None:
        k, model = self.k, self.target.model
        rows = g.tokens.shape[0]
        kv = g.attn.kv_lens                                                   # [R] L + k + 1
        positions = (kv[:, None] - (k + 1) + self._offsets[None, :]).reshape(-1)
        g.attn.prepare()
        hidden, aux = model.forward_aux(g.tokens.reshape(-1), positions, g.attn, self.aux_layers)
        argmax = model.compute_logits(hidden).argmax(-1).view(rows, k + 1)     # [R, k+1]
        num_draft = torch.full((rows,), k, dtype=torch.long, device=kv.device)
        committed, accepted = greedy_verify(g.tokens[:, 1:], num_draft, argmax)
        parts = [committed, accepted[:, None]]
        if g.program is not None:
            parts.append(g.program.draft(committed, accepted, aux, kv))
        out = torch.cat(parts, dim=1)
        if g.out is None:
            g.out = out
        else:
            g.out.copy_(out)

    def _build(self, rows: int, ctx: int) -> _RoundGraph:
        t = self.target
        blocks = -(-ctx // t.cache.block_size)
        attn = StaticAttention(t.cache, t.model.config.num_heads, rows, self.k + 1, blocks, self.scratch_block)
        program = self.drafter.round_program(rows, self.k, blocks) if self.k else None
        g = _RoundGraph(attn, program, torch.zeros(rows, self.k + 1, dtype=torch.long, device=t.device))
        with torch.inference_mode():
            self._compute(g)  # allocates the output buffer (and compiles the kernels on a GPU)
        if self.capture:
            g.graph = capture(lambda: self._compute(g), lambda: self._compute(g), self._pool, t.device)
        self._graphs[(rows, ctx)] = g
        return g

    @property
    def num_captured(self) -> int:
        return sum(g.graph is not None for g in self._graphs.values())
