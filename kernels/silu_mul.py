"""SwiGLU's gate in one launch: ``silu(gate) * up`` from the fused gate/up projection.

Contract (the engine's arithmetic, ``torch.nn.functional.silu(gate) * up`` in the input dtype):
silu is computed in float32 and rounded to the input dtype, then multiplied by ``up`` and
rounded again. Reference: ``silu_mul_reference``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import check_launchable

BLOCK = 1024  # columns per program


def silu_mul_reference(
    gate_up: torch.Tensor,  # [T, 2I]: gate in the first half, up in the second
) -> torch.Tensor:          # [T, I] gate_up's dtype
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@triton.jit
def _silu_mul_kernel(
    x_ptr,    # [T, 2I] strided rows, last dim contiguous
    out_ptr,  # [T, I] contiguous
    stride_x, I,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = cols < I
    g = tl.load(x_ptr + row * stride_x + cols, mask=live, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + I + cols, mask=live, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * I + cols, (act * u).to(out_ptr.dtype.element_ty), mask=live)


def silu_mul(
    gate_up: torch.Tensor,  # [T, 2I] rows may be strided; last dim contiguous
) -> torch.Tensor:          # [T, I] contiguous, gate_up's dtype
    if not isinstance(gate_up, torch.Tensor) or gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be a [T, 2I] tensor, got {getattr(gate_up, 'shape', type(gate_up).__name__)}")
    if gate_up.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"gate_up must be float32, bfloat16 or float16, got {gate_up.dtype}")
    check_launchable(_silu_mul_kernel, gate_up.device)
    x = gate_up if gate_up.stride(1) == 1 else gate_up.contiguous()
    t, i = x.shape[0], x.shape[1] // 2
    out = torch.empty((t, i), dtype=x.dtype, device=x.device)
    if t and i:
        _silu_mul_kernel[(t, triton.cdiv(i, BLOCK))](x, out, x.stride(0), i, BLOCK=BLOCK)
    return out
