"""The graph executor of the co-located fast path: a whole round for a batch in one CUDA graph, one host sync.

A *fused round* takes R rows (requests), each with its last committed token t0 (not yet in the
target's KV, at position L), k pending drafts and how many of them to verify (``num_draft`` <= k: fewer
for a request whose own k is smaller, or near its max_tokens), and in one graph
1. verifies: the target runs over ``[t0, d1 .. dk]`` of every row (StaticAttention, q_len k + 1,
   plus the aux features a feature-fed drafter reads);
2. accepts: ``greedy_verify`` against the target's argmax, and for sampled rows
   ``rejection_sample`` against the target's distribution (temperature / top-k / top-p per row)
   and the drafts' q -> committed tokens ``[R, k+1]`` (accepted drafts, then the recovered or
   bonus token) and ``num_accepted`` [R]; drafts (and q rows) past a row's num_draft are never read;
3. drafts: the drafter's ``DraftProgram`` catches up on the committed tokens and drafts the next
   round's k tokens (and, for sampled rows, their q), on the device (EAGLE:
   engine/drafters/eagle_graph.py).
Outputs land in one ``[R, 2k + 2]`` buffer (committed tokens, accepted count, next drafts) that the
host reads once per round; the next drafts' q (sampled rows) stays on the device until the next
round verifies them, and everything else the next round needs stays in the two KV caches.
With k = 0 and no drafter it is plain decoding (greedy or sampled): ``steps`` forwards a round, each on the token
the one before picked (so a round commits ``steps`` tokens a row, ``[R, steps + 1]``: tokens, steps - 1), and the
host's work of a round comes once per ``steps`` tokens.
With k > 0 and ``steps`` > 1 a greedy graph runs ``steps`` whole rounds a replay (engine/rounds/round_graph.py), the
second on the first's drafts and committed tokens as a round launched ahead would be, and the host reads them at
once: its work comes once per ``steps`` rounds. A row that finishes (EOS, max_tokens) inside a replay simply has the
tokens after it dropped by the stop rules (its KV past them goes when it finishes).
Sampling (modes, coins drawn outside the graph): engine/rounds/graph_sampling.py.

Host work per round: grow each row's KV allocation for the round, copy the tokens, block tables
and (sampled) parameters and coins in, replay, read the one buffer, roll each row's KV back to its
committed length. Graphs are keyed by (rows bucket, context bucket, sampling mode), captured
lazily into one pool (``store``, engine/rounds/graph_store.py); on the CPU the same code runs eagerly
(``capture=False``), which is how it is tested without a GPU. The next round may be launched before this one is
read (engine/rounds/ahead.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from engine.config import SamplingParams
from engine.graphs import PAD_SEQ
from engine.rounds.ahead import Launch, LaunchedAhead
from engine.rounds.base import RowResult
from engine.rounds.chained import compact, enter
from engine.rounds.graph_store import GraphStore
from engine.rounds.round_graph import RoundBody, RoundGraph, read_rounds
from engine.sampling.rejection import PLACEHOLDER_TOKEN_ID

if TYPE_CHECKING:
    from engine.drafters.base import Drafter
    from engine.rounds.tree import DraftTree
    from engine.runner import ModelRunner


@dataclass(frozen=True)
class FusedRow:
    request_id: str
    token_ids: Sequence[int]        # every committed token; the last (t0) is not yet in the target's KV
    drafts: Sequence[int]           # the k pending drafts (empty with k = 0)
    params: SamplingParams          # seed resolved
    num_draft: int                  # drafts to verify, <= k: the request's own k, fewer near max_tokens
    q: torch.Tensor | None = None   # [k, V] the drafts' distribution (sampled rows with k > 0)
    draw: int = 0                   # the request's draw number for this round's coins (sampled rows)
    room: int = 0                   # tokens the request may still commit (0: unknown, never launched ahead)
    want: int | None = None         # drafts it verifies a round from the next on, room allowing (None: num_draft);
                                    # a row entering without drafts (num_draft 0) verifies its k from its second

    @property
    def wanted(self) -> int:
        return self.num_draft if self.want is None else self.want


class FusedRounds:
    def __init__(self, target: "ModelRunner", drafter: "Drafter | None", k: int, max_batch: int,
                 max_context: int, capture: bool, pipeline_rows: int = 0, steps: int = 1, steps_from: int = 1,
                 tree: "DraftTree | None" = None) -> None:
        """tree: rounds verify and draft a tree of drafts of depth k (engine/rounds/tree.py)."""
        if k and (drafter is None or not drafter.graph_rounds):
            raise ValueError("fused rounds: k > 0 needs a drafter that drafts inside a graph (graph_rounds)")
        if steps < 1:
            raise ValueError(f"fused rounds: steps must be >= 1, got {steps}")
        if tree is not None and not (k and drafter.tree_rounds and tree.depth == k):
            raise ValueError(f"spec_tree: a tree of depth {tree.depth} needs k = {tree.depth} (got {k}) and a drafter "
                             f"that drafts trees (the EAGLE head, a draft model; not {getattr(drafter, 'name', None)})")
        self.target, self.drafter, self.k, self.tree = target, drafter, k, tree
        self.width = k if tree is None else tree.nodes  # drafts a row carries between rounds
        self.span = steps * (self.width + 1)  # tokens a replay writes to a row's KV at most, in any graph
        self.capture = capture
        self.aux_layers = tuple(drafter.target_features) if drafter is not None and k else ()
        # a deterministic drafter's drafts are one-hot (no q crosses) and may be fewer than k: a row verifies its
        # leading real drafts, the rest are PLACEHOLDER_TOKEN_ID (the n-gram drafter's lookup)
        self.one_hot = bool(k) and drafter.deterministic
        self.max_context = max_context
        alloc = target.allocator
        if PAD_SEQ not in alloc:
            alloc.extend(PAD_SEQ, 1)
        self.body = RoundBody(target.model, k, self.one_hot, self.aux_layers, target.device, tree)
        self.store = GraphStore(target, drafter, self.body, max_batch, max_context, capture, pipeline_rows, steps,
                                steps_from, alloc.block_table(PAD_SEQ)[0])  # its graphs, by bucket and mode
        self._pad_inputs = torch.tensor([0] * (self.width + 1) + [k], dtype=torch.long, device=target.device)  # padding
        self.ahead = LaunchedAhead(alloc)  # the next round, launched before the last one was read
        # captured rounds: their outputs land in pinned host memory, two slots (the round being read and the one
        # launched ahead), allocated once here: a pinned allocation later would stall the GPU mid-serving
        pipelined = capture and pipeline_rows > 0
        width = steps * (k + 2 + self.width) if k else steps + 1  # ``RoundGraph.out``'s widest row
        self._host_out = [torch.empty(pipeline_rows * width, dtype=torch.long, pin_memory=True)
                          for _ in range(2)] if pipelined else []
        self._done = [torch.cuda.Event() for _ in range(2)] if pipelined else []
        self._launches = 0
        self.rounds = 0  # rounds run (a counter for stats and tests)
        self.rounds_ahead = 0  # of them, rounds that had been launched ahead
        self.compacted = 0  # rounds launched ahead without the rows that had finished (engine/rounds/chained.py)
        self.joined = 0  # rows that joined a chain of rounds launched ahead (their prompt ran beside it)
        self.row_rounds = 0  # rows x rounds of the rounds read (the bucket's padding rows not counted)
        self.past_end = 0  # of them, rounds a replay of several ran for a row after it reached max_tokens

    @property
    def dropped(self) -> int:
        """Rounds launched ahead whose rows did not come back as they were (wasted, never read)."""
        return self.ahead.dropped

    # ------------------------------------------------------------------ host side
    def fits(self, committed: int) -> bool:
        """Whether a row with this many committed tokens can take a round (its KV and drafts fit)."""
        return committed + 2 * self.span - 1 <= self.max_context

    def expect(self, request_ids: tuple[str, ...]) -> None:
        """Before the rows of a round are chosen to run anywhere: unless the round launched ahead runs exactly
        these requests next, forget it and give back the KV blocks it held past each row's length."""
        self.ahead.expect(request_ids)

    def run(self, rows: Sequence[FusedRow], ahead: bool = False) -> list[RowResult | None]:
        """One round for these rows. ``ahead``: the caller means to run the same rows again next (nothing
        waits to join them), so where they qualify (``_chains``) the next round is launched before this one
        is read, with its inputs (last committed token, next drafts, KV lengths) chained on the device; the
        host's work on this round's output then overlaps the GPU's next round. Rows the round launched ahead
        does not hold (their prompt ran beside it; on a speculative graph, their first drafts came from the
        drafter this round) *join* the chain (``_joining``): they run from the round launched now, and get None
        this round."""
        lengths = [len(r.token_ids) - 1 for r in rows]  # L: everything but t0 is in the target's KV
        joining = self._joining(rows, lengths, ahead)
        if not joining:
            return self._run(rows, lengths, ahead)
        dst, kept, entering = joining
        results = self._run([rows[i] for i in kept], [lengths[i] for i in kept], ahead,
                            ([rows[i] for i in entering], [lengths[i] for i in entering], dst))
        out: list[RowResult | None] = [None] * len(rows)
        for i, res in zip(kept, results):
            out[i] = res
        return out

    def _run(self, rows: Sequence[FusedRow], lengths: list[int], ahead: bool,
             joining: tuple[list[FusedRow], list[int], "RoundGraph"] | None = None) -> list[RowResult]:
        n = len(rows)
        taken = self.ahead.take(tuple(r.request_id for r in rows), lengths, tuple(r.num_draft for r in rows))
        index = None  # each row's place in the launch, where rows that finished since it was launched are gone
        if taken is None:
            launch = self._launch(rows, lengths)
        else:  # the KV lengths this round wrote, inside the blocks it was launched with
            launch, index = taken
            if index == list(range(len(launch.rows))):
                index = None
            self.rounds_ahead += 1
            for r, length in zip(rows, lengths):
                self.target.allocator.extend(r.request_id, length + launch.g.span)
            if launch.g.program is not None:
                launch.g.program.grow([(r.request_id, length, r.params) for r, length in zip(rows, lengths)])
        g = launch.g
        chained = ahead and (joining is not None or self._chains(g, rows, lengths))  # (joining: checked for all)
        q_out = g.q_out
        if chained:
            if q_out is not None:  # the next drafts' q, before the round launched next overwrites it
                q_out = q_out[:n].clone() if index is None else q_out[index]
            self.ahead.hold(self._launch_chained(g, rows, lengths, index, joining))
        out = launch.read()
        if index is not None:
            out = [out[i] for i in index]
        self.rounds += 1
        self.row_rounds += len(rows) * g.steps
        alloc = self.target.allocator
        results, nexts = [], []
        for i, (r, length, row) in enumerate(zip(rows, lengths, out)):
            res, nd = self._result(g, r, row, q_out[i] if q_out is not None and not r.params.greedy else None)
            n = len(res.committed)
            alloc.truncate(r.request_id, length + n, keep_blocks=chained)
            if g.program is not None:
                g.program.commit(r.request_id, length + n + 1, keep_blocks=chained)  # tokens committed
            results.append(res)
            nexts.append(nd)
        if chained:  # the L each row will have once this round's tokens are committed, the drafts it verifies
            entering, entering_lengths, _ = joining or ([], [], None)
            self.ahead.known([length + len(res.committed) for length, res in zip(lengths, results)]
                             + entering_lengths, tuple(nexts) + tuple(r.num_draft for r in entering))
        return results

    def _result(self, g: RoundGraph, r: FusedRow, row: list[int], q: torch.Tensor | None
                ) -> tuple[RowResult, int]:
        """A row's output (``g.out``'s row; ``q``: its next drafts' q, sampled rows) as its result, and the drafts
        it verifies next round (as engine/rounds/chained.py's ``count_down`` has it)."""
        if not self.k:  # plain: its steps' tokens, then their number - 1
            a = row[g.span]
            return RowResult(row[: a + 1], 0, 0), 0
        res, nd, past_end = read_rounds(row, g.steps, self.k, self.one_hot, r.num_draft, r.room, r.wanted, r.drafts, q,
                                        self.width)
        self.past_end += past_end
        return res, nd

    def _joining(self, rows: Sequence[FusedRow], lengths: Sequence[int], ahead: bool
                 ) -> tuple["RoundGraph", list[int], list[int]] | None:
        """Rows joining the chain this round: the rows the round launched ahead does not hold,
        where it runs every other row as it is and the next round, of all of them, can be launched now into a
        graph already built (its rows bucket, a context bucket for the longest, their sampling mode); that graph,
        the other rows' positions and theirs. None: every row runs this round (the launch, if any, is taken or
        dropped)."""
        launch = self.ahead.launch
        if not (ahead and launch is not None and launch.lengths is not None):
            return None
        held = set(launch.rows)
        kept = [i for i, r in enumerate(rows) if r.request_id in held]
        if len(kept) == len(rows):  # the usual round: nobody joins
            return None
        entering = [i for i, r in enumerate(rows) if r.request_id not in held]
        if not kept or self.ahead.match(
                launch, tuple(rows[i].request_id for i in kept), [lengths[i] for i in kept],
                tuple(rows[i].num_draft for i in kept)) is None:
            return None
        need = max(lengths) + 3 * self.span - 1
        key = self.store.key(len(rows), max(launch.g.key[1], need), [r.params for r in rows])
        dst = None if key is None else self.store.get(key, build=not self.capture)
        if dst is None or not self._chains(dst, rows, lengths):
            return None
        return dst, kept, entering

    def _graph(self, rows: Sequence[FusedRow], lengths: Sequence[int]) -> RoundGraph:
        return self.store.get(self.store.key(len(rows), max(lengths) + 2 * self.span - 1, [r.params for r in rows]))

    def _launch(self, rows: Sequence[FusedRow], lengths: Sequence[int]) -> Launch:
        """A round from the host's state: every input copied in, then the replay."""
        k, w, n = self.k, self.width, len(rows)
        g = self._graph(rows, lengths)
        rows_b = g.inputs.shape[0]
        alloc = self.target.allocator
        for r, length in zip(rows, lengths):
            alloc.extend(r.request_id, length + g.span)
        g.attn.set_rows([alloc.block_table(r.request_id) for r in rows], [length + w + 1 for length in lengths])
        if g.sampling is not None:
            g.sampling.load(rows)
        if g.program is not None:
            g.program.load([(r.request_id, length, r.params) for r, length in zip(rows, lengths)])
        inputs = torch.zeros(rows_b, w + 2, dtype=torch.long)
        inputs[:, w + 1] = k
        inputs[:n] = torch.tensor([self._inputs_row(r) for r in rows], dtype=torch.long).view(n, w + 2)
        g.inputs.copy_(inputs, non_blocking=True)
        if g.room is not None:
            rooms = [(r.room, r.wanted) for r in rows] + [(0, 0)] * (rows_b - n)
            g.room.copy_(torch.tensor(rooms, dtype=torch.long), non_blocking=True)
        return self._replay(g, rows, list(lengths), tuple(r.num_draft for r in rows))

    def _inputs_row(self, r: FusedRow) -> list[int]:
        """A row's inputs from the host: t0, its drafts (a row with fewer than k drafts, one-hot ones, verifies those
        it has; a tree's row from drafts made outside the graph, a chain, carries them on the tree's first path) and
        how many depths it verifies."""
        drafts = list(r.drafts)
        if self.tree is not None and len(drafts) != self.width:
            drafts = self.tree.place_chain(drafts)
        return [r.token_ids[-1], *drafts, *[PLACEHOLDER_TOKEN_ID] * (self.width - len(drafts)), r.num_draft]

    def _chains(self, g: RoundGraph, rows: Sequence[FusedRow], lengths: Sequence[int]) -> bool:
        """Whether the next round of these rows can be launched now, before this one is read: every row's room
        known (each verifies next round what the host would give it: engine/rounds/chained.py counts it down),
        some row sure to outlive this round (else the launch would likely be thrown away: one request's last
        round), and the next round's longest row, however many drafts this one accepts, still inside this
        graph's context bucket."""
        return (g.chains  # its rows bucket, and so the batch, holds at most pipeline_rows rows
                and all(r.room > 0 for r in rows) and any(r.room > g.steps * (r.num_draft + 1) for r in rows)
                and max(lengths) + 3 * self.span - 1 <= min(g.attn.max_tokens, self.max_context))

    def _launch_chained(self, g: RoundGraph, rows: Sequence[FusedRow], lengths: Sequence[int],
                        index: list[int] | None,
                        joining: tuple[list[FusedRow], list[int], RoundGraph] | None = None) -> Launch:
        """The round after the one in flight: KV grown for its worst case (every draft accepted now), the
        block tables copied; its tokens, drafts and KV lengths are what the round in flight left in the
        graph's inputs. Rows that finished since that round was launched (``index`` skips them) leave: the
        live rows' buffers move up, into the smallest bucket that holds them where it chains too. Rows
        ``joining`` (with their L, into that graph) follow them, their inputs from the host (``enter``)."""
        alloc, src = self.target.allocator, g
        entering, entering_lengths, dst = joining or ([], [], None)
        if index is not None or (dst is not None and dst is not g):
            g = self._compact(g, list(range(len(rows))) if index is None else index, dst)
            self.compacted += index is not None
        for r, length in zip(rows, lengths):  # the round in flight's tokens, then this one's
            alloc.extend(r.request_id, length + src.span + g.span)
        if entering:
            enter(g.inputs, g.attn.kv_lens, [self._inputs_row(r) for r in entering], entering_lengths, len(rows),
                  g.room, [(r.room, r.wanted) for r in entering])
            for r, length in zip(entering, entering_lengths):  # its blocks for the round, its length as it is
                alloc.extend(r.request_id, length + g.span)
                alloc.truncate(r.request_id, length, keep_blocks=True)
            self.joined += len(entering)
        everyone = list(rows) + entering
        g.attn.set_rows([alloc.block_table(r.request_id) for r in everyone], None)
        if g.sampling is not None:
            g.sampling.load(everyone, chained=True, params=index is not None or bool(entering), entering=len(entering),
                            advance=src.steps)
        if g.program is not None:  # a chained row's L is at most its L now + the span of the replay in flight
            g.program.load([(r.request_id, length + src.span, r.params) for r, length in zip(rows, lengths)]
                           + [(r.request_id, length, r.params) for r, length in zip(entering, entering_lengths)],
                           chained=True)
        launch = self._replay(g, everyone, None, None)
        launch.sampled = tuple(r.request_id for r in everyone if not r.params.greedy)
        return launch

    def _replay(self, g: RoundGraph, rows: Sequence[FusedRow], lengths: list[int] | None,
                num_draft: tuple[int, ...] | None) -> Launch:
        n = len(rows)
        ids = tuple(r.request_id for r in rows)
        if g.graph is None:
            with torch.inference_mode():
                self.body.compute(g)
            return Launch(g, ids, lengths, num_draft, g.out[:n].clone(), None)
        g.graph.replay()
        if not g.chains:  # read as before: the output straight from the device (the read syncs)
            return Launch(g, ids, lengths, num_draft, g.out[:n], None)
        slot = self._launches % 2
        self._launches += 1
        width = g.out.shape[1]  # a graph's own (plain graphs differ by their steps): contiguous, or the copy syncs
        out, done = self._host_out[slot][: n * width].view(n, width), self._done[slot]
        out.copy_(g.out[:n], non_blocking=True)
        done.record()
        return Launch(g, ids, lengths, num_draft, out, done)

    def _compact(self, src: RoundGraph, index: list[int], dst: RoundGraph | None = None) -> RoundGraph:
        """The chained buffers of the rows at ``index`` of ``src``, moved to the front of ``dst``, by default the
        smallest bucket (same context, same mode) that holds them and chains, else ``src`` itself; returns it."""
        rows_b, ctx, mode = src.key
        if dst is None:
            dst = self.store.get((self.store.bucket(len(index)), ctx, mode), build=False)
            if dst is None or not dst.chains:
                dst = src
        s_in, d_in = src.sampling, dst.sampling
        q = (s_in.q_in, d_in.q_in) if s_in is not None and s_in.q_in is not None else (None, None)
        compact((src.inputs, src.attn.kv_lens, src.room, q[0]), (dst.inputs, dst.attn.kv_lens, dst.room, q[1]),
                (self._pad_inputs, self.width + 1, 0, None), index, self.target.device)
        return dst

