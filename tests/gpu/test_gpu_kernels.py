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
@pytest.mark.parametrize("splits", [1, 3, 17])
@pytest.mark.parametrize("width", [0, 128])  # 128: a 2,048-token bucket's table, its rows' splits over their own keys
def test_static_attention(dtype, q_len, kv_lens, splits, width):
    from tests.kernels.test_static_attention import _case
    from kernels.static_attention import static_attention, static_attention_reference

    case = [x.cuda() for x in _case(len(kv_lens), q_len, kv_lens, dtype, blocks=200, width=width)]
    q, k, v, cos, sin, kc, vc, table, lens = case
    kc2, vc2 = kc.clone(), vc.clone()
    got = static_attention(q, k, v, cos, sin, kc, vc, table, lens, q_len, splits)
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
    from kernels.rmsnorm import rmsnorm, rmsnorm_pair

    pair = rmsnorm_pair(x, w, d, w.flip(0), 1e-5)  # each half is rmsnorm's own launch, bit for bit
    assert torch.equal(pair, torch.cat([rmsnorm(x, w, 1e-5), rmsnorm(d, w.flip(0), 1e-5)], dim=-1))
    gu = (torch.randn(33, 3072, device="cuda", generator=g) * 3).to(dtype)
    torch.testing.assert_close(silu_mul(gu), silu_mul_reference(gu), **TOL[dtype])


def test_philox_random_rows_compiled_equal_the_reference():
    from kernels.philox import random_rows
    from kernels.philox_ref import random_rows_reference

    seeds = torch.tensor([0, 1, 12345, 2**63 - 1, 2**40 + 7])
    counters = torch.tensor([0, 1, 5, 2**33 + 3, 77])
    for stream, col0, exponential in ((0, 0, False), (1, 0, True), (2, 3 * 49152, True)):
        want = random_rows_reference(seeds, counters, stream, 49152, col0, exponential)
        got = random_rows(torch.empty(5, 49152, device="cuda"), seeds.cuda(), counters.cuda(), stream, col0,
                          exponential).cpu()
        if exponential:  # the GPU's log rounds its own way
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        else:
            assert torch.equal(got, want)


def test_argmax_rows_compiled_equal_torch():
    from kernels.argmax_rows import argmax_rows, argmax_rows_reference

    g = torch.Generator(device="cuda").manual_seed(0)
    for rows in (1, 5, 64, 320):
        x = torch.randn(rows, 49152, device="cuda", generator=g)
        noise = torch.empty(rows, 49152, device="cuda").exponential_(generator=g)
        x[0, 100:102] = 9.0  # a tie: the first
        for _ in range(3):   # the per-row tickets start at zero on every call
            assert torch.equal(argmax_rows(x), argmax_rows_reference(x))
            assert torch.equal(argmax_rows(x, noise), argmax_rows_reference(x, noise))
        x16 = (x * 4).bfloat16()  # an LM head's bf16 output as the greedy picks read it: the float32 copy's argmax
        assert torch.equal(argmax_rows(x16), argmax_rows_reference(x16.float()))


def test_topk_rows_compiled_equal_a_stable_sort():
    from kernels.argmax_rows import argmax_rows
    from kernels.topk_rows import topk_rows, topk_rows_reference

    g = torch.Generator(device="cuda").manual_seed(1)
    for rows, b in ((1, 3), (4, 2), (56, 1), (40, 4)):
        x = (torch.randn(rows, 49152, device="cuda", generator=g) * 4).bfloat16()  # as a draft step's LM head leaves it
        x[0, [300, 7, 40000]] = x[0].max() + 1  # a tie across programs: the lowest index first
        for _ in range(3):  # the per-row tickets start at zero on every call
            got = topk_rows(x, b)
            assert torch.equal(got, topk_rows_reference(x, b)) and torch.equal(got[:, 0], argmax_rows(x))


def test_rejection_accept_compiled_equals_the_torch_steps():
    """A round's sampled acceptance in one launch, compiled, against the engine's torch steps on the CPU (same
    float32 arithmetic): SmolLM2's vocabulary, one-hot and full draft distributions, calls in a row."""
    from engine.sampling.rejection import rejection_sample
    from kernels.rejection_accept import rejection_accept
    from tests.kernels.test_kernels import random_round

    for b, k in ((1, 4), (8, 4), (64, 2)):
        for one_hot in (False, True):
            for peaked in (False, True):
                args = random_round(torch.Generator().manual_seed(b + k + one_hot), b, k, 49152, one_hot, peaked)
                want = rejection_sample(*args)
                for _ in range(2):  # the per-row tickets start at zero on every call
                    got = rejection_accept(*(None if a is None else a.cuda() for a in args))
                    assert all(torch.equal(g.cpu(), w) for g, w in zip(got, want))


def test_tree_sample_accept_compiled_equals_the_torch_steps():
    """A tree round's sampled acceptance in one launch, compiled, against the engine's torch steps on the CPU (same
    float32 arithmetic): SmolLM2's vocabulary, shallow and deep trees, calls in a row."""
    from engine.rounds.tree import TreeTensors, tree_rejection_sample
    from kernels.tree_sample_accept import tree_sample_accept
    from tests.kernels.test_tree_sample_accept import case

    for shape, rows in (((3, 1), 4), ((2, 2, 1, 1), 16), ((2, 1, 1), 64)):
        tree, *args = case(shape, rows, rows, vocab=49152)
        want = tree_rejection_sample(*args, TreeTensors(tree, "cpu"))
        t = TreeTensors(tree, "cuda")
        for _ in range(2):  # the per-row tickets start at zero on every call
            got = tree_sample_accept(*(a.cuda() for a in args), t.first_child, t.branching, t.first_path, max(shape))
            assert all(torch.equal(g.cpu(), w) for g, w in zip(got, want))


def test_next_inputs_compiled_equals_the_reference():
    from kernels.next_inputs import next_inputs, next_inputs_reference
    from tests.kernels.test_kernels import chained_round

    # (a draft tree's rows: w nodes over the k depths verified)
    for r, k, padding, w in ((1, 4, 0, None), (8, 4, 3, None), (4, 0, 1, None), (1, 4, 0, 14), (8, 2, 3, 6)):
        inputs, kv, committed, accepted, drafts = (None if t is None else t.cuda() for t in
                                                   chained_round(torch.Generator().manual_seed(r), r, k, padding, w))
        want = next_inputs_reference(inputs, kv, committed, accepted, drafts)
        next_inputs(inputs, kv, committed, accepted, drafts)
        assert torch.equal(inputs, want[0]) and torch.equal(kv, want[1])


def test_l2_prefetch_runs_in_both_modes_in_a_graph_and_changes_nothing():
    """kernels.l2_prefetch (what bench/prefetch_probe.py times): compiled, captured on a side stream, no write."""
    from kernels.l2_prefetch import l2_prefetch

    g = torch.Generator(device="cuda").manual_seed(0)
    ws = [torch.randn(n, 576, device="cuda", generator=g).bfloat16() for n in (960, 576, 3072, 3)]
    before = [w.clone() for w in ws]
    for mode in ("prefetch", "load"):
        l2_prefetch(ws, 8, mode)
        l2_prefetch(ws[0], 1, mode)
        side = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # forked onto a side stream and joined
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                l2_prefetch(ws, 8, mode)
            torch.cuda.current_stream().wait_stream(side)
        graph.replay()
        torch.cuda.synchronize()
    assert all(torch.equal(w, b) for w, b in zip(ws, before))
