"""A drafter's part of a fused round (engine/rounds/fused.py): catch-up and k drafts on the device.

Shared by every drafter that drafts inside the round's graph; a subclass says what one forward of
its model is. Rows: R requests; L = a row's committed tokens before its last (t0, at position L).
The round's verify committed c_0 .. c_a (accepted drafts, then the recovered or bonus token) at
positions L + 1 .. L + a + 1. The drafter's KV holds one entry per position from ``first_position``
on, so entry p lives at KV index p - first_position. In the graph it
1. catches up: entries L + 1 .. L + k + 1, tokens c_0 .. c_k -- a fixed shape; entries past
   L + a + 1 hold placeholders, are never attended by a committed entry and are overwritten later;
   every entry writes its K/V, and only entry L + a + 1 of each row goes on past the last layer's
   attention (o-proj, MLP, norms and LM head on R rows, not R * (k + 1)): draft 1;
2. drafts: k - 1 single-token steps, entry L + a + 1 + j fed draft j.
Every length is derived on the device from ``num_accepted``; the host only grows each request's
KV before the round (to L + 2k entries) and cuts it to the committed length after. In a sampling
round every draft is picked as ``DraftSampler.pick`` picks it (``pick_in_graph``: argmax for greedy
rows, the exponential race over q for sampled ones) with noise the graph draws into ``noise`` first
(one launch: each request's ``Stream.DRAFT`` at the draw number the host wrote to ``draws``, k steps'
columns), the draws the eager drafter would make; the q of each draft goes back with the drafts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch

from engine.attention.static import StaticAttention
from engine.config import SamplingParams
from engine.drafters.draft_sampling import DraftSampler, pick_in_graph
from engine.graphs import PAD_SEQ
from engine.models import ops
from engine.sampling import coins

if TYPE_CHECKING:
    from engine.rounds.graph_sampling import RoundSampling
    from engine.rounds.tree import DraftTree
    from engine.runner import ModelRunner


class GraphDraftProgram:
    first_position: int = 0  # the position of KV entry 0
    rounds: int = 1  # whole rounds a replay drafts for

    def __init__(self, runner: "ModelRunner", sampler: DraftSampler, rows: int, k: int, max_blocks: int,
                 sampled: bool, tree: "DraftTree | None" = None) -> None:
        self.sampler, self.device = sampler, runner.device
        self.allocator, self.k, self.rows = runner.allocator, k, rows
        if PAD_SEQ not in self.allocator:
            self.allocator.extend(PAD_SEQ, 1)
        scratch = self.allocator.block_table(PAD_SEQ)[0]
        heads = runner.model.config.num_heads
        self.catch = StaticAttention(runner.cache, heads, rows, k + 1, max_blocks, scratch)
        # the draft steps' attention: each step a view of it over that step's lengths (``with_kv_lens``)
        self.step = StaticAttention(runner.cache, heads, rows, 1, max_blocks, scratch)
        self.step.share_table(self.catch)  # one table serves every forward of the round
        self._rows = torch.arange(rows, device=self.device)
        self._offsets = torch.arange(k + 1, device=self.device)
        self._steps = torch.arange(1, k, device=self.device)                   # [k - 1] the draft steps
        # [R, k, V] Exponential(1) noise for sampled rows, drawn at [2, R] (seed, draw number)
        self.noise = torch.ones(rows, k, sampler.target_vocab, device=self.device) if sampled else None
        self.draws = torch.zeros(2, rows, dtype=torch.long, device=self.device) if sampled else None
        # a draft tree (greedy rounds, ``draft_tree``): step s forwards every node of depth 1 .. s, each attending to
        # the committed entries and its own ancestors (a node's entry is rewritten with the same K/V each step)
        self.tree, self.tree_steps = tree, []
        if tree is not None:
            if tree.depth != k:
                raise ValueError(f"spec_tree: depth {tree.depth} must equal k ({k})")
            dev = self.device
            # each node's parent as an index into its parent's depth (the root's outputs: one row)
            parent_at = [p - (tree.levels[tree.depths[p] - 1][0] if p else 0) for p in tree.parents]
            for start, end in tree.levels[:-1]:
                bits = torch.tensor([tree.ancestor_bits[i] >> 1 for i in range(1, end)], device=dev)
                attn = StaticAttention(runner.cache, heads, rows, end - 1, max_blocks, scratch, tree=bits)
                attn.share_table(self.catch)
                kept = torch.arange(start - 1, end - 1, device=dev)                            # depth s's nodes
                self.tree_steps.append((attn, torch.tensor(tree.depths[1:end], device=dev),       # [m] depths
                                        (self._rows[:, None] * (end - 1) + kept[None, :]).reshape(-1)))  # [R * W_s]
            self._tree_parent_at = [torch.tensor(parent_at[s:e], device=dev) for s, e in tree.levels]

    # ------------------------------------------------------------------ what a subclass says
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attn: StaticAttention, extra: Any,
                keep: torch.Tensor | None = None) -> torch.Tensor:
        """tokens, rotary positions [T] -> outputs [T, H]; ``extra``: the catch-up's ``catch_up_extra`` or, in a
        draft step, the previous step's output rows (what a feature-fed head reads beside its token); ``keep``
        [N] long: every token writes its K/V, only these rows go on past the last attention -> [N, H]."""
        raise NotImplementedError

    def catch_up_extra(self, aux: torch.Tensor | None) -> Any:
        """What the catch-up's entries read beside their tokens, from the verify's aux features [R*(k+1), F]."""
        return None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] -> [N, V] over the target's vocabulary, in the model's dtype (a greedy pick's argmax reads
        it as it is; a sampling round's pick takes it in float32)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ host side
    def load(self, rows: Sequence[tuple[str, int, SamplingParams]], chained: bool = False) -> None:
        """Before a replay: each row's (request id, L, params). ``chained``: a round launched before the one in
        flight was read, L the largest it can be; the KV lengths are derived on the device, and a sampled row
        draws its noise at its next draw number, as it would."""
        alloc, k, first = self.allocator, self.k, self.first_position
        self.grow(rows)
        self.catch.set_rows([alloc.block_table(rid) for rid, _, _ in rows],
                            None if chained else [length + k + 2 - first for _, length, _ in rows])
        if self.noise is not None and any(not params.greedy for _, _, params in rows):  # (the graph draws its noise)
            pad = [0] * (self.rows - len(rows))
            self.draws.copy_(torch.tensor([[params.seed for _, _, params in rows] + pad,
                                           [self.sampler.draw_number(rid) for rid, _, _ in rows] + pad]),
                             non_blocking=True)
            self.sampler.end_round((rid, params) for rid, _, params in rows)

    def rewind(self, request_ids: Sequence[str]) -> None:
        """A round loaded for these sampled requests was dropped unread: their next round draws its noise at the
        draw number that one took (a part that samples nothing took none)."""
        if self.noise is not None:
            self.sampler.rewind(request_ids)

    def grow(self, rows: Sequence[tuple[str, int, SamplingParams]]) -> None:
        """Room in the head's KV for a replay of these rows: the catch-up (to L + k + 1), the draft steps (to L + 2k);
        each further round of the replay starts up to k + 1 entries later."""
        drafts = self.k - 1 if self.tree is None else self.tree.nodes  # entries past the catch-up's a round writes
        need = self.k + 2 + drafts - self.first_position + (self.rounds - 1) * (self.k + 1)
        for rid, length, _ in rows:
            if self.allocator.length(rid) < length + need:
                self.allocator.extend(rid, length + need)

    def commit(self, request_id: str, committed: int, keep_blocks: bool = False) -> None:
        """After the round: keep the entries of the ``committed`` tokens (positions 0 .. committed - 1);
        ``keep_blocks``: and every block (a round launched ahead writes into them)."""
        self.allocator.truncate(request_id, committed - self.first_position, keep_blocks)

    # ------------------------------------------------------------------ in the graph
    def _pick(self, logits: torch.Tensor, j: int, s: "RoundSampling | None"
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if s is None:
            return ops.argmax(logits), None
        return pick_in_graph(logits.float(), s.greedy, s.temperature, s.top_k, s.top_p, self.noise[:, j],
                             s.filtered, self.sampler.top_m)

    def _catch_up(self, committed: torch.Tensor, num_accepted: torch.Tensor, aux: torch.Tensor | None,
                  kv_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The catch-up -> the live entry's output [R, H] and each row's entry count through it ([R]: kv)."""
        k = self.k
        kv = kv_lens + 1 - self.first_position                                  # entries up to L + k + 1
        self.catch.kv_lens.copy_(kv)
        self.catch.prepare()
        positions = (kv_lens[:, None] - k + self._offsets[None, :]).reshape(-1)  # L + 1 .. L + k + 1
        tokens = committed.clamp(min=0).reshape(-1)                             # placeholders -> any id
        live = self._rows * (k + 1) + num_accepted                              # entry L + a + 1 of each row
        return self.forward(tokens, positions - self.first_position, self.catch, self.catch_up_extra(aux),
                            live), kv

    def draft_tree(self, committed: torch.Tensor, num_accepted: torch.Tensor, aux: torch.Tensor | None,
                   kv_lens: torch.Tensor) -> torch.Tensor:
        """A greedy round's next drafts as a tree (``self.tree``, engine/rounds/tree.py) -> [R, N] node tokens: under
        each node its ``b`` likeliest next tokens, best first (the first path is ``draft``'s greedy chain).
        kv_lens: [R] L + k + 1, as ``draft`` takes them."""
        tree, k = self.tree, self.k
        g, kv = self._catch_up(committed, num_accepted, aux, kv_lens)           # [R, H]
        levels = [ops.topk(self.logits(g), tree.branching[0])]                 # depth 1's tokens [R, b1]
        outs = [g[:, None, :]]                                                  # each depth's outputs, the root's first
        first = kv - k + num_accepted                                           # [R] the first node's entry
        for s, (attn, depths, keep) in enumerate(self.tree_steps, start=1):     # forward depths 1 .. s, keep depth s
            m, width = attn.q_len, keep.shape[0] // self.rows
            extra = _cat([outs[d].index_select(1, self._tree_parent_at[d]) for d in range(s)])  # [R, m, H] parents'
            attn.kv_lens.copy_(first + m)
            attn.prepare()
            positions = first[:, None] - 1 + depths[None, :]                    # [R, m] node j: its depth's entry
            out = self.forward(_cat(levels).reshape(-1), positions.reshape(-1), attn,
                               extra.reshape(self.rows * m, -1), keep)          # [R * W_s, H]
            outs.append(out.view(self.rows, width, -1))
            b = tree.branching[s]
            levels.append(ops.topk(self.logits(out), b).view(self.rows, width * b))
        return _cat(levels)

    def draft(self, committed: torch.Tensor, num_accepted: torch.Tensor, aux: torch.Tensor | None,
              kv_lens: torch.Tensor, sampling: "RoundSampling | None" = None
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        k = self.k
        if sampling is not None and self.noise is not None:  # every row's, at the draws the host wrote
            coins.fill(self.noise.view(self.rows, -1), self.draws[0], self.draws[1], coins.Stream.DRAFT,
                       exponential=True)
        g, kv = self._catch_up(committed, num_accepted, aux, kv_lens)          # [R, H]
        d, q = self._pick(self.logits(g), 0, sampling)
        drafts, qs = [d], [q]
        # every draft step's KV lengths in one launch: step j holds entries through L + a + 1 + j
        lens = (kv - k + num_accepted)[None, :] + self._steps[:, None]         # [k - 1, R]
        positions = lens - 1                                                    # [k - 1, R] its entry's position
        for j in range(1, k):
            attn = self.step.with_kv_lens(lens[j - 1])
            attn.prepare()
            g = self.forward(d, positions[j - 1], attn, g)
            d, q = self._pick(self.logits(g), j, sampling)
            drafts.append(d)
            qs.append(q)
        return torch.stack(drafts, dim=1), None if sampling is None else torch.stack(qs, dim=1)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat along dim 1, without a copy for one part."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
