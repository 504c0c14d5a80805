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
from kernels.next_inputs import next_inputs, next_inputs_reference
from kernels.rejection_accept import BLOCK as REJECTION_BLOCK
from kernels.rejection_accept import rejection_accept, rejection_accept_reference

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

def random_round(gen: torch.Generator, b: int, k: int, v: int, one_hot: bool, peaked: bool = False):
    """A sampled round's inputs: drafts (placeholders past num_draft), target and draft distributions, coins.
    ``peaked``: distributions concentrated on a few tokens, drafts mostly on them, so long prefixes are
    accepted and residuals vanish often (p == q where the two agree)."""
    scale = 6.0 if peaked else 1.0
    target_probs = torch.softmax(torch.randn(b, k + 1, v, generator=gen) * scale, -1)
    draft_probs = None if one_hot else torch.softmax(torch.randn(b, k, v, generator=gen) * scale, -1)
    if peaked and draft_probs is not None:  # some rows' q equal to p: their residual is all zero
        same = torch.rand(b, generator=gen) < 0.3
        draft_probs[same] = target_probs[same, :k]
    num_draft = torch.randint(0, k + 1, (b,), generator=gen)
    top = target_probs[:, :k].argmax(-1)
    drafts = torch.where(torch.rand(b, k, generator=gen) < (0.8 if peaked else 0.3), top,
                         torch.randint(0, v, (b, k), generator=gen))
    drafts = torch.where(torch.arange(k) < num_draft.unsqueeze(1), drafts, P)
    uniforms = torch.rand(b, k, generator=gen)
    noise = torch.empty(b, v).exponential_(generator=gen)
    return drafts, num_draft, target_probs, draft_probs, uniforms, noise


@pytest.mark.parametrize("b,k,v", [(1, 1, 7), (24, 4, 12), (9, 3, 2 * REJECTION_BLOCK + 100), (6, 0, 50)])
@pytest.mark.parametrize("one_hot", [False, True])
@pytest.mark.parametrize("peaked", [False, True])
def test_rejection_accept_equals_the_reference_and_the_engines_torch_steps(b, k, v, one_hot, peaked):
    gen = torch.Generator().manual_seed(1000 * b + 10 * k + v + one_hot + 2 * peaked)
    args = random_round(gen, b, k, v, one_hot, peaked)
    got = rejection_accept(*args)
    assert_equal(got, rejection_accept_reference(*args))
    assert_equal(got, rejection_sample(*args))


def test_rejection_accept_edge_cases():
    v = 2 * REJECTION_BLOCK + 100
    b, k = 6, 2
    target = torch.zeros(b, k + 1, v)
    draft = torch.zeros(b, k, v)
    drafts = T([[5, 6], [5, 6], [5, P], [5, 6], [5, 6], [5, 6]])
    num_draft = T([2, 2, 1, 2, 2, 2])
    uniforms = torch.full((b, k), 0.5)
    noise = torch.ones(b, v)
    # row 0: draft 5 rejected (p 0.25 < u q 0.5); residual 0.75 at 1 and at 2 * BLOCK + 1 (a tie across
    #   programs): the lower index is recovered
    target[0, 0, [5, 1, 2 * REJECTION_BLOCK + 1]] = torch.tensor([0.25, 0.375, 0.375])
    draft[0, 0, 5] = 1.0
    # row 1: both accepted (p == q == 1), the bonus token from p at position 2
    target[1, 0, 5] = target[1, 1, 6] = draft[1, 0, 5] = draft[1, 1, 6] = 1.0
    target[1, 2, REJECTION_BLOCK + 3] = 1.0
    # row 2: one draft, accepted; n == num_draft < K: the bonus comes from p at position 1 (a tie of 6 and 9:
    #   6), not from the residual max(0, p - q) (9)
    target[2, 0, 5] = draft[2, 0, 5] = 1.0
    target[2, 1, [6, 9]] = 0.5
    draft[2, 1, 6] = 1.0
    # row 3: rejected where p == q (u * q == p is a rejection): the residual vanishes, the draw is from p
    target[3, 0, [5, 7]] = draft[3, 0, [5, 7]] = 0.5
    uniforms[3, 0] = 1.0
    # row 4: the exponential race, not the largest probability: noise makes index 40 win
    target[4, 0, [5, 30, 40]] = torch.tensor([0.0, 0.6, 0.4])
    draft[4, 0, 5] = 1.0
    noise[4, 30] = 4.0
    # row 5: the last vocabulary entry
    target[5, 0, [5, v - 1]] = torch.tensor([0.1, 0.9])
    draft[5, 0, 5] = 1.0
    args = (drafts, num_draft, target, draft, uniforms, noise)
    out, n = rejection_accept(*args)
    assert n.tolist() == [0, 2, 1, 0, 0, 0]
    assert out.tolist() == [[1, P, P], [5, 6, REJECTION_BLOCK + 3], [5, 6, P], [5, P, P], [40, P, P],
                            [v - 1, P, P]]
    assert_equal((out, n), rejection_accept_reference(*args))
    assert_equal((out, n), rejection_sample(*args))


def test_rejection_accept_decisions_at_the_boundaries():
    # p(d_j) and q(d_j) per row (the drafts are token 1 at every position; token 0 holds the rest of the mass)
    p = torch.tensor([[0.5, 0.9, 0.9], [0.0, 0.9, 0.9], [0.9, 0.9, 0.9], [0.9, 0.9, 0.9], [0.2, 0.2, 0.0]])
    q = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.5, 0.5, 0.5], [1.0, 1.0, 1.0], [0.25, 0.25, 1.0]])
    u = torch.tensor([[0.5, 0.1, 0.1], [0.0, 0.1, 0.1], [0.9, 0.9, 0.9], [0.1, 0.1, 0.1], [0.8, 0.7, 0.1]])
    num_draft = T([3, 3, 5, 0, 3])
    # row 0: u*q == p is a rejection; row 1: p == 0 never accepts, not even u == 0;
    # row 2: all accepted (num_draft past K counts as K); row 3: no drafts;
    # row 4: 0.8 * 0.25 == 0.2 in float32, a rejection again
    target = torch.zeros(5, 4, 3)
    target[:, :3, 1], target[:, :3, 0], target[:, 3, 2] = p, 1 - p, 1.0
    draft = torch.zeros(5, 3, 3)
    draft[:, :, 1], draft[:, :, 0] = q, 1 - q
    drafts = torch.where(torch.arange(3) < num_draft[:, None], 1, P)
    args = (drafts, num_draft, target, draft, u, torch.ones(5, 3))
    out, n = rejection_accept(*args)
    assert n.tolist() == [0, 0, 3, 0, 0]
    assert_equal((out, n), rejection_sample(*args))


def test_rejection_accept_reads_strided_columns_of_the_rounds_inputs():
    # as the fused round passes them: drafts and num_draft are columns of its [R, k + 2] inputs
    gen = torch.Generator().manual_seed(5)
    drafts, num_draft, target, draft, uniforms, noise = random_round(gen, 8, 3, 40, one_hot=False, peaked=True)
    inputs = torch.cat([torch.zeros(8, 1, dtype=torch.long), drafts, num_draft[:, None]], dim=1)
    got = rejection_accept(inputs[:, 1:4], inputs[:, 4], target, draft, uniforms, noise)
    assert_equal(got, rejection_sample(drafts, num_draft, target, draft, uniforms, noise))


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

def chained_round(gen: torch.Generator, r: int, k: int, padding: int, w: int | None = None):
    """A fused round's buffers after its verdict: inputs [R, w + 2] (w: k, or a draft tree's nodes, the first k
    of them verified here) and KV lengths (the last ``padding`` rows padding, holding exactly w + 1 tokens), the
    committed tokens and accepted counts of greedy acceptance, and the drafter's next drafts [R, w]."""
    w = k if w is None else w
    drafts, num_draft, target = random_drafts(gen, r, k, vocab=3)
    nodes = torch.cat([drafts, torch.randint(0, 50, (r, w - k), generator=gen)], dim=1)
    inputs = torch.cat([torch.randint(0, 50, (r, 1), generator=gen), nodes, num_draft[:, None]], dim=1)
    kv = torch.randint(w + 2, 400, (r,), generator=gen)
    kv[r - padding:] = w + 1
    committed, accepted = (t.contiguous() for t in greedy_accept_reference(drafts, num_draft, target))
    next_drafts = torch.randint(0, 50, (r, w), generator=gen) if w else None
    return inputs, kv, committed, accepted, next_drafts


@pytest.mark.parametrize("r,k,padding,w", [(1, 4, 0, 4), (8, 4, 3, 4), (16, 1, 5, 1), (4, 0, 1, 0), (6, 4, 2, 14)])
def test_next_inputs_equals_the_reference_and_the_rounds_torch_steps(r, k, padding, w):
    """w > k: a draft tree's round (14 nodes of depth 4), whose next drafts are a tree too."""
    from engine.rounds.chained import chain

    inputs, kv, committed, accepted, next_drafts = chained_round(torch.Generator().manual_seed(r + k), r, k, padding,
                                                                 w)
    want = next_inputs_reference(inputs, kv, committed, accepted, next_drafts)
    got_inputs, got_kv = inputs.clone(), kv.clone()
    next_inputs(got_inputs, got_kv, committed, accepted, next_drafts)
    assert_equal((got_inputs, got_kv), want)
    # the fused round's own torch steps (its CPU path) leave the graph's buffers the same way
    g_inputs, g_kv = inputs.clone(), kv.clone()
    chain(g_inputs, g_kv, committed, accepted, next_drafts)
    assert_equal((g_inputs, g_kv), want)
    # live rows: t0 is the last committed token, the drafts the next ones, the length grown by the committed
    for b in range(r - padding):
        a = int(accepted[b])
        assert int(got_inputs[b, 0]) == int(committed[b, a]) and int(got_kv[b]) == int(kv[b]) + a + 1
        assert got_inputs[b, 1:w + 1].tolist() == ([] if next_drafts is None else next_drafts[b].tolist())
    assert_equal((got_inputs[r - padding:], got_kv[r - padding:]), (inputs[r - padding:], kv[r - padding:]))
    assert_equal(got_inputs[:, w + 1], inputs[:, w + 1])  # how many drafts to verify: untouched


# ------------------------------------------------------------------------------------ wrappers

def _greedy_args(**over):
    args = dict(draft_token_ids=T([[1, 2]]), num_draft=T([2]), target_argmax=T([[1, 2, 3]]))
    return greedy_accept, {**args, **over}


def _rejection_args(**over):
    args = dict(draft_token_ids=T([[1, 2]]), num_draft=T([2]), target_probs=torch.ones(1, 3, 4) / 4,
                draft_probs=torch.ones(1, 2, 4) / 4, uniforms=torch.zeros(1, 2), noise=torch.ones(1, 4))
    return rejection_accept, {**args, **over}


def _slots_args(**over):
    args = dict(block_tables=torch.zeros(1, 2, dtype=torch.int32), start=T([0]), cu_q=T([0, 1]), block_size=4)
    return kv_slots, {**args, **over}


def _next_args(**over):
    args = dict(inputs=T([[1, 2, 1]]), kv_lens=T([5]), committed=T([[2, 3]]), num_accepted=T([1]),
                next_drafts=T([[4]]))
    return next_inputs, {**args, **over}


META = torch.device("meta")
BAD_ARGS = {
    "greedy_draft_dtype": (_greedy_args(draft_token_ids=T([[1, 2]]).int()), "draft_token_ids"),
    "greedy_draft_rank": (_greedy_args(draft_token_ids=T([1, 2])), "draft_token_ids"),
    "greedy_num_draft_shape": (_greedy_args(num_draft=T([2, 2])), "num_draft"),
    "greedy_target_shape": (_greedy_args(target_argmax=T([[1, 2]])), "target_argmax"),
    "greedy_target_device": (_greedy_args(target_argmax=T([[1, 2, 3]]).to(META)), "target_argmax"),
    "rejection_drafts_dtype": (_rejection_args(draft_token_ids=T([[1, 2]]).int()), "draft_token_ids"),
    "rejection_num_draft_dtype": (_rejection_args(num_draft=T([2]).int()), "num_draft"),
    "rejection_target_shape": (_rejection_args(target_probs=torch.ones(1, 2, 4)), "target_probs"),
    "rejection_target_dtype": (_rejection_args(target_probs=torch.ones(1, 3, 4, dtype=torch.float64)),
                               "target_probs"),
    "rejection_target_empty": (_rejection_args(target_probs=torch.ones(1, 3, 0), draft_probs=None,
                                               noise=torch.ones(1, 0)), "target_probs"),
    "rejection_draft_shape": (_rejection_args(draft_probs=torch.ones(1, 2, 5)), "draft_probs"),
    "rejection_uniforms_dtype": (_rejection_args(uniforms=torch.zeros(1, 2, dtype=torch.float16)), "uniforms"),
    "rejection_noise_shape": (_rejection_args(noise=torch.ones(1, 3)), "noise"),
    "rejection_not_a_tensor": (_rejection_args(uniforms=[[0.0, 0.0]]), "uniforms"),
    "slots_table_dtype": (_slots_args(block_tables=torch.zeros(1, 2, dtype=torch.int64)), "block_tables"),
    "slots_start_shape": (_slots_args(start=T([0, 0])), "start"),
    "slots_cu_q_shape": (_slots_args(cu_q=T([1])), "cu_q"),
    "slots_block_size": (_slots_args(block_size=0), "block_size"),
    "slots_block_size_type": (_slots_args(block_size=4.0), "block_size"),
    "slots_num_tokens": (_slots_args(num_tokens=-1), "num_tokens"),
    "slots_batch_too_large": (_slots_args(block_tables=torch.zeros(MAX_BATCH + 1, 2, dtype=torch.int32),
                                          start=torch.zeros(MAX_BATCH + 1, dtype=torch.long),
                                          cu_q=torch.zeros(MAX_BATCH + 2, dtype=torch.long)), "block_tables"),
    "next_committed_dtype": (_next_args(committed=T([[2, 3]]).int()), "committed"),
    "next_inputs_shape": (_next_args(inputs=T([[1, 2]])), "inputs"),
    "next_kv_lens_device": (_next_args(kv_lens=T([5]).to(META)), "kv_lens"),
    "next_num_accepted_shape": (_next_args(num_accepted=T([[1]])), "num_accepted"),
    "next_drafts_shape": (_next_args(next_drafts=T([[4, 5]])), "next_drafts"),
    "next_inputs_narrower_than_committed": (_next_args(inputs=T([[1, 2, 1]]), committed=T([[2, 3, 4]]),
                                                       next_drafts=T([[4]])), "inputs"),
    "next_drafts_missing": (_next_args(next_drafts=None), "next_drafts"),
    "next_inputs_strided": (_next_args(inputs=T([[1, 9, 2, 9, 1, 9]])[:, ::2]), "inputs"),
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
from tests.kernels.test_kernels import _greedy_args, _next_args, _rejection_args, _slots_args
for make in (_greedy_args, _rejection_args, _slots_args, _next_args):
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
