"""Counter-based random numbers for every row of a batch in one launch (Philox4x32-10).

A request's random stream is a pure function of (its seed, a stream id, a draw counter, a
column): ``out[r, c]`` is Philox4x32-10 keyed by ``seeds[r]`` (two 32-bit words), with counter
words ``(col0 + c, counters[r] low, counters[r] high, stream)``, first output word. So the
coins of a round for a whole batch are one launch (before: two ``torch.Generator`` draws per
sampled row, each a launch from Python), and a request's draws depend only on its own seed
and counter, never on which requests share the batch.

The word becomes a float32 uniform strictly inside (0, 1): ``((x >> 9) + 0.5) * 2**-23`` (23
bits, exact in float32, never 0 or 1), or, with ``exponential``, Exponential(1) noise
``-log(u)`` (finite and > 0). Reference: ``random_rows_reference`` (``kernels/philox_ref.py``, torch
only), bit-exact for the uniforms; the exponential agrees to float32 rounding of the log.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_int, check_launchable, check_tensor
from kernels.philox_ref import MASK32, ROUNDS, random_rows_reference  # noqa: F401  (the reference)

BLOCK = 1024  # columns per program


# ---------------------------------------------------------------------------------------- kernel
@triton.jit
def _philox_kernel(
    out_ptr,       # [R, N] float32, row stride out_stride
    seeds_ptr,     # [R] int64
    counters_ptr,  # [R] int64
    out_stride, N, col0, stream,
    EXPONENTIAL: tl.constexpr,
    ROUNDS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = cols < N
    seed = tl.load(seeds_ptr + row)  # int64 >= 0: the shifts and masks below stay in range
    n = tl.load(counters_ptr + row)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = (seed >> 32).to(tl.uint32)
    c0 = (cols + col0).to(tl.uint32)
    zero = tl.zeros([BLOCK], dtype=tl.int64)
    c1 = (zero + (n & 0xFFFFFFFF)).to(tl.uint32)
    c2 = (zero + (n >> 32)).to(tl.uint32)
    c3 = (zero + stream).to(tl.uint32)
    for _ in tl.static_range(ROUNDS):
        a0 = c0
        a2 = c2
        c0 = tl.umulhi(a2, 0xCD9E8D57) ^ c1 ^ k0  # M1
        c1 = a2 * 0xCD9E8D57
        c2 = tl.umulhi(a0, 0xD2511F53) ^ c3 ^ k1  # M0
        c3 = a0 * 0xD2511F53
        k0 = k0 + 0x9E3779B9                      # W0
        k1 = k1 + 0xBB67AE85                      # W1
    u = ((c0 >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23
    if EXPONENTIAL:
        u = -tl.log(u)
    tl.store(out_ptr + row * out_stride + cols, u, mask=live)


def random_rows(
    out: torch.Tensor,       # [R, N] float32 (rows may be strided; columns contiguous): written in place
    seeds: torch.Tensor,     # [R] int64 in [0, 2**63)
    counters: torch.Tensor,  # [R] int64 >= 0
    stream: int,
    col0: int = 0,
    exponential: bool = False,
) -> torch.Tensor:
    """Fill ``out`` as ``random_rows_reference(seeds, counters, stream, N, col0, exponential)``; returns it."""
    check_tensor("out", out, torch.float32, (None, None))
    r, n = out.shape
    dev = out.device
    if n > 1 and out.stride(1) != 1:
        raise ValueError(f"out must have contiguous columns, got strides {list(out.stride())}")
    check_tensor("seeds", seeds, torch.int64, (r,), dev)
    check_tensor("counters", counters, torch.int64, (r,), dev)
    check_int("stream", stream, 0)
    check_int("col0", col0, 0)
    if stream > MASK32 or col0 + n > 2**31:
        raise ValueError(f"stream must fit 32 bits and col0 + columns 31, got stream {stream}, col0 {col0}, {n} columns")
    check_launchable(_philox_kernel, dev)
    if r and n:
        _philox_kernel[(r, triton.cdiv(n, BLOCK))](
            out, seeds.contiguous(), counters.contiguous(), out.stride(0), n, col0, stream,
            EXPONENTIAL=exponential, ROUNDS=ROUNDS, BLOCK=BLOCK)
    return out
