"""The device side of a fused round (engine/rounds/fused.py): a graph's buffers (``RoundGraph``) and what its replay
runs (``RoundBody.compute``): per step the target's forward over every row's t0 and drafts, greedy and
rejection-sampled acceptance; then the drafter's next drafts; then the next round's inputs chained in place
(engine/rounds/chained.py) where the graph launches rounds ahead. A plain graph (k 0) runs ``steps`` forwards a
round, each on the token the one before picked; a greedy speculative graph of ``steps`` > 1 runs that many whole
rounds a replay, each verifying the drafts the one before made, its inputs chained and counted down on the device as
a round launched ahead's are (the host's work then comes once per ``steps`` rounds). ``read_rounds``: a speculative
replay's output row, read back on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from engine.attention.static import StaticAttention
from engine.models import ops
from engine.rounds.base import RowResult
from engine.rounds.chained import chain, count_down, next_num_draft
from engine.rounds.graph_sampling import Mode, RoundSampling
from engine.rounds.tree import TreeTensors, accept_tree, move_kv, path_slots, tree_rejection_sample
from engine.sampling import greedy_verify, probs_from_logits, rejection_sample

if TYPE_CHECKING:
    from engine.drafters.base import DraftProgram
    from engine.rounds.tree import DraftTree


@dataclass
class RoundGraph:
    attn: StaticAttention           # the target's verify, q_len k + 1
    program: "DraftProgram | None"  # the drafter's part
    inputs: torch.Tensor            # [R, k+2] long: t0, the k pending drafts and how many of them to verify
    sampling: RoundSampling | None  # sampled modes only
    chains: bool                    # its rows bucket may launch rounds ahead (<= pipeline_rows): it chains inputs
    key: tuple[int, int, Mode]      # (rows bucket, context bucket, mode)
    steps: int                      # forwards a round (plain: plain_steps; speculative: whole rounds, spec_rounds)
    # [R, 2] long (k > 0, chaining or steps > 1): tokens each row may still commit, and the drafts it verifies a round
    # while that room allows (engine/rounds/chained.py ``count_down``)
    room: torch.Tensor | None = None
    # plain [R, steps + 1]: tokens, steps - 1; speculative [R, steps * (2k + 2)]: per round its committed tokens
    # (k + 1), num_accepted (1) and next drafts (k)
    out: torch.Tensor | None = None
    q_out: torch.Tensor | None = None  # [R, k, V] float32: the next drafts' q (sampled modes, k > 0)
    graph: "torch.cuda.CUDAGraph | None" = None

    @property
    def span(self) -> int:
        """Tokens a replay writes to a row's KV at most: k + 1 a round speculating, one a step plain."""
        return self.steps * (self.inputs.shape[1] - 1)


class RoundBody:
    """What a fused round's graph runs, on its buffers; the same for every graph of one ``FusedRounds``. With a draft
    tree (engine/rounds/tree.py) a row carries the tree's N nodes instead of k drafts: every round drafts the whole
    tree (the head's likeliest tokens, for greedy and sampled rows alike) and verifies it, greedy rows by matching,
    sampled ones by ``tree_rejection_sample``; the accepted nodes' K/V and features move to the committed positions
    first."""

    def __init__(self, model: torch.nn.Module, k: int, one_hot: bool, aux_layers: tuple[int, ...],
                 device: torch.device, tree: "DraftTree | None" = None) -> None:
        self.model, self.k, self.one_hot, self.aux_layers = model, k, one_hot, aux_layers
        self.tree = None if tree is None else TreeTensors(tree, device)
        self.width = k if tree is None else tree.nodes  # drafts a row carries
        self._offsets = torch.arange(k + 1, device=device)

    def compute(self, g: RoundGraph) -> None:
        if self.k and g.steps > 1:
            return self._rounds(g)
        s = g.sampling
        if s is not None:
            s.draw()
        picked = []  # a plain graph's tokens of the steps before the last
        for step in range(g.steps):
            committed, accepted, aux = self.verify(g, step)
            if step + 1 < g.steps:  # the next step's input: this step's token, one position on
                chain(g.inputs, g.attn.kv_lens, committed, accepted, None)
                picked.append(committed)
        parts = [torch.cat(picked + [committed], dim=1), accepted[:, None] + (g.steps - 1)]
        q = None
        if g.program is not None:
            next_drafts, q = self.draft(g, committed, accepted, aux, s)
            parts.append(next_drafts)
        out = torch.cat(parts, dim=1)
        if g.out is None:
            g.out, g.q_out = out, q
        else:
            g.out.copy_(out)
            if q is not None:
                g.q_out.copy_(q)
        if g.chains:
            chain(g.inputs, g.attn.kv_lens, committed, accepted, parts[2] if g.program is not None else None,
                  q, g.sampling.q_in if q is not None else None)
            if g.room is not None:
                count_down(g.inputs, g.attn.kv_lens, g.room, accepted)

    def _rounds(self, g: RoundGraph) -> None:
        """A greedy speculative graph's ``steps`` rounds, each chained (and counted down) into the next."""
        parts = []
        for rnd in range(g.steps):
            committed, accepted, aux = self.verify(g, 0)
            drafts, _ = self.draft(g, committed, accepted, aux, None)
            parts += [committed, accepted[:, None], drafts]
            if rnd + 1 < g.steps or g.chains:
                chain(g.inputs, g.attn.kv_lens, committed, accepted, drafts)
                count_down(g.inputs, g.attn.kv_lens, g.room, accepted)
        out = torch.cat(parts, dim=1)
        if g.out is None:
            g.out = out
        else:
            g.out.copy_(out)

    def draft(self, g: RoundGraph, committed: torch.Tensor, accepted: torch.Tensor, aux: torch.Tensor | None,
              s: RoundSampling | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The drafter's next drafts [R, w] (and, a sampled chain's, their q [R, k, V]): a tree's, one-hot, in any
        round of a tree (its sampled rows verify it against the target alone: ``tree_rejection_sample``)."""
        if self.tree is None:
            return g.program.draft(committed, accepted, aux, g.attn.kv_lens, s)
        lens = g.attn.kv_lens - (self.width - self.k)  # L + k + 1, as the drafter's part takes them
        return g.program.draft_tree(committed, accepted, aux, lens), None

    def verify(self, g: RoundGraph, step: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """The target's forward over every row's t0 and drafts, and acceptance: committed [R, k+1], accepted [R]
        and the aux features; ``step``: a plain graph's step (its coins)."""
        if self.tree is not None:
            return self._verify_tree(g)
        k, model, s = self.k, self.model, g.sampling
        rows = g.inputs.shape[0]
        tokens, drafts, num_draft = g.inputs[:, : k + 1], g.inputs[:, 1: k + 1], g.inputs[:, k + 1]
        kv = g.attn.kv_lens                                                   # [R] L + k + 1
        positions = (kv[:, None] - (k + 1) + self._offsets[None, :]).reshape(-1)
        g.attn.prepare()
        # a placeholder (past a row's real drafts: the n-gram lookup's, a row entering without drafts) is run as any
        # token: its result is never accepted
        tokens = tokens.clamp(min=0)
        hidden, aux = model.forward_aux(tokens.reshape(-1), positions, g.attn, self.aux_layers)
        logits = model.lm_logits(hidden)                                       # [R*(k+1), V] model dtype
        committed, accepted = greedy_verify(drafts, num_draft, ops.argmax(logits).view(rows, k + 1))
        if s is not None:
            if self.one_hot:  # only the leading real drafts (greedy matching never accepts a placeholder)
                num_draft = torch.minimum(num_draft, (drafts >= 0).long().cumprod(dim=1).sum(dim=1))
            committed, accepted = self._sample(s, logits, drafts, num_draft, committed, accepted, step)
        return committed, accepted, aux

    def _sample(self, s: RoundSampling, logits: torch.Tensor,  # [R*(k+1), V] model dtype: t0's and the drafts'
                drafts: torch.Tensor, num_draft: torch.Tensor,  # [R, k], [R]
                committed: torch.Tensor, accepted: torch.Tensor,  # greedy matching's [R, k+1], [R]
                step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rejection sampling for the sampled rows (the greedy rows keep greedy matching's result)."""
        k = drafts.shape[1]
        s.unpack()
        per_position = (x.repeat_interleave(k + 1) for x in (s.temperature, s.top_k, s.top_p))
        probs = probs_from_logits(logits.float(), *per_position, s.filtered).view(drafts.shape[0], k + 1, -1)
        s_out, s_acc = rejection_sample(drafts, num_draft, probs, s.q_in, s.uniforms, s.noise[step])
        return torch.where(s.greedy[:, None], committed, s_out), torch.where(s.greedy, accepted, s_acc)

    def _verify_tree(self, g: RoundGraph) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``verify`` of t0 and a draft tree's nodes (node i at position L + its depth, its KV at L + i); then the
        accepted path's K/V moved to L + 1 .. L + a and its features picked, so what follows (the drafter's
        catch-up, the next round) sees exactly what a chain's round leaves."""
        k, n, t, s, model = self.k, self.width, self.tree, g.sampling, self.model
        rows = g.inputs.shape[0]
        nodes, num_draft = g.inputs[:, 1: n + 1], g.inputs[:, n + 1]
        kv = g.attn.kv_lens                                                   # [R] L + N + 1
        positions = (kv[:, None] - (n + 1) + t.depths[None, :]).reshape(-1)
        g.attn.prepare()
        hidden, aux = model.forward_aux(g.inputs[:, : n + 1].clamp(min=0).reshape(-1), positions, g.attn,
                                        self.aux_layers)
        logits = model.lm_logits(hidden).view(rows, n + 1, -1)                 # [R, N+1, V] model dtype
        argmax = ops.argmax(logits.view(rows * (n + 1), -1)).view(rows, n + 1)
        cache = g.attn.cache
        committed, accepted, path, src, dst = accept_tree(nodes, num_draft, argmax, t, g.attn.block_table, kv,
                                                          cache.block_size)
        if s is not None:  # the sampled rows' walk; the greedy rows keep the matching's
            s.unpack()
            per_position = (x.repeat_interleave(n + 1) for x in (s.temperature, s.top_k, s.top_p))
            probs = probs_from_logits(logits.view(rows * (n + 1), -1).float(), *per_position, s.filtered)
            sampled = tree_rejection_sample(nodes, num_draft, probs.view(rows, n + 1, -1), s.uniforms, s.noise[0], t)
            greedy = s.greedy[:, None]
            committed, path = (torch.where(greedy, a, b) for a, b in ((committed, sampled[0]), (path, sampled[2])))
            accepted = torch.where(s.greedy, accepted, sampled[1])
            src, dst = path_slots(g.attn.block_table, kv, path, n, cache.block_size)
        move_kv(cache.k, cache.v, src, dst)
        if aux is not None:                                                   # the path's features, [R*(k+1), F]
            aux = aux.view(rows, n + 1, -1).gather(1, path[:, :, None].expand(-1, -1, aux.shape[-1]))
            aux = aux.reshape(rows * (k + 1), -1)
        return committed, accepted, aux


def read_rounds(row: Sequence[int],        # [steps * (k + 2 + w)]: a speculative graph's ``out`` row
                steps: int, k: int, one_hot: bool,
                num_draft: int,            # the drafts the row verified in the replay's first round
                room: int,                 # tokens it may still commit (0: unknown)
                want: int,                 # drafts it verifies a round from the next on, room allowing
                drafts: Sequence[int],     # [k] the drafts it verified in the first round
                q: torch.Tensor | None,    # [k, V] its next drafts' q (sampled rows)
                width: int | None = None   # w: drafts a round leaves a row (a draft tree's nodes; None: k)
                ) -> tuple[RowResult, int, int]:
    """A row's rounds of one replay -> its result, the drafts it verifies next round (``count_down``'s rule) and how
    many of the replay's rounds ran past its max_tokens (their output is not read)."""
    committed, rounds, nd = [], [], num_draft
    accepted = drafted = past_end = 0
    span = k + 2 + (k if width is None else width)
    for j in range(steps):  # each round's committed tokens (k + 1), accepted count, next drafts (w)
        if j and room <= 0:  # it reached max_tokens: the replay's later rounds are past its end
            past_end = steps - j
            break
        block = row[j * span: (j + 1) * span]
        a = block[k + 1]
        d = min(nd, _real(drafts)) if one_hot else nd
        committed += block[: a + 1]
        accepted, drafted = accepted + a, drafted + d
        if steps > 1:  # (one round: the sums say it all)
            rounds.append((a + 1, a, d))
        nd, room, drafts = next_num_draft(want, room, a), room - a - 1, block[k + 2:]
    return RowResult(committed, accepted, drafted, drafts, q, tuple(rounds)), nd, past_end


def _real(drafts: Sequence[int]) -> int:
    """How many leading drafts are real tokens (the rest are PLACEHOLDER_TOKEN_ID)."""
    return next((i for i, d in enumerate(drafts) if d < 0), len(drafts))
