"""The graphs of one graph executor (engine/rounds/fused.py's ``FusedRounds``), by (rows bucket, context bucket,
sampling mode): each a ``RoundGraph`` (engine/rounds/round_graph.py) with its buffers, built lazily or up front
(``capture_buckets``) and, on a GPU, captured into one memory pool; on the CPU built and run eagerly.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Sequence

import torch

from engine.attention.static import StaticAttention
from engine.graphs import BATCH_BUCKETS, CONTEXT_BUCKETS, capture
from engine.rounds.graph_sampling import Mode, RoundSampling
from engine.rounds.round_graph import RoundBody, RoundGraph

if TYPE_CHECKING:
    from engine.config import SamplingParams
    from engine.drafters.base import Drafter
    from engine.runner import ModelRunner

Key = tuple[int, int, Mode]  # (rows bucket, context bucket, sampling mode)


class GraphStore:
    def __init__(self, target: "ModelRunner", drafter: "Drafter | None", body: RoundBody, max_batch: int,
                 max_context: int, capture: bool, pipeline_rows: int, steps: int, steps_from: int,
                 scratch_block: int) -> None:
        self.target, self.drafter, self.body, self.k = target, drafter, body, body.k
        self.capture, self.pipeline_rows, self.scratch_block = capture, pipeline_rows, scratch_block
        self.steps, self.steps_from = steps, steps_from  # rounds of steps_from rows or more take steps forwards
        self.batch_buckets = tuple(b for b in BATCH_BUCKETS if b < max_batch) + (max_batch,)
        self.context_buckets = tuple(c for c in CONTEXT_BUCKETS if c < max_context) + (max_context,)
        self.graphs: dict[Key, RoundGraph] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None

    def bucket(self, rows: int) -> int:
        return next(b for b in self.batch_buckets if b >= rows)

    def steps_for(self, rows: int, mode: Mode = Mode.GREEDY) -> int:
        """Forwards (plain) or whole rounds (speculative, greedy only) a replay of this many rows runs (its rows
        bucket's graph)."""
        if self.k and mode != Mode.GREEDY:
            return 1
        return self.steps if self.bucket(rows) >= self.steps_from else 1

    def key(self, rows: int, need: int, params: Sequence["SamplingParams"]) -> Key | None:
        """The graph a round of ``rows`` rows with these params takes, whose longest row needs ``need`` KV entries
        (None: past the last context bucket)."""
        ctx = next((c for c in self.context_buckets if c >= need), None)
        return None if ctx is None else (self.bucket(rows), ctx, Mode.of(params))

    def get(self, key: Key, build: bool = True) -> RoundGraph | None:
        """The graph of ``key``; built now if there is none and ``build`` (else None)."""
        return self.graphs.get(key) or (self.build(*key) if build else None)

    def capture_buckets(self, max_rows: int, min_rows: int = 1, contexts: int = 2,
                        modes: Sequence[Mode] = tuple(Mode)) -> int:
        """Build (on a GPU: capture) now the graphs rounds of ``min_rows`` .. ``max_rows`` rows will take within
        the first ``contexts`` context buckets, in these sampling modes (default all three: one top-k / top-p row
        moves its whole round onto the filtered graphs), before requests arrive: a server's rounds then never wait
        on a capture. Returns how many were built."""
        rows = [b for b in self.batch_buckets if b >= min_rows and (b < max_rows or b == self.bucket(max_rows))]
        built = 0
        for key in itertools.product(rows, self.context_buckets[:contexts], modes):
            if key not in self.graphs:
                self.build(*key)
                built += 1
        return built

    def build(self, rows: int, ctx: int, mode: Mode) -> RoundGraph:
        t, k, w, tree = self.target, self.k, self.body.width, self.body.tree
        blocks = -(-ctx // t.cache.block_size)
        attn = StaticAttention(t.cache, t.model.config.num_heads, rows, w + 1, blocks, self.scratch_block,
                               tree=None if tree is None else tree.ancestors)
        sampling = None
        steps = self.steps_for(rows, mode)
        if mode != Mode.GREEDY:  # a coin a draft (a tree: a node), and no q for one-hot drafts (a tree's are)
            sampling = RoundSampling.allocate(rows, w, t.vocab_size, mode == Mode.FILTERED, t.device,
                                              with_q=not self.body.one_hot and tree is None, steps=steps)
        program = None
        if k:  # a tree's drafter picks its likeliest tokens for every row: it samples nothing
            tree_arg = {} if tree is None else {"tree": tree.tree}
            program = self.drafter.round_program(rows, k, blocks, sampling is not None and tree is None, **tree_arg)
        if program is not None:
            program.rounds = steps  # rounds a replay drafts for (its KV grows for them all)
        inputs = torch.zeros(rows, w + 2, dtype=torch.long, device=t.device)
        inputs[:, w + 1] = k
        chains = rows <= self.pipeline_rows
        room = torch.zeros(rows, 2, dtype=torch.long, device=t.device) if (chains or steps > 1) and k else None
        g = RoundGraph(attn, program, inputs, sampling, chains, (rows, ctx, mode), steps, room)
        if self.capture:
            with torch.inference_mode():
                self.body.compute(g)  # allocates the output buffers and compiles the kernels
            g.graph = capture(lambda: self.body.compute(g), lambda: self.body.compute(g), self._pool, t.device)
        # uncaptured (a CPU), the round's first real run allocates them: a round of padding rows here would cost a
        # whole round's compute for nothing
        self.graphs[(rows, ctx, mode)] = g
        return g

    def replay_ms(self, iters: int = 20) -> dict[int, float]:
        """GPU time of one replay of each captured rows bucket per forward (a plain round of several steps: divided
        by them, so a plain token's cost), in the first context bucket, greedy, else sampled, by CUDA events, before
        any request ran: every row is padding then (its block table the scratch block), so a replay writes nothing
        but scratch. The cost policy's figures (engine/policy.py); {} where none is captured."""
        times = {}
        for (rows, ctx, mode), g in sorted(self.graphs.items(), key=lambda item: -item[0][2]):  # greedy last: wins
            if g.graph is None or ctx != self.context_buckets[0]:
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            g.graph.replay()
            start.record()
            for _ in range(iters):
                g.graph.replay()
            end.record()
            end.synchronize()
            times[rows] = start.elapsed_time(end) / iters / g.steps
        return times

    @property
    def num_captured(self) -> int:
        return sum(g.graph is not None for g in self.graphs.values())
