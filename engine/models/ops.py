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


def use_kernels(x: torch.Tensor) -> bool:
    """Triton for this tensor: on CUDA and outside autograd."""
    return x.is_cuda and not torch.is_grad_enabled()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, D] -> [T, D]: float32 statistics, rounded to x's dtype, times the weight."""
    if use_kernels(x):
        from kernels.rmsnorm import rmsnorm

        return rmsnorm(x, weight, eps)
    dtype = x.dtype
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


def rms_norm_pair(a: torch.Tensor, weight_a: torch.Tensor, b: torch.Tensor, weight_b: torch.Tensor, eps: float
                  ) -> torch.Tensor:
    """a, b: [T, D] -> [T, 2D]: rms_norm(a, weight_a) beside rms_norm(b, weight_b) (an EAGLE head's input)."""
    if use_kernels(a):
        from kernels.rmsnorm import rmsnorm_pair

        return rmsnorm_pair(a, weight_a, b, weight_b, eps)
    return torch.cat([rms_norm(a, weight_a, eps), rms_norm(b, weight_b, eps)], dim=-1)


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


ARGMAX_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what kernels.argmax_rows reads


def argmax(x: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
    """x: [..., V] float32, or 16-bit as it leaves an LM head -> [...] int64, the first index of each row's maximum;
    with ``noise`` (x's shape) of ``x / noise`` (the exponential race). On CUDA one launch over many programs a row
    (torch's argmax reduces a row in one block: ~12 µs over a 49k vocabulary on an H100)."""
    if use_kernels(x) and x.dtype in ARGMAX_DTYPES and (noise is None or noise.shape == x.shape):
        from kernels.argmax_rows import argmax_rows

        v = x.shape[-1]
        flat = argmax_rows(x.reshape(-1, v), None if noise is None else noise.reshape(-1, v).float())
        return flat.view(x.shape[:-1])
    return (x if noise is None else x / noise).argmax(dim=-1)


def topk(x: torch.Tensor, b: int) -> torch.Tensor:
    """x: [R, V] as ``argmax`` takes it -> [R, b] int64, each row's b largest, largest first. On CUDA one launch over
    many programs a row, ties to the lowest index (so column 0 is ``argmax``'s pick); elsewhere torch's topk."""
    if use_kernels(x) and x.dtype in ARGMAX_DTYPES:
        from kernels.topk_rows import topk_rows

        return topk_rows(x, b)
    return torch.topk(x, b, dim=-1).indices


CPU_VOCAB_SLICE = 2048  # rows of an LM head's weight per matmul on the CPU


def lm_head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden: [..., H]; weight: [V, H] -> logits [..., V] in weight's dtype. On the CPU in slices of
    ``CPU_VOCAB_SLICE`` vocabulary rows: one sgemm over a whole 49k x 576 head reads the weight at ~5 GB/s on one
    core (4-20 rows), a slice at a time ~1.3-1.6x faster; each logit is the same dot product (the same bits where
    measured; tests/engine/test_model.py holds it to float32 rounding and the same argmax). Elsewhere (CUDA) one
    matmul."""
    if not hidden.is_cpu or weight.shape[0] <= CPU_VOCAB_SLICE:
        return F.linear(hidden, weight)
    return torch.cat([F.linear(hidden, w) for w in weight.split(CPU_VOCAB_SLICE)], dim=-1)
