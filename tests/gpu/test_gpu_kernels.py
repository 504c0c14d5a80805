"""The fused layer kernels compiled on the GPU, in every dtype the engine runs (the CPU tests run them
under the interpreter, which rounds bfloat16 its own way), against their torch references."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
       torch.float16: dict(atol=3e-3, rtol=3e-3)}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q_len,kv_lens", [(1, [1, 17, 100, 700]), (5, [5, 40, 33, 1029]), (9, [64])])
def test_static_attention(dtype, q_len, kv_lens):
    from tests.kernels.test_static_attention import _case
    from kernels.static_attention import static_attention, static_attention_reference

    case = [x.cuda() for x in _case(len(kv_lens), q_len, kv_lens, dtype, blocks=200)]
    q, k, v, cos, sin, kc, vc, table, lens = case
    kc2, vc2 = kc.clone(), vc.clone()
    got = static_attention(q, k, v, cos, sin, kc, vc, table, lens, q_len)
    want = static_attention_reference(q, k, v, cos, sin, kc2, vc2, table, lens, q_len)
    torch.testing.assert_close(got, want, **TOL[dtype])
    torch.testing.assert_close(kc, kc2, **TOL[dtype])
    assert torch.equal(vc, vc2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rmsnorm_and_silu_mul(dtype):
    from kernels.fused_norm import add_rmsnorm, add_rmsnorm_reference
    from kernels.silu_mul import silu_mul, silu_mul_reference

    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(33, 576, device="cuda", generator=g) * 4).to(dtype)
    d = torch.randn(33, 576, device="cuda", generator=g).to(dtype)
    w = torch.randn(576, device="cuda", generator=g).to(dtype)
    res, out = add_rmsnorm(x, d, w, 1e-5)
    want_res, want_out = add_rmsnorm_reference(x, d, w, 1e-5)
    assert torch.equal(res, want_res)
    torch.testing.assert_close(out, want_out, **TOL[dtype])
    gu = (torch.randn(33, 3072, device="cuda", generator=g) * 3).to(dtype)
    torch.testing.assert_close(silu_mul(gu), silu_mul_reference(gu), **TOL[dtype])
