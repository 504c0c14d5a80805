"""A fused round's sampling: which acceptance its graph is built for (``Mode``) and the device buffers a sampling
round refills before each replay (``RoundSampling``).

No generator state lives in a graph: a sampled row's coins (k uniforms and one row of Exponential(1) noise per
step, as the eager round draws them) are counter-based (engine/sampling/coins.py), a pure function of the row's
seed and draw number. The host writes those two numbers per row into ``draws`` before each replay; the graph draws
the coins from them itself (``draw``, one launch per kind, captured with the round), as the drafter's part draws
its noise. So a seeded request decodes the same tokens on the fast path as on the eager one, and a sampled round
costs the host no launches of its own (they cost 18-20 % of a served sampled round's host time on an H100 when the
host launched them: bench/RESULTS.md, issue 21).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from engine.config import SamplingParams
from engine.sampling import RowParams, coins, pack_rows

if TYPE_CHECKING:
    from engine.rounds.fused import FusedRow


class Mode(enum.IntEnum):
    """What a round's graph accepts with: part of its key, decided on the host from the rows' params."""

    GREEDY = 0    # every row greedy: argmax matching only
    SAMPLED = 1   # some rows sample (temperature only): rejection sampling beside the greedy rows
    FILTERED = 2  # and some use top-k / top-p: the sorting path of probs_from_logits

    @classmethod
    def of(cls, params: Sequence[SamplingParams]) -> "Mode":
        sampled = [p for p in params if not p.greedy]
        if not sampled:
            return cls.GREEDY
        return cls.FILTERED if any(p.filters for p in sampled) else cls.SAMPLED


@dataclass
class RoundSampling:
    """Device buffers of a sampling round: the host refills ``params`` and ``draws`` before each replay (padding
    rows greedy); inside the graph ``draw`` fills the coins from ``draws`` and ``unpack`` turns ``params``
    ([R, 4], one copy: ``engine.sampling.pack_rows``) into the tensors below, once per round."""

    filtered: bool
    params: torch.Tensor       # [R, 4] float32
    draws: torch.Tensor        # [2, R] int64: each row's seed and draw number
    uniforms: torch.Tensor     # [R, w] float32: the round's acceptance coins, one a draft (a draft tree's: a node)
    noise: torch.Tensor        # [S, R, V] float32 Exponential(1): the recovered / bonus draw of each step
    q_in: torch.Tensor | None  # [R, k, V] float32: q of the drafts being verified (k > 0)
    zero_q: torch.Tensor | None  # [k, V] zeros: the q of a greedy row (any finite q; its result is unused)
    greedy: torch.Tensor | None = None       # [R] bool
    temperature: torch.Tensor | None = None  # [R] float32, 1 on greedy rows
    top_k: torch.Tensor | None = None        # [R] int64
    top_p: torch.Tensor | None = None        # [R] float32

    @classmethod
    def allocate(cls, rows: int, k: int, vocab: int, filtered: bool,
                 device: torch.device, with_q: bool = True, steps: int = 1) -> "RoundSampling":
        """``k``: drafts a row carries (a draft tree's nodes); ``with_q`` False: the drafts are one-hot (a
        deterministic drafter, a draft tree), no q crosses. ``steps``: tokens a row decodes in a round (a plain
        graph's steps), each with the draw number after the one before."""
        params = pack_rows([], rows).to(device)
        q = bool(k) and with_q
        return cls(filtered, params, torch.zeros(2, rows, dtype=torch.long, device=device),
                   torch.zeros(rows, k, device=device), torch.ones(steps, rows, vocab, device=device),
                   torch.zeros(rows, k, vocab, device=device) if q else None,
                   torch.zeros(k, vocab, device=device) if q else None)

    def draw(self) -> None:
        """Inside the graph: every row's coins at its (seed, draw number) in ``draws``, as the eager round draws them
        (a greedy or padding row's are drawn and unused); a plain graph's step s at the draw number + s."""
        seeds, counters = self.draws
        if self.uniforms.shape[1]:
            coins.fill(self.uniforms, seeds, counters, coins.Stream.ACCEPT)
        for step in range(self.noise.shape[0]):
            coins.fill(self.noise[step], seeds, counters + step, coins.Stream.RECOVER, exponential=True)

    def unpack(self) -> None:
        """Inside the graph: the parameter tensors every part of the round reads."""
        p = RowParams.unpack(self.params)
        self.greedy, self.temperature, self.top_k, self.top_p = p.greedy, p.temperature, p.top_k, p.top_p

    def load(self, rows: Sequence["FusedRow"], chained: bool = False, params: bool = False, entering: int = 0,
             advance: int = 1) -> None:
        """Parameters, each row's seed and draw number (its coins are drawn from them in the graph: ``draw``) and
        the pending drafts' q; rows past the batch become greedy padding. ``chained``: the round after the one in
        flight (its draw numbers ``advance`` further, the forwards of the round in flight; the parameters stay
        unless ``params`` (its rows were compacted or rows join), and the q of its drafts is what the round in
        flight leaves in ``q_in``); its last ``entering`` rows join the chain (not in the round in flight: their
        draw numbers are their own, and so is the q of their drafts, copied in)."""
        n, pad = len(rows), self.params.shape[0] - len(rows)
        if not chained or params:
            self.params.copy_(pack_rows([r.params for r in rows], n + pad), non_blocking=True)
        ahead = [advance * (chained and i < n - entering) for i in range(n)]
        self.draws.copy_(torch.tensor([[r.params.seed for r in rows] + [0] * pad,
                                       [r.draw + a for r, a in zip(rows, ahead)] + [0] * pad]), non_blocking=True)
        first = n - entering if chained else 0  # the rows whose q comes from the host
        if self.q_in is not None and first < n:  # one gather straight into the buffer
            torch.stack([self.zero_q if r.params.greedy or r.q is None else r.q for r in rows[first:]],
                        out=self.q_in[first:n])
