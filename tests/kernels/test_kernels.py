"""Triton kernels against their torch references, on the CPU under the Triton interpreter.

tests/kernels/conftest.py sets TRITON_INTERPRET=1 before the kernels are imported. Every
comparison is exact: the kernels make the same decisions as the references, bit for bit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.kv_cache import BlockAllocator
from engine.sampling.rejection import PLACEHOLDER_TOKEN_ID, greedy_verify, rejection_sample
from kernels.greedy_accept import greedy_accept, greedy_accept_reference
from kernels.kv_slots import MAX_BATCH, MAX_BLOCK_T, PAD_SLOT_ID, kv_slots, kv_slots_reference
from kernels.next_inputs import BLOCK_B, next_inputs, next_inputs_reference
from kernels.rejection_accept import (MAX_BLOCK_V, rejection_accept, rejection_accept_reference, sample_final,
                                      sample_final_reference)

P = PLACEHOLDER_TOKEN_ID
REPO = Path(__file__).resolve().parents[2]


def T(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


def assert_equal(got: tuple[torch.Tensor, ...] | torch.Tensor, want: tuple[torch.Tensor, ...] | torch.Tensor) -> None:
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g, w)
        assert torch.equal(g, w), (g, w)


def random_drafts(gen: torch.Generator, b: int, k: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drafts padded with placeholders past num_draft (0..k), and target argmaxes; a small vocab
    makes matches common, so every acceptance length occurs."""
    num_draft = torch.randint(0, k + 1, (b,), generator=gen)
    target = torch.randint(0, vocab, (b, k + 1), generator=gen)
    # a draft copies the target's token 3 times in 4, else a random one
    copy = torch.rand(b, k, generator=gen) < 0.75
    drafts = torch.where(copy, target[:, :k], torch.randint(0, vocab, (b, k), generator=gen))
    drafts = torch.where(torch.arange(k) < num_draft.unsqueeze(1), drafts, P)
    return drafts, num_draft, target


# ------------------------------------------------------------------------------------ greedy

@pytest.mark.parametrize("b,k", [(1, 1), (9, 1), (40, 4), (12, 7)])
def test_greedy_accept_random_batches(b, k):
    gen = torch.Generator().manual_seed(1000 * b + k)
    drafts, num_draft, target = random_drafts(gen, b, k, vocab=4)
    got = greedy_accept(drafts, num_draft, target)
    assert_equal(got, greedy_accept_reference(drafts, num_draft, target))
    assert_equal(got, greedy_verify(drafts, num_draft, target))


GREEDY_EDGES = {
    # name: (drafts, num_draft, target_argmax, expected output ids, expected num_accepted)
    "all_accepted_bonus": ([[5, 6, 7], [1, 2, 3]], [3, 3], [[5, 6, 7, 8], [1, 2, 3, 4]],
                           [[5, 6, 7, 8], [1, 2, 3, 4]], [3, 3]),
    "num_draft_0": ([[P, P], [P, P]], [0, 0], [[4, 9, 9], [3, 3, 3]], [[4, P, P], [3, P, P]], [0, 0]),
    "first_rejected": ([[5, 6, 7]], [3], [[1, 6, 7, 8]], [[1, P, P, P]], [0]),
    "match_after_rejection": ([[5, 6, 7]], [3], [[5, 2, 7, 8]], [[5, 2, P, P]], [1]),
    # ids past num_draft that equal the target's choice are not drafts
    "stale_ids_past_num_draft": ([[3, 4, 5]], [1], [[3, 4, 5, 6]], [[3, 4, P, P]], [1]),
    "placeholder_rows": ([[3, 4, P], [3, P, P], [P, P, P]], [2, 1, 0], [[3, 4, 7, 8], [3, 9, 9, 9], [2, 2, 2, 2]],
                         [[3, 4, 7, P], [3, 9, P, P], [2, P, P, P]], [2, 1, 0]),
    "k1": ([[2], [2], [P]], [1, 1, 0], [[2, 3], [1, 3], [7, 3]], [[2, 3], [1, P], [7, P]], [1, 0, 0]),
    "k0": ([[], []], [0, 0], [[5], [6]], [[5], [6]], [0, 0]),
    # num_draft past K counts as K, as in greedy_verify
    "num_draft_over_k": ([[5, 6], [5, 6]], [4, 3], [[5, 6, 7], [5, 1, 7]], [[5, 6, 7], [5, 1, P]], [2, 1]),
}


@pytest.mark.parametrize("case", GREEDY_EDGES.values(), ids=GREEDY_EDGES.keys())
def test_greedy_accept_edge_cases(case):
    drafts, num_draft, target, want_out, want_acc = case
    drafts = T(drafts).view(len(num_draft), -1)
    got = greedy_accept(drafts, T(num_draft), T(target))
    assert_equal(got, (T(want_out), T(want_acc)))
    assert_equal(got, greedy_verify(drafts, T(num_draft), T(target)))


def test_greedy_accept_empty_batch_and_strided_inputs():
    out, acc = greedy_accept(torch.empty(0, 3, dtype=torch.long), torch.empty(0, dtype=torch.long),
                             torch.empty(0, 4, dtype=torch.long))
    assert out.shape == (0, 4) and acc.shape == (0,)
    gen = torch.Generator().manual_seed(7)
    drafts, num_draft, target = random_drafts(gen, 6, 3, vocab=3)
    strided = target.t().contiguous().t()  # same values, column-major
    assert not strided.is_contiguous()
    assert_equal(greedy_accept(drafts, num_draft, strided), greedy_verify(drafts, num_draft, target))
    # drafts and num_draft as columns of the fused round's inputs [B, 1 + K + 1] (t0, drafts, num_draft)
    inputs = torch.cat([target[:, :1], drafts, num_draft[:, None]], dim=1)
    assert_equal(greedy_accept(inputs[:, 1:4], inputs[:, 4], target), greedy_verify(drafts, num_draft, target))


# ------------------------------------------------------------------------------------ rejection

@pytest.mark.parametrize("b,k", [(1, 1), (16, 1), (40, 5)])
def test_rejection_accept_random_batches(b, k):
    gen = torch.Generator().manual_seed(2000 * b + k)
    p = torch.rand(b, k, generator=gen)
    q = torch.where(torch.rand(b, k, generator=gen) < 0.3, 1.0, torch.rand(b, k, generator=gen))  # some one-hot
    u = torch.rand(b, k, generator=gen) * 0.6  # accept often enough for long prefixes
    num_draft = torch.randint(0, k + 1, (b,), generator=gen)
    assert_equal(rejection_accept(p, q, u, num_draft), rejection_accept_reference(p, q, u, num_draft))


def test_rejection_accept_edge_cases():
    p = torch.tensor([[0.5, 0.9, 0.9], [0.0, 0.9, 0.9], [0.9, 0.9, 0.9], [0.9, 0.9, 0.9], [0.2, 0.2, 0.0]])
    q = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.5, 0.5, 0.5], [1.0, 1.0, 1.0], [0.25, 0.25, 1.0]])
    u = torch.tensor([[0.5, 0.1, 0.1], [0.0, 0.1, 0.1], [0.9, 0.9, 0.9], [0.1, 0.1, 0.1], [0.8, 0.7, 0.1]])
    num_draft = T([3, 3, 5, 0, 3])
    # row 0: u*q == p is a rejection; row 1: p == 0 never accepts, not even u == 0;
    # row 2: all accepted (num_draft past K counts as K); row 3: no drafts;
    # row 4: 0.8 * 0.25 == 0.2 in float32, a rejection again
    want = rejection_accept_reference(p, q, u, num_draft)
    assert want.tolist() == [0, 0, 3, 0, 0]
    assert_equal(rejection_accept(p, q, u, num_draft), want)


@pytest.mark.parametrize("one_hot_drafts", [False, True])
def test_rejection_accept_matches_rejection_sample(one_hot_drafts):
    # p_draft, q_draft gathered from full distributions decide exactly as rejection_sample does
    gen = torch.Generator().manual_seed(3 + one_hot_drafts)
    b, k, v = 24, 4, 12
    target_probs = torch.softmax(torch.randn(b, k + 1, v, generator=gen), -1)
    draft_probs = None if one_hot_drafts else torch.softmax(torch.randn(b, k, v, generator=gen), -1)
    num_draft = torch.randint(0, k + 1, (b,), generator=gen)
    drafts = torch.randint(0, v, (b, k), generator=gen)
    drafts = torch.where(torch.arange(k) < num_draft.unsqueeze(1), drafts, P)
    uniforms = torch.rand(b, k, generator=gen) * 0.3
    noise = torch.empty(b, v).exponential_(generator=gen)
    _, want = rejection_sample(drafts, num_draft, target_probs, draft_probs, uniforms, noise)
    ids = drafts.clamp(min=0).unsqueeze(-1)
    p_draft = target_probs[:, :k].gather(-1, ids).squeeze(-1)
    q_draft = torch.ones_like(p_draft) if draft_probs is None else draft_probs.gather(-1, ids).squeeze(-1)
    assert_equal(rejection_accept(p_draft, q_draft, uniforms, num_draft), want)


@pytest.mark.parametrize("b,n,v", [(5, 1, 1), (9, 3, 7), (6, 4, 2 * MAX_BLOCK_V + 100)])
def test_sample_final_random(b, n, v):
    gen = torch.Generator().manual_seed(b * n + v)
    dist = torch.rand(b, n, v, generator=gen) * (torch.rand(b, n, v, generator=gen) < 0.5)  # some zeros
    noise = torch.empty(b, v).exponential_(generator=gen)
    position = torch.randint(0, n, (b,), generator=gen)
    assert_equal(sample_final(dist, position, noise), sample_final_reference(dist, position, noise))


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # the interpreter's numpy on x / 0
def test_sample_final_ties_infinities_and_strides():
    v = 2 * MAX_BLOCK_V + 100
    b, n = 5, 2
    big = torch.zeros(b, n, v + 9)
    dist = big[:, :, 3:3 + v]  # strided: rows longer than v
    noise = torch.ones(b, v)
    dist[0, 1, [MAX_BLOCK_V + 5, 2 * MAX_BLOCK_V + 1]] = 1.0     # tie across blocks: the lower index wins
    dist[1, 1, [7, 8, MAX_BLOCK_V + 7]] = 1.0                    # tie in one block and the same lane
    dist[2, 0, [40, 50]] = 0.5
    noise[2, [40, 50]] = 0.0                                     # two +inf scores: the first wins
    # row 3: an all-zero distribution -> index 0, as torch's argmax
    dist[4, 0, v - 1] = 1.0                                      # the very last entry
    position = T([1, 1, 0, 1, 0])
    got = sample_final(dist, position, noise)
    assert got.tolist() == [MAX_BLOCK_V + 5, 7, 40, 0, v - 1]
    assert_equal(got, sample_final_reference(dist, position, noise))
    noise_t = noise.t().contiguous().t()
    assert_equal(sample_final(dist, position, noise_t), got)


# ------------------------------------------------------------------------------------ kv slots

def allocator_batch(block_size: int, lens: list[int], q_lens: list[int], max_blocks: int):
    """A BlockAllocator holding each sequence's committed tokens plus the ones it appends."""
    alloc = BlockAllocator(num_blocks=256, block_size=block_size)
    alloc.extend("warm", 3 * block_size)  # block ids need not start at 0
    tables = torch.full((len(lens), max_blocks), -1, dtype=torch.int32)
    for i, (n, q) in enumerate(zip(lens, q_lens)):
        alloc.extend(f"s{i}", n + q)
        if i % 2:
            alloc.extend(f"gap{i}", block_size)  # interleaved blocks
        table = alloc.block_table(f"s{i}")
        tables[i, :len(table)] = torch.tensor(table, dtype=torch.int32)
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.long)
    return alloc, tables, T(lens), cu_q


@pytest.mark.parametrize("block_size,lens,q_lens", [
    (4, [0, 5, 3, 17], [3, 0, 6, 10]),           # prefill, an empty sequence, mid-block starts
    (16, [31, 0, 100, 7, 64], [1, 150, 5, 1, 1]),  # decode rows, a prefill spanning several programs
    (1, [2, 0], [3, 4]),
])
def test_kv_slots_match_block_allocator(block_size, lens, q_lens):
    alloc, tables, start, cu_q = allocator_batch(block_size, lens, q_lens, max_blocks=16)
    slots, positions = kv_slots(tables, start, cu_q, block_size)
    assert_equal((slots, positions), kv_slots_reference(tables, start, cu_q, block_size))
    want = [s for i, (n, q) in enumerate(zip(lens, q_lens)) for s in alloc.slots(f"s{i}", n, n + q)]
    assert slots.tolist() == want
    assert positions.tolist() == [p for n, q in zip(lens, q_lens) for p in range(n, n + q)]


def test_kv_slots_padding_tail_truncation_and_missing_blocks():
    _, tables, start, cu_q = allocator_batch(4, [2, 9], [5, 3], max_blocks=4)
    tables[1, 2] = -1  # the block of positions 8..11 is missing: PAD_SLOT_ID
    start[0] = 14      # positions 14..18 of sequence 0: 16.. lie past its 4-entry table
    for num_tokens in (None, 8, 5, MAX_BLOCK_T + 3, 0):
        got = kv_slots(tables, start, cu_q, 4, num_tokens=num_tokens)
        assert_equal(got, kv_slots_reference(tables, start, cu_q, 4, num_tokens=num_tokens))
    slots, positions = kv_slots(tables, start, cu_q, 4, num_tokens=11)
    assert slots[2:5].tolist() == [PAD_SLOT_ID] * 3 and slots[5:8].tolist() == [PAD_SLOT_ID] * 3
    assert slots[8:].tolist() == [PAD_SLOT_ID] * 3 and positions[8:].tolist() == [0] * 3
    # an empty batch: the whole output is a padded tail
    empty = kv_slots(torch.empty(0, 4, dtype=torch.int32), T([]), T([0]), 4, num_tokens=3)
    assert_equal(empty, (T([PAD_SLOT_ID] * 3), T([0] * 3)))


def test_kv_slots_large_batch_of_decode_rows():
    # 300 sequences: a narrow token block per program, many programs
    gen = torch.Generator().manual_seed(11)
    b, block_size, max_blocks = 300, 8, 6
    tables = torch.randperm(b * max_blocks, generator=gen).view(b, max_blocks).int()
    tables[:, 4:] = -1
    start = torch.randint(0, 4 * block_size, (b,), generator=gen)
    cu_q = torch.arange(b + 1)
    got = kv_slots(tables, start, cu_q, block_size)
    assert_equal(got, kv_slots_reference(tables, start, cu_q, block_size))
    assert_equal(got[1], start)


# ------------------------------------------------------------------------------------ next inputs

@pytest.mark.parametrize("b,k", [(1, 1), (BLOCK_B + 20, 4)])
def test_next_inputs_after_greedy_accept(b, k):
    gen = torch.Generator().manual_seed(b + k)
    drafts, num_draft, target = random_drafts(gen, b, k, vocab=3)
    out, num_accepted = greedy_accept(drafts, num_draft, target)
    seq_lens = torch.randint(1, 500, (b,), generator=gen)
    last_token, new_seq_lens = next_inputs(out, num_accepted, seq_lens)
    assert_equal((last_token, new_seq_lens), next_inputs_reference(out, num_accepted, seq_lens))
    # the host-side view of the same round: commit row[: a + 1]
    for row, a, n, t, m in zip(out.tolist(), num_accepted.tolist(), seq_lens.tolist(), last_token.tolist(),
                               new_seq_lens.tolist()):
        committed = row[: a + 1]
        assert P not in committed and t == committed[-1] and m == n + len(committed)


def test_next_inputs_all_accepted_and_none():
    out = T([[5, 6, 7, 8], [1, P, P, P]])
    got = next_inputs(out, T([3, 0]), T([10, 20]))
    assert_equal(got, (T([8, 1]), T([14, 21])))


# ------------------------------------------------------------------------------------ wrappers

def _greedy_args(**over):
    args = dict(draft_token_ids=T([[1, 2]]), num_draft=T([2]), target_argmax=T([[1, 2, 3]]))
    return greedy_accept, {**args, **over}


def _rejection_args(**over):
    args = dict(p_draft=torch.ones(1, 2), q_draft=torch.ones(1, 2), uniforms=torch.zeros(1, 2), num_draft=T([2]))
    return rejection_accept, {**args, **over}


def _sample_args(**over):
    args = dict(dist=torch.ones(1, 2, 3), position=T([0]), noise=torch.ones(1, 3))
    return sample_final, {**args, **over}


def _slots_args(**over):
    args = dict(block_tables=torch.zeros(1, 2, dtype=torch.int32), start=T([0]), cu_q=T([0, 1]), block_size=4)
    return kv_slots, {**args, **over}


def _next_args(**over):
    args = dict(output_ids=T([[1, 2]]), num_accepted=T([1]), seq_lens=T([3]))
    return next_inputs, {**args, **over}


META = torch.device("meta")
BAD_ARGS = {
    "greedy_draft_dtype": (_greedy_args(draft_token_ids=T([[1, 2]]).int()), "draft_token_ids"),
    "greedy_draft_rank": (_greedy_args(draft_token_ids=T([1, 2])), "draft_token_ids"),
    "greedy_num_draft_shape": (_greedy_args(num_draft=T([2, 2])), "num_draft"),
    "greedy_target_shape": (_greedy_args(target_argmax=T([[1, 2]])), "target_argmax"),
    "greedy_target_device": (_greedy_args(target_argmax=T([[1, 2, 3]]).to(META)), "target_argmax"),
    "rejection_p_dtype": (_rejection_args(p_draft=torch.ones(1, 2, dtype=torch.float64)), "p_draft"),
    "rejection_q_shape": (_rejection_args(q_draft=torch.ones(1, 3)), "q_draft"),
    "rejection_uniforms_dtype": (_rejection_args(uniforms=torch.zeros(1, 2, dtype=torch.float16)), "uniforms"),
    "rejection_num_draft_dtype": (_rejection_args(num_draft=T([2]).int()), "num_draft"),
    "rejection_not_a_tensor": (_rejection_args(uniforms=[[0.0, 0.0]]), "uniforms"),
    "sample_dist_rank": (_sample_args(dist=torch.ones(1, 3)), "dist"),
    "sample_dist_empty": (_sample_args(dist=torch.ones(1, 0, 3)), "dist"),
    "sample_position_dtype": (_sample_args(position=T([0]).int()), "position"),
    "sample_noise_shape": (_sample_args(noise=torch.ones(1, 4)), "noise"),
    "slots_table_dtype": (_slots_args(block_tables=torch.zeros(1, 2, dtype=torch.int64)), "block_tables"),
    "slots_start_shape": (_slots_args(start=T([0, 0])), "start"),
    "slots_cu_q_shape": (_slots_args(cu_q=T([1])), "cu_q"),
    "slots_block_size": (_slots_args(block_size=0), "block_size"),
    "slots_block_size_type": (_slots_args(block_size=4.0), "block_size"),
    "slots_num_tokens": (_slots_args(num_tokens=-1), "num_tokens"),
    "slots_batch_too_large": (_slots_args(block_tables=torch.zeros(MAX_BATCH + 1, 2, dtype=torch.int32),
                                          start=torch.zeros(MAX_BATCH + 1, dtype=torch.long),
                                          cu_q=torch.zeros(MAX_BATCH + 2, dtype=torch.long)), "block_tables"),
    "next_output_dtype": (_next_args(output_ids=T([[1, 2]]).int()), "output_ids"),
    "next_num_accepted_shape": (_next_args(num_accepted=T([[1]])), "num_accepted"),
    "next_seq_lens_device": (_next_args(seq_lens=T([3]).to(META)), "seq_lens"),
}


@pytest.mark.parametrize("call,name", BAD_ARGS.values(), ids=BAD_ARGS.keys())
def test_wrappers_reject_bad_arguments(call, name):
    fn, kwargs = call
    with pytest.raises(ValueError, match=rf"^{name} "):
        fn(**kwargs)


def test_cpu_tensors_without_interpreter_raise():
    # a fresh interpreter without TRITON_INTERPRET: the kernels compile for CUDA and refuse CPU tensors
    script = """
import torch
from tests.kernels.test_kernels import _greedy_args, _next_args, _rejection_args, _sample_args, _slots_args
for make in (_greedy_args, _rejection_args, _sample_args, _slots_args, _next_args):
    fn, kwargs = make()
    try:
        fn(**kwargs)
    except RuntimeError as e:
        assert "TRITON_INTERPRET=1" in str(e), e
    else:
        raise SystemExit(f"{fn.__name__} ran on the CPU")
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


def test_kernels_share_the_engines_sentinel_and_import_no_engine_code():
    from kernels._common import PLACEHOLDER_TOKEN_ID as kernel_placeholder

    assert kernel_placeholder == PLACEHOLDER_TOKEN_ID
    code = ("import sys, kernels.greedy_accept, kernels.rejection_accept, kernels.kv_slots, kernels.next_inputs; "
            "bad = [m for m in sys.modules if m == 'engine' or m.startswith('engine.')]; assert not bad, bad")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=Path(__file__).resolve().parents[2])


def test_greedy_reference_equals_the_engines_greedy_verify():
    gen = torch.Generator().manual_seed(3)
    drafts = torch.randint(0, 4, (64, 5), generator=gen)
    num_draft = torch.randint(0, 6, (64,), generator=gen)
    drafts[torch.arange(5).unsqueeze(0) >= num_draft.unsqueeze(1)] = PLACEHOLDER_TOKEN_ID
    target = torch.randint(0, 4, (64, 6), generator=gen)
    assert_equal(greedy_accept_reference(drafts, num_draft, target), greedy_verify(drafts, num_draft, target))
