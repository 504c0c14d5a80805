"""Residual add + RMSNorm in one launch: what a decoder layer does between its two halves.

Contract (the engine's arithmetic): ``residual = x + delta`` rounded to x's dtype (what a
torch add in that dtype gives), then ``normed = rmsnorm(residual)`` exactly as
``kernels.rmsnorm`` (float32 statistics, rounded, times the weight). Both are returned: the
residual stream goes on, the normed rows feed the next projection. Reference:
``add_rmsnorm_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_launchable, check_tensor, pow2_at_least
from kernels.rmsnorm import check_eps, check_rows, rmsnorm_reference


def add_rmsnorm_reference(
    x: torch.Tensor,       # [T, D] float32 / bfloat16 / float16
    delta: torch.Tensor,   # [T, D] x's dtype
    weight: torch.Tensor,  # [D] x's dtype
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # residual [T, D], normed [T, D]
    residual = x + delta
    return residual, rmsnorm_reference(residual, weight, eps)


@triton.jit
def _add_rmsnorm_kernel(
    x_ptr, d_ptr,          # [T, D] each, strided rows, last dim contiguous
    w_ptr,                 # [D]
    res_ptr, out_ptr,      # [T, D] contiguous
    stride_x, stride_d, D, eps,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    live = cols < D
    x = tl.load(x_ptr + row * stride_x + cols, mask=live, other=0.0).to(tl.float32)
    d = tl.load(d_ptr + row * stride_d + cols, mask=live, other=0.0).to(tl.float32)
    res = (x + d).to(res_ptr.dtype.element_ty)
    tl.store(res_ptr + row * D + cols, res, mask=live)
    r = res.to(tl.float32)
    scale = 1.0 / tl.sqrt(tl.sum(r * r, axis=0) / D + eps)
    normed = (r * scale).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * D + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=live)


def add_rmsnorm(
    x: torch.Tensor,       # [T, D] rows may be strided; last dim contiguous
    delta: torch.Tensor,   # [T, D] x's dtype and device
    weight: torch.Tensor,  # [D] x's dtype and device
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # residual [T, D], normed [T, D]: contiguous, x's dtype
    t, d = check_rows("x", x)
    check_tensor("delta", delta, x.dtype, (t, d), x.device)
    check_tensor("weight", weight, x.dtype, (d,), x.device)
    check_eps(eps)
    check_launchable(_add_rmsnorm_kernel, x.device)
    x = x if x.stride(1) == 1 else x.contiguous()
    delta = delta if delta.stride(1) == 1 else delta.contiguous()
    residual = torch.empty((t, d), dtype=x.dtype, device=x.device)
    out = torch.empty((t, d), dtype=x.dtype, device=x.device)
    if t:
        _add_rmsnorm_kernel[(t,)](x, delta, weight.contiguous(), residual, out, x.stride(0), delta.stride(0), d, eps,
                                  BLOCK=pow2_at_least(d))
    return residual, out
