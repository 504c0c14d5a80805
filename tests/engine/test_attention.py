"""The torch reference backend against dense causal attention, for prefill, decode and verify."""

import math

import pytest
import torch

from engine.attention.base import AttentionMetadata
from engine.attention.torch_ref import TorchAttention
from engine.kv_cache import PagedKVCache

HQ, HKV, D, BS = 6, 2, 8, 4


def dense_attention(q, k, v):
    # q: [n, Hq, D]; k, v: [n, Hkv, D]; causal over the whole sequence
    group = HQ // HKV
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
    n = q.shape[0]
    scores = scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def run(backend, cache, seqs, chunks):
    """seqs: id -> full q/k/v; chunks: list of (id, start, end) appended this forward."""
    alloc = cache.allocator
    slots, qs, ks, vs = [], [], [], []
    for sid, s, e in chunks:
        alloc.extend(sid, e)
        slots += alloc.slots(sid, s, e)
        q, k, v = seqs[sid]
        qs.append(q[s:e]), ks.append(k[s:e]), vs.append(v[s:e])
    meta = AttentionMetadata(q_lens=tuple(e - s for _, s, e in chunks), kv_lens=tuple(e for _, _, e in chunks),
                             block_tables=tuple(tuple(alloc.block_table(sid)) for sid, _, _ in chunks),
                             slot_mapping=torch.tensor(slots))
    backend.plan(meta)
    return backend.forward(0, torch.cat(qs), torch.cat(ks), torch.cat(vs))


def test_prefill_decode_verify_match_dense():
    torch.manual_seed(0)
    cache = PagedKVCache(1, HKV, D, num_tokens=128, block_size=BS, dtype=torch.float32, device="cpu")
    backend = TorchAttention(cache, HQ)
    lens = {"a": 11, "b": 3, "c": 17}
    seqs = {s: (torch.randn(n, HQ, D), torch.randn(n, HKV, D), torch.randn(n, HKV, D)) for s, n in lens.items()}
    ref = {s: dense_attention(*t) for s, t in seqs.items()}
    # prefill of different lengths in one batch
    out = run(backend, cache, seqs, [("a", 0, 6), ("b", 0, 2), ("c", 0, 9)])
    torch.testing.assert_close(out, torch.cat([ref["a"][:6], ref["b"][:2], ref["c"][:9]]))
    # decode: one token each
    out = run(backend, cache, seqs, [("a", 6, 7), ("b", 2, 3), ("c", 9, 10)])
    torch.testing.assert_close(out, torch.cat([ref["a"][6:7], ref["b"][2:3], ref["c"][9:10]]))
    # verify: k+1 tokens each, causal among themselves, crossing block boundaries
    out = run(backend, cache, seqs, [("a", 7, 11), ("c", 10, 17)])
    torch.testing.assert_close(out, torch.cat([ref["a"][7:11], ref["c"][10:17]]))


def test_rollback_then_rewrite():
    """Rejected drafts are truncated away; new tokens at those positions see only the new KV."""
    torch.manual_seed(1)
    cache = PagedKVCache(1, HKV, D, num_tokens=64, block_size=BS, dtype=torch.float32, device="cpu")
    backend = TorchAttention(cache, HQ)
    q, k, v = torch.randn(10, HQ, D), torch.randn(10, HKV, D), torch.randn(10, HKV, D)
    wrong = {"x": (q, torch.randn(10, HKV, D), torch.randn(10, HKV, D))}
    run(backend, cache, {"x": (q, k, v)}, [("x", 0, 5)])
    run(backend, cache, wrong, [("x", 5, 9)])        # drafts that get rejected
    cache.allocator.truncate("x", 5)
    out = run(backend, cache, {"x": (q, k, v)}, [("x", 5, 10)])
    torch.testing.assert_close(out, dense_attention(q, k, v)[5:10])


def test_whole_prompts_attending_to_their_own_keys_equal_the_gathered_pages():
    """StaticAttention(own_keys=True) (a prefill-graph bucket of whole prompts): each padded row attends causally to
    the keys it writes, no gather; its real queries get what the gathered pages and a mask give, the padding rows
    (after every real token, and a row of scratch) change nothing, and the KV it writes decodes on exactly."""
    from engine.attention.static import StaticAttention

    torch.manual_seed(0)
    rows, q_len, lens = 3, 8, {"a": 5, "b": 7}  # the third row is padding
    seqs = {s: (torch.randn(n + 1, HQ, D), torch.randn(n + 1, HKV, D), torch.randn(n + 1, HKV, D))
            for s, n in lens.items()}
    ref = {s: dense_attention(*t) for s, t in seqs.items()}

    def padded(i: int) -> torch.Tensor:  # [rows * q_len, H, D]: each prompt, then random padding
        parts = []
        for s in ("a", "b", None):
            n = lens.get(s, 0)
            h = HQ if i == 0 else HKV
            parts += ([seqs[s][i][:n]] if n else []) + [torch.randn(q_len - n, h, D)]
        return torch.cat(parts)

    q, k, v = padded(0), padded(1), padded(2)
    outs = {}
    for own in (True, False):
        cache = PagedKVCache(1, HKV, D, num_tokens=128, block_size=BS, dtype=torch.float32, device="cpu")
        alloc = cache.allocator
        alloc.extend("pad", 1)
        for s, n in lens.items():
            alloc.extend(s, n)
        attn = StaticAttention(cache, HQ, rows, q_len, max_blocks=q_len // BS if own else 64 // BS,
                               scratch_block=alloc.block_table("pad")[0], use_kernel=False, own_keys=own)
        attn.set_rows([alloc.block_table(s) for s in lens], [q_len] * len(lens))
        attn.prepare()
        outs[own] = out = attn.forward(0, q, k, v)
        for i, (s, n) in enumerate(lens.items()):
            torch.testing.assert_close(out[i * q_len: i * q_len + n], ref[s][:n])
        # the next token of each, decoded over what the bucket wrote (its padding keys past the length unseen)
        backend = TorchAttention(cache, HQ)
        got = run(backend, cache, seqs, [(s, n, n + 1) for s, n in lens.items()])
        torch.testing.assert_close(got, torch.cat([ref[s][n:n + 1] for s, n in lens.items()]))
    real = torch.cat([torch.arange(i * q_len, i * q_len + n) for i, n in enumerate(lens.values())])
    torch.testing.assert_close(outs[True][real], outs[False][real])
    with pytest.raises(ValueError, match="own_keys"):  # the Triton launch reads the cache itself
        StaticAttention(cache, HQ, rows, q_len, 2, 0, use_kernel=True, own_keys=True)


def test_a_bucket_uploads_exactly_the_tables_it_is_given_round_after_round():
    """The block table on the device equals the tables of the last set_rows, row by row, padding rows holding the
    scratch block: across a table grown in place (the allocator's own list), rows that move, shrink and leave."""
    from engine.attention.static import StaticAttention

    cache = PagedKVCache(1, HKV, D, num_tokens=256, block_size=BS, dtype=torch.float32, device="cpu")
    alloc = cache.allocator
    alloc.extend("pad", 1)
    scratch = alloc.block_table("pad")[0]
    attn = StaticAttention(cache, HQ, 3, 1, max_blocks=6, scratch_block=scratch, use_kernel=False)
    step = StaticAttention(cache, HQ, 3, 1, max_blocks=6, scratch_block=scratch, use_kernel=False)
    step.share_table(attn)
    for sid, n in (("a", 9), ("b", 2), ("c", 17)):
        alloc.extend(sid, n)

    def expect(*sids):
        want = torch.full((3, 6), scratch, dtype=torch.long)
        for i, sid in enumerate(sids):
            t = alloc.block_table(sid)
            want[i, :len(t)] = torch.tensor(t)
        return want

    rounds = [("a", "b"), ("a", "b"), ("b", "a", "c"), ("c",), ("a", "c"), ()]
    for i, sids in enumerate(rounds):
        if i == 1:
            alloc.extend("a", 13)  # the same list object, grown by a block
        attn.set_rows([alloc.block_table(s) for s in sids], [1] * len(sids))
        assert torch.equal(attn.block_table, expect(*sids)), sids
        assert step.block_table is attn.block_table
    alloc.extend("c", 6 * BS + 1)  # a table longer than the bucket's: refused, nothing changed
    with pytest.raises(ValueError, match="do not fit the bucket"):
        attn.set_rows([alloc.block_table("a"), alloc.block_table("c")], [1, 1])
    attn.set_rows([alloc.block_table("a")], [1])
    assert torch.equal(attn.block_table, expect("a"))
