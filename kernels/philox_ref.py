"""The torch reference of ``kernels/philox.py``, importable without triton (the engine's CPU path).

Philox4x32-10 (Salmon et al., SC'11) on int64 tensors holding 32-bit words. Checked against the
Random123 known-answer vectors in tests/kernels.
"""

from __future__ import annotations

import torch

# round multipliers and key increments
M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
MASK32 = 0xFFFFFFFF


def philox_reference(k0: torch.Tensor, k1: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor,
                     c2: torch.Tensor, c3: torch.Tensor) -> torch.Tensor:
    """Broadcastable int64 tensors holding uint32 words -> the first output word (int64 in [0, 2**32)).

    A 32 x 32-bit product wraps in int64 to its low 64 bits, which is all it has: its high word is
    ``(p >> 32) & MASK32`` (the arithmetic shift only sign-extends past bit 63) and its low word ``p & MASK32``.
    Every round but the first works in place on the words the round before made (the CPU's sampled rounds run
    this over [rows, vocabulary]: a fresh tensor per operation costs twice the time); the inputs are never written.
    """
    for r in range(ROUNDS):
        p0, p1 = (c0 * M0, c2 * M1) if r == 0 else (c0.mul_(M0), c2.mul_(M1))
        hi1 = _xor(_xor((p1 >> 32).bitwise_and_(MASK32), c1), k0)
        hi0 = _xor(_xor((p0 >> 32).bitwise_and_(MASK32), c3), k1)
        c0, c1, c2, c3 = hi1, p1.bitwise_and_(MASK32), hi0, p0.bitwise_and_(MASK32)
        k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
    return c0


def _xor(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a ^ b, into ``a`` (one of this module's own) where it has the broadcast shape."""
    return a.bitwise_xor_(b) if a.shape == torch.broadcast_shapes(a.shape, b.shape) else a ^ b


def random_rows_reference(
    seeds: torch.Tensor,     # [R] int64 in [0, 2**63)
    counters: torch.Tensor,  # [R] int64 >= 0: the draw each row is at
    stream: int,
    cols: int,
    col0: int = 0,
    exponential: bool = False,
) -> torch.Tensor:           # [R, cols] float32
    s = seeds.long().unsqueeze(1)
    n = counters.long().unsqueeze(1)
    col = (col0 + torch.arange(cols, device=seeds.device, dtype=torch.long)).unsqueeze(0)
    x = philox_reference(s & MASK32, s >> 32, col & MASK32, n & MASK32, n >> 32,
                         torch.full_like(s, stream & MASK32))
    u = ((x >> 9).float() + 0.5) * 2.0 ** -23
    return -torch.log(u) if exponential else u
