"""A fused round's sampling: which acceptance its graph is built for (``Mode``) and the device buffers a sampling
round refills before each replay (``RoundSampling``).

Randomness never comes from inside a graph: a sampled row's coins (k uniforms and one row of Exponential(1)
noise per round, as the eager round draws them) are drawn for the whole batch into these buffers before the
replay, one launch each, from the requests' seeds and draw numbers (engine/sampling/coins.py); the drafter
draws its noise the same way. So a seeded request decodes the same tokens on the fast path as on the eager
one.
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
    """Device buffers of a sampling round, refilled on the host before each replay (padding rows greedy).

    The per-row parameters cross in one copy (``params`` [R, 4], ``engine.sampling.pack_rows``);
    ``unpack`` turns them into the tensors below inside the graph, once per round."""

    filtered: bool
    params: torch.Tensor       # [R, 4] float32
    draws: torch.Tensor        # [2, R] int64: each row's seed and draw number
    uniforms: torch.Tensor     # [R, k] float32: the round's acceptance coins
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
        """``with_q`` False: the drafts are one-hot (a deterministic drafter), no q crosses. ``steps``: tokens a
        row decodes in a round (a plain graph's steps), each with the draw number after the one before."""
        params = pack_rows([], rows).to(device)
        q = bool(k) and with_q
        return cls(filtered, params, torch.zeros(2, rows, dtype=torch.long, device=device),
                   torch.zeros(rows, k, device=device), torch.ones(steps, rows, vocab, device=device),
                   torch.zeros(rows, k, vocab, device=device) if q else None,
                   torch.zeros(k, vocab, device=device) if q else None)

    def unpack(self) -> None:
        """Inside the graph: the parameter tensors every part of the round reads."""
        p = RowParams.unpack(self.params)
        self.greedy, self.temperature, self.top_k, self.top_p = p.greedy, p.temperature, p.top_k, p.top_p

    def load(self, rows: Sequence["FusedRow"], chained: bool = False, params: bool = False, entering: int = 0,
             advance: int = 1) -> None:
        """Parameters, coins (every row's at its seed and draw, as the eager round draws them; a greedy or
        padding row's are drawn and unused) and the pending drafts' q; rows past the batch become greedy
        padding. ``chained``: the round after the one in flight (its draw numbers ``advance`` further, the
        forwards of the round in flight; the parameters stay unless ``params`` (its rows were compacted or rows
        join), and the q of its drafts is what the round in flight leaves in ``q_in``); its last ``entering`` rows
        join the chain (not in the round in flight: their draw numbers are their own, and so is the q of their
        drafts, copied in). A plain graph's step s draws at the draw number + s."""
        n, pad = len(rows), self.params.shape[0] - len(rows)
        if not chained or params:
            self.params.copy_(pack_rows([r.params for r in rows], n + pad), non_blocking=True)
        steps = self.noise.shape[0]
        ahead = [advance * (chained and i < n - entering) for i in range(n)]
        self.draws.copy_(torch.tensor([[r.params.seed for r in rows] + [0] * pad,
                                       [r.draw + a for r, a in zip(rows, ahead)] + [0] * pad]), non_blocking=True)
        if any(not r.params.greedy for r in rows):  # the batch's rows only: a padding row's coins go unread
            seeds, counters = self.draws[:, :n]
            coins.fill(self.uniforms[:n], seeds, counters, coins.Stream.ACCEPT)
            for step in range(steps):
                coins.fill(self.noise[step, :n], seeds, counters + step, coins.Stream.RECOVER, exponential=True)
        first = n - entering if chained else 0  # the rows whose q comes from the host
        if self.q_in is not None and first < n:  # one gather straight into the buffer
            torch.stack([self.zero_q if r.params.greedy or r.q is None else r.q for r in rows[first:]],
                        out=self.q_in[first:n])
