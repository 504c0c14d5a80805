"""static_attention (rotary + paged KV write + attention in one launch) against its torch reference,
and the reference against the engine's own path (rotary, StaticAttention's KV write and masked SDPA)."""

from __future__ import annotations

import pytest
import torch

from engine.attention.static import StaticAttention
from engine.config import RopeScaling
from engine.kv_cache import PagedKVCache
from engine.models.layers import RotaryEmbedding, apply_rotary
from kernels.static_attention import static_attention, static_attention_reference

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=4e-3, rtol=4e-3)}


def _case(rows: int, q_len: int, kv_lens: list[int], dtype: torch.dtype, hq: int = 9, hkv: int = 3, d: int = 64,
          bs: int = 16, blocks: int = 40, seed: int = 0, width: int = 0):
    g = torch.Generator().manual_seed(seed)
    m = max(max(-(-n // bs) for n in kv_lens) + 1, width)  # width: a bucket's table, wider than its rows need
    # each row owns distinct, shuffled blocks; unused table entries point at block 0 (scratch)
    perm = torch.randperm(blocks - 1, generator=g) + 1
    table = torch.zeros(rows, m, dtype=torch.long)
    used = 0
    for b, n in enumerate(kv_lens):
        nb = -(-n // bs)
        table[b, :nb] = perm[used: used + nb]
        used += nb
    t = rows * q_len
    q = torch.randn(t, hq, d, generator=g).to(dtype)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g).to(dtype)  # k and v as strided views, as the model has them
    k = qkv[:, hq * d:(hq + hkv) * d].view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(t, hkv, d)
    rope = RotaryEmbedding(d, 4096, 10000.0, RopeScaling())
    lens = torch.tensor(kv_lens)
    pos = (lens[:, None] - q_len + torch.arange(q_len)[None, :]).reshape(-1)
    cos, sin = rope.lookup(pos)
    k_cache = torch.randn(blocks, bs, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(blocks, bs, hkv, d, generator=g).to(dtype)
    return q, k, v, cos, sin, k_cache, v_cache, table, lens


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("q_len,kv_lens,splits", [(1, [1, 17, 100], 1), (5, [5, 40, 33, 129], 1), (9, [64], 1),
                                                  (1, [1, 17, 200], 3), (5, [5, 70, 150], 2), (9, [64, 9], 4)])
def test_static_attention_matches_reference(dtype, q_len, kv_lens, splits):
    q, k, v, cos, sin, kc, vc, table, lens = _case(len(kv_lens), q_len, kv_lens, dtype)
    kc2, vc2 = kc.clone(), vc.clone()
    got = static_attention(q, k, v, cos, sin, kc, vc, table, lens, q_len, splits)
    want = static_attention_reference(q, k, v, cos, sin, kc2, vc2, table, lens, q_len)
    torch.testing.assert_close(got, want, **TOL[dtype])
    torch.testing.assert_close(kc, kc2, **TOL[dtype])  # the same slots written with the same rotated keys
    assert torch.equal(vc, vc2)


@pytest.mark.parametrize("q_len,kv_lens,splits", [(1, [1, 17, 300], 8), (5, [5, 70, 150], 6), (5, [130, 64], 3)])
def test_splits_divide_each_rows_own_keys_in_a_wide_bucket(q_len, kv_lens, splits):
    """A bucket's table holds 1,024 tokens a row and its rows far fewer: each split takes a share of its row's
    own keys (some splits of a short row none), and the merged softmax is the reference's."""
    q, k, v, cos, sin, kc, vc, table, lens = _case(len(kv_lens), q_len, kv_lens, torch.float32, width=64)
    kc2, vc2 = kc.clone(), vc.clone()
    got = static_attention(q, k, v, cos, sin, kc, vc, table, lens, q_len, splits)
    want = static_attention_reference(q, k, v, cos, sin, kc2, vc2, table, lens, q_len)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    torch.testing.assert_close(kc, kc2, **TOL[torch.float32])


def test_reference_is_the_engines_static_path():
    """Rotary in the model + StaticAttention's torch path (KV write, gather, masked SDPA) = the reference."""
    rows, q_len, d = 3, 5, 64
    kv_lens = [5, 21, 50]
    cache = PagedKVCache(1, 3, d, 1024, 16, torch.float32, "cpu")
    seqs = [f"s{i}" for i in range(rows)]
    for s, n in zip(seqs, kv_lens):
        cache.allocator.extend(s, n)
    from engine.attention.base import AttentionMetadata

    slots = [x for s, n in zip(seqs, kv_lens) for x in cache.allocator.slots(s, n - q_len, n)]
    meta = AttentionMetadata(tuple([q_len] * rows), tuple(kv_lens),
                             tuple(tuple(cache.allocator.block_table(s)) for s in seqs), torch.tensor(slots))
    static = StaticAttention(cache, 9, rows, q_len, 4, scratch_block=63, use_kernel=False)
    static.load(meta)
    static.prepare()
    g = torch.Generator().manual_seed(3)
    torch.nn.init.normal_(cache.k, generator=g)
    torch.nn.init.normal_(cache.v, generator=g)
    q, k, v = (torch.randn(rows * q_len, h, d, generator=g) for h in (9, 3, 3))
    rope = RotaryEmbedding(d, 4096, 10000.0, RopeScaling())
    pos = torch.tensor([p for n in kv_lens for p in range(n - q_len, n)])
    cos, sin = rope.lookup(pos)
    kc, vc = cache.k[0].clone(), cache.v[0].clone()
    want = static_attention_reference(q, k, v, cos, sin, kc, vc, static.block_table, static.kv_lens, q_len)
    got = static.forward(0, apply_rotary(q, (cos, sin)), apply_rotary(k, (cos, sin)), v)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(cache.k[0], kc) and torch.equal(cache.v[0], vc)


def test_split_plan_fills_the_gpu_without_splits_shorter_than_a_step():
    from kernels.static_attention import BLOCK_N, split_plan

    assert split_plan(1, 3, 512) == 8                # one decode row: a program per 64 keys at capacity
    assert split_plan(64, 3, 512) == 2               # 192 (row, head) programs: nearly enough already
    assert split_plan(256, 3, 2048) == 1
    for rows, ctx in ((1, 8192), (4, 2048), (16, 32768)):
        splits, steps = split_plan(rows, 3, ctx), -(-ctx // BLOCK_N)
        per = -(-steps // splits)                    # steps a split at capacity: every split has at least one
        assert 1 <= splits <= steps and (splits - 1) * per < steps <= splits * per


def test_bad_arguments_are_named():
    q, k, v, cos, sin, kc, vc, table, lens = _case(2, 1, [3, 4], torch.float32)
    with pytest.raises(ValueError, match="q must have shape"):
        static_attention(q[:1], k, v, cos, sin, kc, vc, table, lens, 1)
    with pytest.raises(ValueError, match="kv_lens must be torch.int64"):
        static_attention(q, k, v, cos, sin, kc, vc, table, lens.int(), 1)
    with pytest.raises(ValueError, match="k_cache must be torch.float32"):
        static_attention(q, k, v, cos, sin, kc.half(), vc, table, lens, 1)
    with pytest.raises(ValueError, match="head dimension"):
        static_attention(q[..., :48], k[..., :48], v[..., :48], cos, sin, kc, vc, table, lens, 1)


def _tree_case(tree, kv_lens, dtype, seed=1):
    """A verify of t0 and a draft tree's nodes a row: rotary positions by depth, KV slots by node."""
    from engine.rounds.tree import DraftTree

    t = DraftTree(tree)
    q_len = t.nodes + 1
    q, k, v, _, _, kc, vc, table, lens = _case(len(kv_lens), q_len, kv_lens, dtype, seed=seed)
    rope = RotaryEmbedding(q.shape[-1], 4096, 10000.0, RopeScaling())
    pos = (lens[:, None] - q_len + torch.tensor(t.depths)[None, :]).reshape(-1)
    cos, sin = rope.lookup(pos)
    return t, q_len, (q, k, v, cos, sin, kc, vc, table, lens)


@pytest.mark.parametrize("tree,kv_lens,splits", [((2, 2, 1), [11, 40, 133], 1), ((3, 2, 1, 1), [22, 90], 3),
                                                 ((1, 1, 1, 1), [5, 64], 2)])
def test_a_draft_trees_verify_matches_the_reference(tree, kv_lens, splits):
    t, q_len, (q, k, v, cos, sin, kc, vc, table, lens) = _tree_case(tree, kv_lens, torch.float32)
    bits = t.ancestor_mask("cpu")
    kc2, vc2 = kc.clone(), vc.clone()
    got = static_attention(q, k, v, cos, sin, kc, vc, table, lens, q_len, splits, bits)
    want = static_attention_reference(q, k, v, cos, sin, kc2, vc2, table, lens, q_len, bits)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    torch.testing.assert_close(kc, kc2, **TOL[torch.float32])


def test_a_tree_node_attends_as_its_own_chain_would():
    """Node i of a tree, attending to the cached keys, the root and its ancestors, is the causal attention of the chain
    root .. i alone (the same tokens at the same positions, written to consecutive slots): the tree's mask hides
    every other branch. A chain-shaped tree is the causal mask itself."""
    t, q_len, (q, k, v, cos, sin, kc, vc, table, lens) = _tree_case((2, 2, 1), [30], torch.float32)
    got = static_attention_reference(q, k, v, cos, sin, kc.clone(), vc.clone(), table, lens, q_len,
                                     t.ancestor_mask("cpu"))
    for node in range(1, q_len):
        chain = [i for i in range(q_len) if t.ancestor_bits[node] >> i & 1]  # root .. node, by depth
        n = len(chain)
        base = int(lens[0]) - q_len
        want = static_attention_reference(q[chain], k[chain], v[chain], cos[chain], sin[chain], kc.clone(),
                                          vc.clone(), table, torch.tensor([base + n]), n)
        torch.testing.assert_close(got[node], want[-1], atol=1e-5, rtol=1e-5)
    causal = static_attention_reference(q[:5], k[:5], v[:5], cos[:5], sin[:5], kc.clone(), vc.clone(), table,
                                        torch.tensor([20]), 5)
    from engine.rounds.tree import DraftTree

    chain = static_attention_reference(q[:5], k[:5], v[:5], cos[:5], sin[:5], kc.clone(), vc.clone(), table,
                                       torch.tensor([20]), 5, DraftTree((1, 1, 1, 1)).ancestor_mask("cpu"))
    torch.testing.assert_close(chain, causal, atol=0, rtol=0)
