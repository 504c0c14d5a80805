"""A projection of few rows with the step before it in the same launch: ``y = prologue(x) @ W^T (+ bias)``.

At decode sizes (a handful of rows) a projection is one small launch that waits on memory, and the
element-wise step in front of it (the residual add + RMSNorm before q/k/v and gate/up, SwiGLU's
``silu(gate) * up`` before down) is a second one. Here every program recomputes the prologue for
its chunk of K and multiplies it by its ``BLOCK_N`` rows of W, so the step costs no launch and its
output never goes through memory (only the residual stream, stored once by the first column block).

Prologues, with the engine's arithmetic (what the separate kernels and torch compute):
- ``"norm"``: ``residual = x + delta`` rounded to x's dtype (no delta: x), ``normed = rmsnorm(residual)``
  as ``kernels.rmsnorm`` (float32 statistics, rounded, times the weight, rounded); returns
  (residual, normed @ W^T): ``add_norm_linear``;
- ``"silu_mul"``: x is ``[M, 2K]`` (gate, up); ``silu(gate)`` in float32 rounded, times up, rounded,
  as ``kernels.silu_mul``: ``silu_mul_linear``.
The products are exact and accumulate in float32 (``tl.dot``: tf32 for 16-bit inputs, which tf32 holds
exactly; IEEE for float32 inputs, as torch's default matmul) and round once to x's dtype. Accumulation order differs from cuBLAS, so results agree to that
rounding, not bit for bit. References: ``add_norm_linear_reference``, ``silu_mul_linear_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_launchable, check_tensor
from kernels.fused_norm import add_rmsnorm_reference
from kernels.rmsnorm import rmsnorm_reference
from kernels.silu_mul import silu_mul_reference

MAX_ROWS = 16  # rows the kernel is for: above, one tensor-core GEMM (cuBLAS) with the step apart is faster
# launch configuration (bench/norm_linear_sweep.py measures the alternatives): dot: tensor-core tiles of 16 rows
# (rows past M masked), else products on the CUDA cores for the next power of two >= M rows
CONFIG = dict(dot=True, block_n=16, block_k=128, num_warps=4)
NORM, SILU_MUL = 1, 2


def add_norm_linear_reference(
    x: torch.Tensor,             # [M, K]
    delta: torch.Tensor | None,  # [M, K] x's dtype, or None: no residual add
    norm_weight: torch.Tensor,   # [K]
    eps: float,
    weight: torch.Tensor,        # [N, K]
    bias: torch.Tensor | None,   # [N] or None
) -> tuple[torch.Tensor, torch.Tensor]:  # residual [M, K], y [M, N]
    if delta is None:
        residual, normed = x, rmsnorm_reference(x, norm_weight, eps)
    else:
        residual, normed = add_rmsnorm_reference(x, delta, norm_weight, eps)
    return residual, torch.nn.functional.linear(normed, weight, bias)


def silu_mul_linear_reference(
    gate_up: torch.Tensor,  # [M, 2K]
    weight: torch.Tensor,   # [N, K]
) -> torch.Tensor:          # [M, N]
    return torch.nn.functional.linear(silu_mul_reference(gate_up), weight)


@triton.jit
def _norm_linear_kernel(
    x_ptr, d_ptr,       # [M, K] (silu_mul: [M, 2K]) strided rows, last dim contiguous; d: the delta (norm)
    nw_ptr,             # [K] the norm's weight
    w_ptr,              # [N, K] contiguous
    b_ptr,              # [N] bias
    res_ptr,            # [M, K] contiguous: the residual stream (norm)
    y_ptr,              # [M, N] contiguous
    M, N, stride_x, stride_d, eps,
    K: tl.constexpr,  # a model has few widths: each its own specialization, its loop unrolled
    PROLOGUE: tl.constexpr, HAS_DELTA: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    live_m = rows < M
    live_n = cols < N
    ks = tl.arange(0, BLOCK_K)
    dtype = y_ptr.dtype.element_ty
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_x
    d_rows = d_ptr + rows.to(tl.int64)[:, None] * stride_d
    scale = tl.zeros([BLOCK_M], tl.float32)
    if PROLOGUE == 1:  # the row statistics first: a pass over the whole residual row
        ss = tl.zeros([BLOCK_M], tl.float32)
        for k0 in tl.static_range(0, K, BLOCK_K):
            kk = k0 + ks
            mask = live_m[:, None] & (kk < K)[None, :]
            r = tl.load(x_rows + kk[None, :], mask=mask, other=0.0)
            if HAS_DELTA:
                r = (r.to(tl.float32) + tl.load(d_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32)).to(dtype)
            r = r.to(tl.float32)
            ss += tl.sum(r * r, axis=1)
        scale = 1.0 / tl.sqrt(ss / K + eps)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * K
    for k0 in tl.static_range(0, K, BLOCK_K):
        kk = k0 + ks
        live_k = kk < K
        mask = live_m[:, None] & live_k[None, :]
        if PROLOGUE == 2:
            g = tl.load(x_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32)
            u = tl.load(x_rows + K + kk[None, :], mask=mask, other=0.0).to(tl.float32)
            a = ((g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32) * u).to(dtype)
        else:
            r = tl.load(x_rows + kk[None, :], mask=mask, other=0.0)
            if HAS_DELTA:
                r = (r.to(tl.float32) + tl.load(d_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32)).to(dtype)
                if pid_n == 0:
                    tl.store(res_ptr + rows.to(tl.int64)[:, None] * K + kk[None, :], r, mask=mask)
            nw = tl.load(nw_ptr + kk, mask=live_k, other=0.0).to(tl.float32)
            a = ((r.to(tl.float32) * scale[:, None]).to(dtype).to(tl.float32) * nw[None, :]).to(dtype)
        # float32 operands: a 16-bit value is exact in tf32, so tf32 products are exact (and the interpreter's
        # dot is wrong on bfloat16); float32 inputs take IEEE products, as torch's default matmul
        a = a.to(tl.float32)
        w = tl.load(w_rows + kk[None, :], mask=live_n[:, None] & live_k[None, :], other=0.0).to(tl.float32)
        if not DOT:  # a few rows: products on the CUDA cores, a GEMV per row
            acc += tl.sum(a[:, None, :] * w[None, :, :], axis=2)
        elif IEEE:
            acc += tl.dot(a, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(a, tl.trans(w), input_precision="tf32")
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=live_n, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], acc.to(dtype),
             mask=live_m[:, None] & live_n[None, :])


def _check(x: torch.Tensor, k: int, weight: torch.Tensor, bias: torch.Tensor | None) -> int:
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"x must have 1 to {MAX_ROWS} rows (the kernel is for decode sizes), got {x.shape[0]}")
    check_tensor("weight", weight, x.dtype, (None, k), x.device)
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous")
    n = weight.shape[0]
    if bias is not None:
        check_tensor("bias", bias, x.dtype, (n,), x.device)
    check_launchable(_norm_linear_kernel, x.device)
    return n


def _launch(x, delta, norm_weight, weight, bias, residual, y, k: int, eps: float, prologue: int,
            config: dict | None = None) -> None:
    m, n = x.shape[0], weight.shape[0]
    c = {**CONFIG, **(config or {})}
    block_m = 16 if c["dot"] else triton.next_power_of_2(m)
    grid = (triton.cdiv(n, c["block_n"]), triton.cdiv(m, block_m))
    _norm_linear_kernel[grid](
        x, x if delta is None else delta, weight if norm_weight is None else norm_weight, weight,
        weight if bias is None else bias, y if residual is None else residual, y,
        m, n, x.stride(0), 0 if delta is None else delta.stride(0), eps, K=k,
        PROLOGUE=prologue, HAS_DELTA=delta is not None, HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32,
        DOT=c["dot"], BLOCK_M=block_m, BLOCK_N=c["block_n"], BLOCK_K=c["block_k"], num_warps=c["num_warps"])


def add_norm_linear(
    x: torch.Tensor,             # [M, K], 1 <= M <= MAX_ROWS; rows may be strided, last dim contiguous
    delta: torch.Tensor | None,  # [M, K] x's dtype and device, or None
    norm_weight: torch.Tensor,   # [K]
    eps: float,
    weight: torch.Tensor,        # [N, K] contiguous
    bias: torch.Tensor | None = None,  # [N]
    config: dict | None = None,  # overrides of CONFIG (the sweep)
) -> tuple[torch.Tensor, torch.Tensor]:  # residual [M, K] (x itself without delta), y [M, N]
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be an [M, K] tensor, got {getattr(x, 'shape', type(x).__name__)}")
    m, k = x.shape
    n = _check(x, k, weight, bias)
    if delta is not None:
        check_tensor("delta", delta, x.dtype, (m, k), x.device)
    check_tensor("norm_weight", norm_weight, x.dtype, (k,), x.device)
    if not (isinstance(eps, float) and eps > 0):
        raise ValueError(f"eps must be a float > 0, got {eps!r}")
    x = x if x.stride(1) == 1 else x.contiguous()
    if delta is not None and delta.stride(1) != 1:
        delta = delta.contiguous()
    residual = None if delta is None else torch.empty((m, k), dtype=x.dtype, device=x.device)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _launch(x, delta, norm_weight.contiguous(), weight, bias, residual, y, k, eps, NORM, config)
    return (x if residual is None else residual), y


def silu_mul_linear(
    gate_up: torch.Tensor,  # [M, 2K], 1 <= M <= MAX_ROWS: gate, then up; last dim contiguous
    weight: torch.Tensor,   # [N, K] contiguous
    config: dict | None = None,
) -> torch.Tensor:          # [M, N]
    if not isinstance(gate_up, torch.Tensor) or gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be an [M, 2K] tensor, got {getattr(gate_up, 'shape', type(gate_up).__name__)}")
    k = gate_up.shape[1] // 2
    _check(gate_up, k, weight, None)
    gate_up = gate_up if gate_up.stride(1) == 1 else gate_up.contiguous()
    y = torch.empty((gate_up.shape[0], weight.shape[0]), dtype=gate_up.dtype, device=gate_up.device)
    _launch(gate_up, None, None, weight, None, None, y, k, 1.0, SILU_MUL, config)
    return y
