"""The argmax of each row over a large vocabulary, split across programs: one launch (and a memset).

torch's argmax reduces a row in one thread block: over SmolLM2's 49,152 logits that is ~12 µs on
an H100 whatever the batch, and a speculative round takes 5 (the verify and four draft steps; 10
when sampling, where the exponential race ``argmax(probs / noise)`` is one more per step). Here
each program takes ``BLOCK`` columns of a row, stores its best (value, first index), and the last
program of the row to finish (an acq_rel ticket per row) picks the best of those partials.

``noise`` given: the exponential race ``argmax(x / noise)`` in the same pass, the division IEEE
round-to-nearest (``div_rn``) as torch's. Ties go to the lowest index, as torch's argmax; NaN is
outside the contract. Reference: ``argmax_rows_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_launchable, check_tensor, pow2_at_least

BLOCK = 2048  # columns per program


def argmax_rows_reference(
    x: torch.Tensor,                   # [R, V] float32, bfloat16 or float16
    noise: torch.Tensor | None = None,  # [R, V] float32 > 0
) -> torch.Tensor:                     # [R] int64
    return (x if noise is None else x / noise).argmax(dim=-1)


@triton.jit
def _argmax_rows_kernel(
    x_ptr,       # [R, V] float32 or 16-bit (compared in float32, which holds it exactly), row stride stride_x
    noise_ptr,   # [R, V] float32, row stride stride_n (unused without HAS_NOISE)
    val_ptr,     # [R, NB] float32 scratch: each program's best value
    idx_ptr,     # [R, NB] int64 scratch: its first index
    ticket_ptr,  # [R] int32, zero before the launch
    out_ptr,     # [R] int64
    V, stride_x, stride_n, chunks,
    HAS_NOISE: tl.constexpr,
    BLOCK: tl.constexpr,
    NB: tl.constexpr,  # power of two >= chunks
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    live = cols < V
    x = tl.load(x_ptr + row * stride_x + cols, mask=live, other=float("-inf")).to(tl.float32)
    if HAS_NOISE:
        n = tl.load(noise_ptr + row * stride_n + cols, mask=live, other=1.0)
        x = tl.math.div_rn(x, n)
    best = tl.max(x, axis=0)
    first = tl.min(tl.where((x == best) & live, cols, V), axis=0).to(tl.int64)
    tl.store(val_ptr + row * NB + chunk, best)
    tl.store(idx_ptr + row * NB + chunk, first)
    tl.debug_barrier()  # the partials are stored before the ticket releases them
    if tl.atomic_add(ticket_ptr + row, 1, sem="acq_rel") == chunks - 1:  # the row's last program
        j = tl.arange(0, NB)
        mine = j < chunks
        vals = tl.load(val_ptr + row * NB + j, mask=mine, other=float("-inf"), cache_modifier=".cg")
        idxs = tl.load(idx_ptr + row * NB + j, mask=mine, other=V, cache_modifier=".cg")
        top = tl.max(vals, axis=0)
        tl.store(out_ptr + row, tl.min(tl.where((vals == top) & mine, idxs, V), axis=0))


def argmax_rows(
    x: torch.Tensor,                    # [R, V] float32, bfloat16 or float16 (columns contiguous)
    noise: torch.Tensor | None = None,  # [R, V] float32 > 0 (columns contiguous): the exponential race
) -> torch.Tensor:                      # [R] int64
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x must be a float32, bfloat16 or float16 tensor, got {getattr(x, 'dtype', type(x))}")
    check_tensor("x", x, x.dtype, (None, None))
    r, v = x.shape
    dev = x.device
    if v < 1:
        raise ValueError(f"x must have at least one column, got {list(x.shape)}")
    if v > 1 and x.stride(1) != 1:
        raise ValueError(f"x must have contiguous columns, got strides {list(x.stride())}")
    if noise is not None:
        check_tensor("noise", noise, torch.float32, (r, v), dev)
        if v > 1 and noise.stride(1) != 1:
            raise ValueError(f"noise must have contiguous columns, got strides {list(noise.stride())}")
    check_launchable(_argmax_rows_kernel, dev)
    out = torch.empty((r,), dtype=torch.int64, device=dev)
    if r:
        chunks = triton.cdiv(v, BLOCK)
        nb = pow2_at_least(chunks)
        val = torch.empty((r, nb), dtype=torch.float32, device=dev)
        idx = torch.empty((r, nb), dtype=torch.int64, device=dev)
        ticket = torch.zeros((r,), dtype=torch.int32, device=dev)
        _argmax_rows_kernel[(r, chunks)](
            x, x if noise is None else noise, val, idx, ticket, out, v, x.stride(0),
            0 if noise is None else noise.stride(0), chunks, HAS_NOISE=noise is not None, BLOCK=BLOCK, NB=nb)
    return out
