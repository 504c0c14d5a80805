"""The element-wise steps of a forward that fuse: each one op here, two implementations.

On CUDA at inference (autograd off) each is one Triton launch from ``kernels/``; everywhere
else (the CPU, and training, where autograd records) it is the plain torch arithmetic the
kernels are tested against. Both compute the same thing to float32 rounding. The choice
depends only on where the tensor lives and whether gradients are wanted, never on a flag
set at runtime; ``kernels`` (and so triton) is imported only when a kernel runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


SMALL_ROWS = 16  # a projection of at most this many rows takes the step before it into its launch
# (kernels.norm_linear.MAX_ROWS; tests check they agree): above, cuBLAS with the step apart is faster


def use_kernels(x: torch.Tensor) -> bool:
    """Triton for this tensor: on CUDA and outside autograd."""
    return x.is_cuda and not torch.is_grad_enabled()


def _small(x: torch.Tensor) -> bool:
    return use_kernels(x) and 0 < x.shape[0] <= SMALL_ROWS


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, D] -> [T, D]: float32 statistics, rounded to x's dtype, times the weight."""
    if use_kernels(x):
        from kernels.rmsnorm import rmsnorm

        return rmsnorm(x, weight, eps)
    dtype = x.dtype
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """x, delta: [T, D] -> (x + delta, rms_norm(x + delta)): the residual stream and its normed rows."""
    if use_kernels(x):
        from kernels.fused_norm import add_rmsnorm

        return add_rmsnorm(x, delta, weight, eps)
    x = x + delta
    return x, rms_norm(x, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2I] (gate, then up) -> silu(gate) * up [T, I]."""
    if use_kernels(gate_up):
        from kernels.silu_mul import silu_mul as kernel

        return kernel(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def add_norm_linear(x: torch.Tensor, delta: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                    weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x, delta: [T, D] -> (residual x + delta (x without delta), linear(rms_norm(residual))): one launch at
    decode sizes (kernels.norm_linear), two steps elsewhere."""
    if _small(x):
        from kernels.norm_linear import add_norm_linear as kernel

        return kernel(x, delta, norm_weight, eps, weight, bias)
    x, h = (x, rms_norm(x, norm_weight, eps)) if delta is None else add_rms_norm(x, delta, norm_weight, eps)
    return x, F.linear(h, weight, bias)


def silu_mul_linear(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2I] -> linear(silu(gate) * up) [T, out]: one launch at decode sizes, two elsewhere."""
    if _small(gate_up):
        from kernels.norm_linear import silu_mul_linear as kernel

        return kernel(gate_up, weight)
    return F.linear(silu_mul(gate_up), weight)
