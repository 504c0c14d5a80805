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
from engine.sampling import greedy_verify, probs_from_logits, rejection_sample

if TYPE_CHECKING:
    from engine.drafters.base import DraftProgram


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
    """What a fused round's graph runs, on its buffers; the same for every graph of one ``FusedRounds``."""

    def __init__(self, model: torch.nn.Module, k: int, one_hot: bool, aux_layers: tuple[int, ...],
                 device: torch.device) -> None:
        self.model, self.k, self.one_hot, self.aux_layers = model, k, one_hot, aux_layers
        self._offsets = torch.arange(k + 1, device=device)

    def compute(self, g: RoundGraph) -> None:
        if self.k and g.steps > 1:
            return self._rounds(g)
        k, s = self.k, g.sampling
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
            next_drafts, q = g.program.draft(committed, accepted, aux, g.attn.kv_lens, s)
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
                count_down(g.inputs, g.attn.kv_lens, g.room, accepted, k)

    def _rounds(self, g: RoundGraph) -> None:
        """A greedy speculative graph's ``steps`` rounds, each chained (and counted down) into the next."""
        parts = []
        for rnd in range(g.steps):
            committed, accepted, aux = self.verify(g, 0)
            drafts, _ = g.program.draft(committed, accepted, aux, g.attn.kv_lens, None)
            parts += [committed, accepted[:, None], drafts]
            if rnd + 1 < g.steps or g.chains:
                chain(g.inputs, g.attn.kv_lens, committed, accepted, drafts)
                count_down(g.inputs, g.attn.kv_lens, g.room, accepted, self.k)
        out = torch.cat(parts, dim=1)
        if g.out is None:
            g.out = out
        else:
            g.out.copy_(out)

    def verify(self, g: RoundGraph, step: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """The target's forward over every row's t0 and drafts, and acceptance: committed [R, k+1], accepted [R]
        and the aux features; ``step``: a plain graph's step (its coins)."""
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
            s.unpack()
            per_position = (x.repeat_interleave(k + 1) for x in (s.temperature, s.top_k, s.top_p))
            probs = probs_from_logits(logits.float(), *per_position, s.filtered).view(rows, k + 1, -1)
            if self.one_hot:  # only the leading real drafts (greedy matching never accepts a placeholder)
                num_draft = torch.minimum(num_draft, (drafts >= 0).long().cumprod(dim=1).sum(dim=1))
            s_out, s_acc = rejection_sample(drafts, num_draft, probs, s.q_in, s.uniforms, s.noise[step])
            committed = torch.where(s.greedy[:, None], committed, s_out)
            accepted = torch.where(s.greedy, accepted, s_acc)
        return committed, accepted, aux


def read_rounds(row: Sequence[int],        # [steps * (2k + 2)]: a speculative graph's ``out`` row
                steps: int, k: int, one_hot: bool,
                num_draft: int,            # the drafts the row verified in the replay's first round
                room: int,                 # tokens it may still commit (0: unknown)
                want: int,                 # drafts it verifies a round from the next on, room allowing
                drafts: Sequence[int],     # [k] the drafts it verified in the first round
                q: torch.Tensor | None     # [k, V] its next drafts' q (sampled rows)
                ) -> tuple[RowResult, int, int]:
    """A row's rounds of one replay -> its result, the drafts it verifies next round (``count_down``'s rule) and how
    many of the replay's rounds ran past its max_tokens (their output is not read)."""
    committed, rounds, nd = [], [], num_draft
    accepted = drafted = past_end = 0
    for j in range(steps):  # each round's committed tokens (k + 1), accepted count, next drafts (k)
        if j and room <= 0:  # it reached max_tokens: the replay's later rounds are past its end
            past_end = steps - j
            break
        block = row[j * (2 * k + 2): (j + 1) * (2 * k + 2)]
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
