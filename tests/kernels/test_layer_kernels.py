"""rmsnorm and rotary (kernels/) against their torch references, which must equal the engine's layers."""

from __future__ import annotations

import pytest
import torch

from engine.config import RopeScaling
from engine.models.layers import RMSNorm, RotaryEmbedding, apply_rotary
from kernels.l2_prefetch import l2_prefetch
from kernels.rmsnorm import rmsnorm, rmsnorm_pair, rmsnorm_pair_reference, rmsnorm_reference
from kernels.rotary import rotary, rotary_reference

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def test_references_are_the_engines_layers():
    torch.manual_seed(0)
    norm = RMSNorm(96, 1e-5)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(7, 96)
    assert torch.equal(rmsnorm_reference(x, norm.weight.detach(), 1e-5), norm(x).detach())
    rope = RotaryEmbedding(64, 512, 10000.0, RopeScaling())
    qk = torch.randn(5, 12, 64)
    pos = torch.tensor([0, 3, 4, 100, 511])
    assert torch.equal(rotary_reference(qk, pos, rope.cos_sin), apply_rotary(qk, rope.lookup(pos)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,d", [(1, 576), (9, 96), (3, 7)])
def test_rmsnorm_matches_reference(dtype, t, d):
    g = torch.Generator().manual_seed(t * d)
    x = (torch.randn(t, d, generator=g) * 3).to(dtype)
    w = torch.randn(d, generator=g).to(dtype)
    torch.testing.assert_close(rmsnorm(x, w, 1e-5), rmsnorm_reference(x, w, 1e-5), **TOL[dtype])


def test_rmsnorm_strided_rows_and_empty_batch():
    x = torch.randn(6, 2 * 64)[:, :64]  # rows strided like a slice of a wider activation
    w = torch.randn(64)
    torch.testing.assert_close(rmsnorm(x, w, 1e-6), rmsnorm_reference(x, w, 1e-6), **TOL[torch.float32])
    assert rmsnorm(torch.empty(0, 64), w, 1e-6).shape == (0, 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_pair_is_two_rmsnorms_side_by_side(dtype):
    """An EAGLE head's input: each half is exactly what rmsnorm gives its input (the same arithmetic), the
    reference is the engine's two norms and a cat; rows may be strided (a slice of a wider activation)."""
    g = torch.Generator().manual_seed(4)
    a = (torch.randn(5, 2 * 576, generator=g) * 3).to(dtype)[:, :576]
    b = (torch.randn(5, 576, generator=g) * 5).to(dtype)
    wa, wb = (torch.randn(576, generator=g).to(dtype) for _ in range(2))
    got = rmsnorm_pair(a, wa, b, wb, 1e-5)
    assert torch.equal(got, torch.cat([rmsnorm(a, wa, 1e-5), rmsnorm(b, wb, 1e-5)], dim=-1))
    torch.testing.assert_close(got, rmsnorm_pair_reference(a, wa, b, wb, 1e-5), **TOL[dtype])
    assert rmsnorm_pair(a[:0], wa, b[:0], wb, 1e-5).shape == (0, 2 * 576)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_matches_reference_on_queries_and_keys_viewed_from_a_fused_projection(dtype):
    g = torch.Generator().manual_seed(1)
    t, hq, hkv, d = 5, 9, 3, 64
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g).to(dtype)
    qk = qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d)  # as engine.models.llama.Attention views it
    table = RotaryEmbedding(d, 256, 10000.0, RopeScaling()).cos_sin
    pos = torch.tensor([0, 1, 17, 200, 255])
    torch.testing.assert_close(rotary(qk, pos, table), rotary_reference(qk, pos, table), **TOL[dtype])


@pytest.mark.parametrize("call,match", [
    (lambda: rmsnorm(torch.randn(4), torch.randn(4), 1e-5), "x must be a \\[T, D\\]"),
    (lambda: rmsnorm(torch.randn(2, 4), torch.randn(5), 1e-5), "weight must have shape \\[4\\]"),
    (lambda: rmsnorm(torch.randn(2, 4), torch.randn(4).double(), 1e-5), "weight must be torch.float32"),
    (lambda: rmsnorm(torch.randn(2, 4), torch.randn(4), 0.0), "eps must be a float > 0"),
    (lambda: rmsnorm(torch.randn(2, 4).long(), torch.randn(4), 1e-5), "x must be float32"),
    (lambda: rmsnorm_pair(torch.randn(2, 4), torch.randn(4), torch.randn(3, 4), torch.randn(4), 1e-5),
     "b must have shape \\[2, 4\\]"),
    (lambda: rmsnorm_pair(torch.randn(2, 4), torch.randn(4), torch.randn(2, 4), torch.randn(4).half(), 1e-5),
     "weight_b must be torch.float32"),
    (lambda: l2_prefetch(torch.randn(4)), "tensors\\[0\\] must be a contiguous CUDA"),
    (lambda: l2_prefetch([]), "tensors must hold 1 to 4"),
    (lambda: rotary(torch.randn(2, 3, 5), torch.zeros(2, dtype=torch.long), torch.randn(8, 5)), "even"),
    (lambda: rotary(torch.randn(2, 3, 4), torch.zeros(3, dtype=torch.long), torch.randn(8, 4)),
     "positions must have shape \\[2\\]"),
    (lambda: rotary(torch.randn(2, 3, 4), torch.zeros(2, dtype=torch.long), torch.randn(8, 4).double()),
     "cos_sin must be torch.float32"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rmsnorm_matches_reference_and_the_engines_unfused_steps(dtype):
    from engine.models.layers import RMSNorm
    from kernels.fused_norm import add_rmsnorm, add_rmsnorm_reference

    g = torch.Generator().manual_seed(2)
    x = (torch.randn(5, 2 * 96, generator=g) * 4).to(dtype)[:, :96]  # strided rows
    delta = torch.randn(5, 96, generator=g).to(dtype)
    norm = RMSNorm(96, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.normal_(generator=g)
        res, out = add_rmsnorm(x, delta, norm.weight, 1e-5)
        want_res, want_out = add_rmsnorm_reference(x, delta, norm.weight, 1e-5)
        assert torch.equal(want_res, x + delta) and torch.equal(want_out, norm(x + delta))
        # one rounding of a float32 sum: exact in float32 (the interpreter rounds bfloat16 its own way)
        torch.testing.assert_close(res, want_res, **(dict(atol=0, rtol=0) if dtype == torch.float32 else TOL[dtype]))
        torch.testing.assert_close(out, want_out, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_reference_and_swiglu(dtype):
    from engine.models.layers import SwiGLU
    from kernels.silu_mul import silu_mul, silu_mul_reference

    g = torch.Generator().manual_seed(4)
    gate_up = (torch.randn(3, 2 * 1536, generator=g) * 3).to(dtype)
    torch.testing.assert_close(silu_mul(gate_up), silu_mul_reference(gate_up), **TOL[dtype])
    mlp = SwiGLU(8, 1536).to(dtype)
    with torch.no_grad():
        x = torch.randn(3, 8, generator=g).to(dtype)
        assert torch.equal(mlp.down_proj(silu_mul_reference(mlp.gate_up_proj(x))), mlp(x))


@pytest.mark.parametrize("call,match", [
    (lambda: __import__("kernels.fused_norm").fused_norm.add_rmsnorm(torch.randn(2, 4), torch.randn(3, 4),
                                                                     torch.randn(4), 1e-5), "delta must have shape"),
    (lambda: __import__("kernels.silu_mul").silu_mul.silu_mul(torch.randn(2, 5)), "gate_up must be a \\[T, 2I\\]"),
])
def test_fused_kernels_name_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()
