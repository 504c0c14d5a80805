"""Rotary position embedding in one launch: table lookup, rotation and cast, for queries and
keys side by side (``engine.models.llama.Attention`` rotates both in one pass).

Contract (Hugging Face's rotate-half layout, the engine's arithmetic): for token t at
position p = positions[t], with cos = cos_sin[p, :D/2] and sin = cos_sin[p, D/2:] (float32),
and the head's halves x1, x2 upcast to float32:
``out = cat(x1 * cos - x2 * sin, x2 * cos + x1 * sin)`` rounded to x's dtype. The compiler
may fuse a multiply and a subtract, so results agree to float32 rounding, not bit for bit.
Reference: ``rotary_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_launchable, check_tensor, pow2_at_least


def rotary_reference(
    x: torch.Tensor,          # [T, H, D] float32 / bfloat16 / float16
    positions: torch.Tensor,  # [T] int64
    cos_sin: torch.Tensor,    # [P, D] float32: cos in the first half, sin in the second
) -> torch.Tensor:            # [T, H, D] x's dtype
    cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


@triton.jit
def _rotary_kernel(
    x_ptr,        # [T, H, D], strided rows and heads, last dim contiguous
    pos_ptr,      # [T] int64
    cs_ptr,       # [P, D] float32, contiguous
    out_ptr,      # [T, H, D] contiguous
    stride_t, stride_h, H, HALF,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    live = cols < HALF
    p = tl.load(pos_ptr + t)
    cos = tl.load(cs_ptr + p * 2 * HALF + cols, mask=live, other=0.0)
    sin = tl.load(cs_ptr + p * 2 * HALF + HALF + cols, mask=live, other=0.0)
    base = x_ptr + t * stride_t + h * stride_h
    x1 = tl.load(base + cols, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF + cols, mask=live, other=0.0).to(tl.float32)
    out = out_ptr + (t * H + h) * 2 * HALF
    tl.store(out + cols, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=live)
    tl.store(out + HALF + cols, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=live)


def rotary(
    x: torch.Tensor,          # [T, H, D], e.g. queries and keys side by side
    positions: torch.Tensor,  # [T] int64, each in [0, P)
    cos_sin: torch.Tensor,    # [P, D] float32
) -> torch.Tensor:            # [T, H, D] contiguous, x's dtype
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"x must be a [T, H, D] tensor, got {getattr(x, 'shape', type(x).__name__)}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    t, h, d = x.shape
    if d % 2:
        raise ValueError(f"x's head dimension must be even, got {d}")
    check_tensor("positions", positions, torch.int64, (t,), x.device)
    check_tensor("cos_sin", cos_sin, torch.float32, (None, d), x.device)
    check_launchable(_rotary_kernel, x.device)
    if x.stride(2) != 1:
        x = x.contiguous()
    out = torch.empty((t, h, d), dtype=x.dtype, device=x.device)
    if t and h:
        _rotary_kernel[(t, h)](x, positions.contiguous(), cos_sin.contiguous(), out, x.stride(0), x.stride(1), h,
                               d // 2, BLOCK=pow2_at_least(d // 2))
    return out
