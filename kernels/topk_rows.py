"""The ``b`` largest entries of each row over a large vocabulary (b small: a draft tree's children per node), split
across programs: one launch (and a memset).

torch's topk over SmolLM2's 49,152 logits runs a radix select over each row; a draft tree's round takes one per
depth. Here each program takes ``BLOCK`` columns of a row and stores its own ``b`` best (value, index) pairs, and
the last program of the row to finish (an acq_rel ticket per row, as ``kernels.argmax_rows``) picks the row's ``b``
best of those partials. Order: largest first, ties to the lowest index, so the first column is exactly
``argmax_rows``'s pick (a tree's first path is the chain a greedy drafter makes). NaN is outside the contract.
Reference: ``topk_rows_reference`` (a stable descending sort).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_int, check_launchable, check_tensor, pow2_at_least

BLOCK = 2048  # columns per program


def topk_rows_reference(
    x: torch.Tensor,  # [R, V] float32, bfloat16 or float16
    b: int,
) -> torch.Tensor:    # [R, b] int64
    return x.float().sort(dim=-1, descending=True, stable=True).indices[:, :b]


@triton.jit
def _best(vals, idxs, live, V, out_v_ptr, out_i_ptr, B: tl.constexpr):
    """Store the B best (value, lowest index first on ties) of the live entries, best first."""
    for i in tl.static_range(B):
        top = tl.max(tl.where(live, vals, float("-inf")), axis=0)
        pick = tl.min(tl.where(live & (vals == top), idxs, V), axis=0)
        tl.store(out_v_ptr + i, top)
        tl.store(out_i_ptr + i, pick.to(tl.int64))
        live = live & (idxs != pick)


@triton.jit
def _topk_rows_kernel(
    x_ptr,       # [R, V] float32 or 16-bit (compared in float32, which holds it exactly), row stride stride_x
    val_ptr,     # [R, NB * B] float32 scratch: each program's B best values
    idx_ptr,     # [R, NB * B] int64 scratch: their indices
    ticket_ptr,  # [R] int32, zero before the launch
    out_ptr,     # [R, B] int64
    V, stride_x, chunks,
    B: tl.constexpr,
    BLOCK: tl.constexpr,
    NB: tl.constexpr,  # power of two >= chunks * B
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    live = cols < V
    x = tl.load(x_ptr + row * stride_x + cols, mask=live, other=float("-inf")).to(tl.float32)
    part = row * NB + chunk * B
    _best(x, cols, live, V, val_ptr + part, idx_ptr + part, B)
    tl.debug_barrier()  # the partials are stored before the ticket releases them
    if tl.atomic_add(ticket_ptr + row, 1, sem="acq_rel") == chunks - 1:  # the row's last program
        j = tl.arange(0, NB)
        mine = j < chunks * B
        vals = tl.load(val_ptr + row * NB + j, mask=mine, other=float("-inf"), cache_modifier=".cg")
        idxs = tl.load(idx_ptr + row * NB + j, mask=mine, other=V, cache_modifier=".cg")
        _best(vals, idxs, mine & (idxs < V), V, val_ptr + row * NB, out_ptr + row * B, B)


def topk_rows(
    x: torch.Tensor,  # [R, V] float32, bfloat16 or float16 (columns contiguous)
    b: int,           # 1 <= b <= min(V, BLOCK)
) -> torch.Tensor:    # [R, b] int64: each row's b largest, largest first, ties to the lowest index
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x must be a float32, bfloat16 or float16 tensor, got {getattr(x, 'dtype', type(x))}")
    check_tensor("x", x, x.dtype, (None, None))
    r, v = x.shape
    check_int("b", b, 1)
    if b > min(v, BLOCK):
        raise ValueError(f"b must be at most min(columns, {BLOCK}) = {min(v, BLOCK)}, got {b}")
    if v > 1 and x.stride(1) != 1:
        raise ValueError(f"x must have contiguous columns, got strides {list(x.stride())}")
    dev = x.device
    check_launchable(_topk_rows_kernel, dev)
    out = torch.empty((r, b), dtype=torch.int64, device=dev)
    if r:
        chunks = triton.cdiv(v, BLOCK)
        nb = pow2_at_least(chunks * b)
        val = torch.empty((r, nb), dtype=torch.float32, device=dev)
        idx = torch.empty((r, nb), dtype=torch.int64, device=dev)
        ticket = torch.zeros((r,), dtype=torch.int32, device=dev)
        _topk_rows_kernel[(r, chunks)](x, val, idx, ticket, out, v, x.stride(0), chunks, B=b, BLOCK=BLOCK, NB=nb)
    return out
