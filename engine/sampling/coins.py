"""Every random draw of a request, as a pure function of its seed: counter-based streams.

A sampled request's coins come from Philox4x32-10 keyed by its seed (``kernels/philox.py``) at
counter (column, the request's draw number, ``Stream``). Nothing holds generator state: a
request only counts its draws (``Request.draws`` for the target's coins, the drafter's own
count for its noise), so

- the coins of a whole batch are one launch per kind (acceptance uniforms, recovered / bonus
  noise, draft noise), not two launches from Python per sampled row;
- the eager round and the fused round's buffers draw the same numbers for the same (seed, draw),
  whatever the batch, the k of the batch or the path a round took.

On CUDA the Triton kernel fills the buffer (random numbers carry no gradient, so autograd's
state does not matter: the reference on a GPU would be ~200 launches); elsewhere the torch
reference (the same words; tests/kernels checks they agree), so a CPU run is reproducible too.
"""

from __future__ import annotations

import enum
from typing import Sequence

import torch

from engine.upload import upload
from kernels.philox_ref import random_rows_reference


class Stream(enum.IntEnum):
    """Which of a request's streams a draw comes from (the Philox counter's last word)."""

    ACCEPT = 0   # the target's acceptance coins: one uniform per draft position
    RECOVER = 1  # the target's recovered / bonus draw: one row of Exponential(1) noise
    DRAFT = 2    # the drafter's noise: one row per draft step (column offset step * V)


def fill(out: torch.Tensor,       # [R, N] float32, written in place (columns contiguous)
         seeds: torch.Tensor,     # [R] int64 on out's device
         counters: torch.Tensor,  # [R] int64 on out's device: each row's draw number
         stream: Stream, col0: int = 0, exponential: bool = False) -> torch.Tensor:
    """Each row's draws at its (seed, counter) for columns col0 .. col0 + N - 1; uniforms in (0, 1), or
    Exponential(1) noise. Returns ``out``."""
    if out.is_cuda:
        from kernels.philox import random_rows

        return random_rows(out, seeds, counters, int(stream), col0, exponential)
    return out.copy_(random_rows_reference(seeds, counters, int(stream), out.shape[1], col0, exponential))


def draw(seeds: Sequence[int], counters: Sequence[int], cols: int, stream: Stream, device: torch.device,
         col0: int = 0, exponential: bool = False) -> torch.Tensor:  # [len(seeds), cols] float32
    """``fill`` into a new tensor, for rows given on the host."""
    ids = upload([list(seeds), list(counters)], device)
    return fill(torch.empty(len(seeds), cols, device=device), ids[0], ids[1], stream, col0, exponential)
