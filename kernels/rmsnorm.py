"""RMSNorm in one launch: what ``engine.models.layers.RMSNorm`` does in about eight.

Contract (the engine's arithmetic, step by step): the row is upcast to float32, scaled by
``rsqrt(mean(x^2) + eps)``, rounded back to the input dtype, then multiplied by the weight in
that dtype. The sum of squares is reduced in another order than torch's, so results agree
to float32 rounding, not bit for bit. Reference: ``rmsnorm_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_launchable, check_tensor, pow2_at_least

MAX_DIM = 16384  # one program holds a whole row


def check_rows(name: str, x: object) -> tuple[int, int]:
    """What the norm kernels take: a [T, D] float32 / bfloat16 / float16 tensor, 1 <= D <= MAX_DIM -> (T, D)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"{name} must be a [T, D] tensor, got {getattr(x, 'shape', type(x).__name__)}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {x.dtype}")
    t, d = x.shape
    if not 1 <= d <= MAX_DIM:
        raise ValueError(f"{name}'s last dimension must be in [1, {MAX_DIM}], got {d}")
    return t, d


def check_eps(eps: object) -> None:
    if not (isinstance(eps, float) and eps > 0):
        raise ValueError(f"eps must be a float > 0, got {eps!r}")


def rmsnorm_reference(
    x: torch.Tensor,       # [T, D] float32 / bfloat16 / float16
    weight: torch.Tensor,  # [D] same dtype as x
    eps: float,
) -> torch.Tensor:         # [T, D] x's dtype
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@triton.jit
def _rmsnorm_kernel(
    x_ptr,    # [T, D]
    w_ptr,    # [D]
    out_ptr,  # [T, D] contiguous
    stride_x, D, eps,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    live = cols < D
    x = tl.load(x_ptr + row * stride_x + cols, mask=live, other=0.0).to(tl.float32)
    scale = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    normed = (x * scale).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * D + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=live)


def rmsnorm(
    x: torch.Tensor,       # [T, D], rows may be strided; last dim contiguous
    weight: torch.Tensor,  # [D] same dtype and device as x
    eps: float,
) -> torch.Tensor:         # [T, D] contiguous, x's dtype
    t, d = check_rows("x", x)
    check_tensor("weight", weight, x.dtype, (d,), x.device)
    check_eps(eps)
    check_launchable(_rmsnorm_kernel, x.device)
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty((t, d), dtype=x.dtype, device=x.device)
    if t:
        _rmsnorm_kernel[(t,)](x, weight.contiguous(), out, x.stride(0), d, eps, BLOCK=pow2_at_least(d))
    return out


def rmsnorm_pair_reference(
    a: torch.Tensor,         # [T, D]
    weight_a: torch.Tensor,  # [D] a's dtype
    b: torch.Tensor,         # [T, D] a's dtype
    weight_b: torch.Tensor,  # [D] a's dtype
    eps: float,
) -> torch.Tensor:           # [T, 2D]: rmsnorm(a), then rmsnorm(b)
    return torch.cat([rmsnorm_reference(a, weight_a, eps), rmsnorm_reference(b, weight_b, eps)], dim=-1)


@triton.jit
def _rmsnorm_pair_kernel(
    a_ptr, wa_ptr,  # [T, D] strided rows, [D]
    b_ptr, wb_ptr,  # [T, D] strided rows, [D]
    out_ptr,        # [T, 2D] contiguous
    stride_a, stride_b, D, eps,
    BLOCK: tl.constexpr,
):
    """Program (row, half): half 0 norms a's row into out[row, :D], half 1 b's into out[row, D:], each with
    ``_rmsnorm_kernel``'s arithmetic (so a half equals what that kernel gives, bit for bit)."""
    row = tl.program_id(0).to(tl.int64)
    half = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    live = cols < D
    if half == 0:
        x = tl.load(a_ptr + row * stride_a + cols, mask=live, other=0.0).to(tl.float32)
        w = tl.load(wa_ptr + cols, mask=live, other=0.0).to(tl.float32)
    else:
        x = tl.load(b_ptr + row * stride_b + cols, mask=live, other=0.0).to(tl.float32)
        w = tl.load(wb_ptr + cols, mask=live, other=0.0).to(tl.float32)
    scale = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    normed = (x * scale).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * 2 * D + half * D + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=live)


def rmsnorm_pair(
    a: torch.Tensor,         # [T, D], rows may be strided; last dim contiguous
    weight_a: torch.Tensor,  # [D] a's dtype and device
    b: torch.Tensor,         # [T, D] a's dtype and device
    weight_b: torch.Tensor,  # [D]
    eps: float,
) -> torch.Tensor:           # [T, 2D] contiguous: [rmsnorm(a), rmsnorm(b)], one launch instead of three
    t, d = check_rows("a", a)
    check_tensor("b", b, a.dtype, (t, d), a.device)
    check_tensor("weight_a", weight_a, a.dtype, (d,), a.device)
    check_tensor("weight_b", weight_b, a.dtype, (d,), a.device)
    check_eps(eps)
    check_launchable(_rmsnorm_pair_kernel, a.device)
    a = a if a.stride(1) == 1 else a.contiguous()
    b = b if b.stride(1) == 1 else b.contiguous()
    out = torch.empty((t, 2 * d), dtype=a.dtype, device=a.device)
    if t:
        _rmsnorm_pair_kernel[(t, 2)](a, weight_a.contiguous(), b, weight_b.contiguous(), out, a.stride(0),
                                     b.stride(0), d, eps, BLOCK=pow2_at_least(d))
    return out
