"""kernels.norm_linear (a projection with its norm / SwiGLU gate in the same launch) against its references."""

from __future__ import annotations

import pytest
import torch

from kernels.norm_linear import (MAX_ROWS, add_norm_linear, add_norm_linear_reference, silu_mul_linear,
                                 silu_mul_linear_reference)

# bfloat16 loosely: the interpreter truncates where the GPU rounds (float32 is the strict check)
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=1e-1, rtol=5e-2)}


def _data(m, k, n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, 2 * k, generator=g) * 2).to(dtype)[:, :k]  # strided rows, as a slice of a wider activation
    delta = torch.randn(m, k, generator=g).to(dtype)
    norm_w = (1 + 0.1 * torch.randn(k, generator=g)).to(dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    return x, delta, norm_w, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k,n,with_delta,with_bias", [(1, 576, 40, True, False), (5, 200, 33, True, True),
                                                        (16, 64, 16, False, False), (3, 130, 17, False, True)])
def test_add_norm_linear_matches_reference(dtype, m, k, n, with_delta, with_bias):
    x, delta, norm_w, w, b = _data(m, k, n, dtype, m * k + n)
    delta, b = (delta if with_delta else None), (b if with_bias else None)
    residual, y = add_norm_linear(x, delta, norm_w, 1e-5, w, b)
    ref_res, ref_y = add_norm_linear_reference(x, delta, norm_w, 1e-5, w, b)
    torch.testing.assert_close(residual, ref_res, **TOL[dtype])  # one rounded add (the interpreter truncates)
    torch.testing.assert_close(y, ref_y, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k,n", [(1, 384, 24), (7, 100, 50)])
def test_silu_mul_linear_matches_reference(dtype, m, k, n):
    g = torch.Generator().manual_seed(m + k)
    gate_up = (torch.randn(m, 2 * k, generator=g) * 2).to(dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    torch.testing.assert_close(silu_mul_linear(gate_up, w), silu_mul_linear_reference(gate_up, w), **TOL[dtype])


def test_bad_arguments_name_the_field():
    x, delta, norm_w, w, _ = _data(2, 64, 16, torch.float32, 0)
    with pytest.raises(ValueError, match="rows"):
        add_norm_linear(torch.zeros(MAX_ROWS + 1, 64), None, norm_w, 1e-5, w)
    with pytest.raises(ValueError, match="^weight"):
        add_norm_linear(x, delta, norm_w, 1e-5, w[:, :32])
    with pytest.raises(ValueError, match="^delta"):
        add_norm_linear(x, delta.double(), norm_w, 1e-5, w)
    with pytest.raises(ValueError, match="^norm_weight"):
        add_norm_linear(x, delta, norm_w[:8], 1e-5, w)
    with pytest.raises(ValueError, match="^bias"):
        add_norm_linear(x, delta, norm_w, 1e-5, w, torch.zeros(3))
    with pytest.raises(ValueError, match="^gate_up"):
        silu_mul_linear(torch.zeros(2, 63), w)


def test_the_engine_takes_the_kernel_up_to_its_rows():
    from engine.models import ops

    assert ops.SMALL_ROWS == MAX_ROWS
