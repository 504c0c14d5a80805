"""Attention of a static (CUDA-graph) bucket: rotary, KV write and attention in one launch per layer.

A bucket has ``B`` rows, each appending exactly ``Q`` tokens (1 for a decode step, k + 1 for a
verify) to a paged KV cache. Per row ``b``, KV head ``h`` and split ``s`` one program
1. rotates the row's ``Q`` new keys (Hugging Face rotate-half, float32, rounded to the cache
   dtype); split 0 writes them and the new values into their slots: position
   ``p = kv_lens[b] - Q + j`` of token j lives in slot
   ``block_table[b, p // block_size] * block_size + p % block_size``;
2. rotates the ``Q * G`` queries of the KV head's group (G = Hq / Hkv), rounded to q's dtype;
3. attends with an online softmax (float32 statistics, scale 1/sqrt(D)) over its chunk of the
   ``kv_lens[b] - Q`` keys cached before (all of them precede every query; the splits divide the row's own
   keys, in whole ``BLOCK_N`` steps, not the bucket's capacity), and split 0 also over
   the new keys from registers, causally (query j sees positions 0 .. p_j); the new keys are never
   read back from the cache.
With one split the program writes the output; with several (flash-decoding: a decode row alone
is too little work for one program to hide memory latency) each writes its partial softmax and
a second launch merges them. ``split_plan`` picks the split count once per bucket.

Everything it reads (block table, lengths, the rope rows) comes from tensors, so one capture
serves every replay. The separate steps it replaces (rotary, two index copies, a gather of
every page and a masked ``scaled_dot_product_attention``) are ``static_attention_reference``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from kernels._common import check_int, check_launchable, check_tensor, pow2_at_least

BLOCK_N = 64  # cached keys per step of the softmax loop
TARGET_PROGRAMS = 256  # (row, KV head, split) programs a bucket aims for: about two per SM of an H100


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; cos, sin [T, 1, D/2] float32 -> rotated, rounded to x's dtype."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def static_attention_reference(
    q: torch.Tensor,            # [B*Q, Hq, D] before rotary
    k: torch.Tensor,            # [B*Q, Hkv, D] before rotary
    v: torch.Tensor,            # [B*Q, Hkv, D]
    cos: torch.Tensor,          # [B*Q, 1, D/2] float32
    sin: torch.Tensor,          # [B*Q, 1, D/2] float32
    k_cache: torch.Tensor,      # [NB, BS, Hkv, D] written in place
    v_cache: torch.Tensor,      # [NB, BS, Hkv, D] written in place
    block_table: torch.Tensor,  # [B, M] int64
    kv_lens: torch.Tensor,      # [B] int64, each in [Q, M * BS]
    q_len: int,
    tree: torch.Tensor | None = None,  # [Q] int64: the new tokens each one sees, as bits (None: causal)
) -> torch.Tensor:              # [B*Q, Hq, D] q's dtype
    b, m = block_table.shape
    bs, hkv, d = k_cache.shape[1:]
    s = m * bs
    pos = (kv_lens[:, None] - q_len + torch.arange(q_len, device=q.device)[None, :]).reshape(-1)  # [B*Q]
    slots = block_table.repeat_interleave(q_len, 0).gather(1, (pos // bs)[:, None])[:, 0] * bs + pos % bs
    k_cache.view(-1, hkv, d).index_copy_(0, slots, _rotate(k, cos, sin).to(k_cache.dtype))
    v_cache.view(-1, hkv, d).index_copy_(0, slots, v.to(v_cache.dtype))
    keys = k_cache[block_table].view(b, s, hkv, d).transpose(1, 2)      # [B, Hkv, S, D]
    values = v_cache[block_table].view(b, s, hkv, d).transpose(1, 2)
    qs = _rotate(q, cos, sin).view(b, q_len, -1, d).transpose(1, 2)    # [B, Hq, Q, D]
    mask = tree_mask(torch.arange(s, device=q.device), pos.view(b, q_len), kv_lens - q_len, tree)[:, None]
    o = F.scaled_dot_product_attention(qs, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, enable_gqa=True)
    return o.transpose(1, 2).reshape(b * q_len, -1, d)


def tree_mask(cols: torch.Tensor,        # [S] key positions
              q_pos: torch.Tensor,       # [B, Q] each query's slot position
              start: torch.Tensor,       # [B] the first new token's position (kv_len - Q)
              tree: torch.Tensor | None  # [Q] int64 bits: the new tokens each query sees (None: causal)
              ) -> torch.Tensor:         # [B, Q, S] bool: which keys each query sees
    """Causal (key <= query), or with a tree: every key before the new tokens, and the new tokens its bits name."""
    if tree is None:
        return cols[None, None, :] <= q_pos[:, :, None]
    rel = cols[None, None, :] - start[:, None, None]                                   # [B, 1, S]
    bits = (tree[None, :, None] >> rel.clamp(0, 62)) & 1                               # [B, Q, S]
    return (rel < 0) | ((rel < tree.shape[0]) & bits.bool())


@triton.jit
def _softmax_step(acc, m_i, l_i, s, seen, v, sm_scale, IEEE: tl.constexpr):
    """One online-softmax update of (acc [M, D], m_i [M], l_i [M]) with scores s [M, N] and values v [N, D]."""
    s = tl.where(seen, s * sm_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet stay at zero
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _scores(q1, q2, k1, k2, IEEE: tl.constexpr):
    """[M, HALF] x2 . [N, HALF] x2 -> [M, N] float32 (the two rotary halves of one dot product)."""
    if IEEE:
        return tl.dot(q1, tl.trans(k1), input_precision="ieee") + tl.dot(q2, tl.trans(k2), input_precision="ieee")
    return tl.dot(q1, tl.trans(k1)) + tl.dot(q2, tl.trans(k2))


@triton.jit
def _cached_block(acc, m_i, l_i, start, old, table, kc_ptr, vc_ptr, h, rq1, rq2, live_r, sm_scale,
                  HKV: tl.constexpr, HALF: tl.constexpr, BS: tl.constexpr, BLOCK_N: tl.constexpr,
                  IEEE: tl.constexpr):
    """Attend to cached keys start .. start + BLOCK_N (those < old) through the row's block table."""
    half = tl.arange(0, HALF)
    full = tl.arange(0, 2 * HALF)
    n = start + tl.arange(0, BLOCK_N)
    live_n = n < old
    block = tl.load(table + n // BS, mask=live_n, other=0)
    src = (block * BS + n % BS)[:, None] * (HKV * 2 * HALF) + h * 2 * HALF
    k1 = tl.load(kc_ptr + src + half[None, :], mask=live_n[:, None], other=0.0)
    k2 = tl.load(kc_ptr + src + HALF + half[None, :], mask=live_n[:, None], other=0.0)
    v = tl.load(vc_ptr + src + full[None, :], mask=live_n[:, None], other=0.0)
    seen = live_r[:, None] & live_n[None, :]
    return _softmax_step(acc, m_i, l_i, _scores(rq1, rq2, k1, k2, IEEE), seen, v, sm_scale, IEEE)


@triton.jit
def _static_attention_kernel(
    q_ptr, k_ptr, v_ptr,        # [T, Hq, D], [T, Hkv, D], [T, Hkv, D]: strided tokens and heads, last dim contiguous
    cos_ptr, sin_ptr,           # [T, *, HALF] float32, last dim contiguous
    kc_ptr, vc_ptr,             # [NB, BS, Hkv, D] contiguous: one layer of the cache
    table_ptr,                  # [B, M] int64 contiguous
    lens_ptr,                   # [B] int64
    tree_ptr,                   # [Q] int64: the new tokens each sees, as bits (TREE)
    out_ptr,                    # [T, Hq, D] contiguous (SPLITS == 1)
    part_ptr,                   # [B, Hkv, SPLITS, BLOCK_M, D + 2] float32: acc, max, sum per split (SPLITS > 1)
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_rope,
    max_blocks, sm_scale,
    Q: tl.constexpr, G: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr, BS: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
    IEEE: tl.constexpr, PIPELINED: tl.constexpr, TREE: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2).to(tl.int64)
    D: tl.constexpr = 2 * HALF
    half = tl.arange(0, HALF)
    full = tl.arange(0, D)
    old = tl.load(lens_ptr + b) - Q  # keys already cached before this forward
    table = table_ptr + b * max_blocks
    dt = kc_ptr.dtype.element_ty
    first = split == 0  # split 0 writes the new keys and attends to them; every split takes its cached chunk

    # 1. the row's new keys (rotated) and values: kept in registers, written to their slots by split 0
    j = tl.arange(0, BLOCK_Q)
    live_j = (j < Q) & (old + j >= 0)
    t = b * Q + j
    pos = old + j
    rope = t[:, None] * stride_rope + half[None, :]
    cos = tl.load(cos_ptr + rope, mask=live_j[:, None], other=0.0)
    sin = tl.load(sin_ptr + rope, mask=live_j[:, None], other=0.0)
    kin = k_ptr + t[:, None] * stride_kt + h * stride_kh + half[None, :]
    k1 = tl.load(kin, mask=live_j[:, None], other=0.0).to(tl.float32)
    k2 = tl.load(kin + HALF, mask=live_j[:, None], other=0.0).to(tl.float32)
    nk1 = (k1 * cos - k2 * sin).to(dt)
    nk2 = (k2 * cos + k1 * sin).to(dt)
    nv = tl.load(v_ptr + t[:, None] * stride_vt + h * stride_vh + full[None, :], mask=live_j[:, None], other=0.0)
    write = (live_j & first)[:, None]
    block = tl.load(table + pos // BS, mask=live_j & first, other=0)
    dst = (block * BS + pos % BS)[:, None] * (HKV * D) + h * D
    tl.store(kc_ptr + dst + half[None, :], nk1, mask=write)
    tl.store(kc_ptr + dst + HALF + half[None, :], nk2, mask=write)
    tl.store(vc_ptr + dst + full[None, :], nv, mask=write)

    # 2. the group's queries, row r = token * G + head-in-group, rotated and rounded like the keys
    r = tl.arange(0, BLOCK_M)
    live_r = r < Q * G
    tq = b * Q + r // G
    hq = h * G + r % G
    rope = tq[:, None] * stride_rope + half[None, :]
    qcos = tl.load(cos_ptr + rope, mask=live_r[:, None], other=0.0)
    qsin = tl.load(sin_ptr + rope, mask=live_r[:, None], other=0.0)
    qin = q_ptr + tq[:, None] * stride_qt + hq[:, None] * stride_qh + half[None, :]
    q1 = tl.load(qin, mask=live_r[:, None], other=0.0).to(tl.float32)
    q2 = tl.load(qin + HALF, mask=live_r[:, None], other=0.0).to(tl.float32)
    rq1 = (q1 * qcos - q2 * qsin).to(dt)
    rq2 = (q2 * qcos + q1 * qsin).to(dt)

    # 3. online softmax over this split's cached keys (all of them precede every query), then the new
    #    keys causally (split 0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    # this split's share of the row's own cached keys: a row far shorter than its bucket's capacity (a context
    # bucket holds its longest row and the replay's later tokens) still spreads over every split
    chunk = tl.cdiv(tl.cdiv(old, BLOCK_N), SPLITS) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, old)
    if PIPELINED:  # a range() loop the compiler software-pipelines
        for start in tl.range(lo, hi, BLOCK_N):
            acc, m_i, l_i = _cached_block(acc, m_i, l_i, start, hi, table, kc_ptr, vc_ptr, h, rq1, rq2, live_r,
                                          sm_scale, HKV, HALF, BS, BLOCK_N, IEEE)
    else:  # the interpreter cannot take a loaded bound in range()
        start = lo
        while start < hi:
            acc, m_i, l_i = _cached_block(acc, m_i, l_i, start, hi, table, kc_ptr, vc_ptr, h, rq1, rq2, live_r,
                                          sm_scale, HKV, HALF, BS, BLOCK_N, IEEE)
            start += BLOCK_N
    if TREE:  # a draft tree: the new tokens each query's bits name (itself, its ancestors, the root)
        bits = tl.load(tree_ptr + r // G, mask=live_r, other=0)
        own = ((bits[:, None] >> j[None, :].to(tl.int64)) & 1) != 0
    else:
        own = j[None, :] <= (r // G)[:, None]
    seen = first & live_r[:, None] & live_j[None, :] & own
    acc, m_i, l_i = _softmax_step(acc, m_i, l_i, _scores(rq1, rq2, nk1, nk2, IEEE), seen, nv, sm_scale, IEEE)
    if SPLITS == 1:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        dst = out_ptr + (tq[:, None] * (G * HKV) + hq[:, None]) * D + full[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=live_r[:, None])
    else:
        part = part_ptr + ((b * HKV + h) * SPLITS + split) * BLOCK_M * (D + 2) + r * (D + 2)
        tl.store(part[:, None] + full[None, :], acc, mask=live_r[:, None])  # the group's rows, not the padding
        tl.store(part + D, m_i, mask=live_r)
        tl.store(part + D + 1, l_i, mask=live_r)


@triton.jit
def _combine_kernel(
    part_ptr,                   # [B, Hkv, SPLITS, BLOCK_M, D + 2] float32 from _static_attention_kernel
    out_ptr,                    # [T, Hq, D] contiguous
    Q: tl.constexpr, G: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
    SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Merge the splits' partial softmaxes of one query row (row b, KV head h, group row r) into its output.
    A program per query row, with every split loaded at once ([BLOCK_S, D]) and reduced across splits: one
    memory round trip of the row's own partials. (A program per (row, KV head) reading all BLOCK_M group rows,
    padding included, was a 4.7 us launch at batch 1 on the H100: three programs moving 16 rows each.)"""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    r = tl.program_id(2).to(tl.int64)   # token * G + head-in-group, < Q * G
    s = tl.arange(0, BLOCK_S)
    full = tl.arange(0, D)
    live_s = s < SPLITS
    part = part_ptr + ((b * HKV + h) * SPLITS + s) * BLOCK_M * (D + 2) + r * (D + 2)          # [S]
    m_s = tl.load(part + D, mask=live_s, other=float("-inf"))                                  # [S]
    l_s = tl.load(part + D + 1, mask=live_s, other=0.0)                                        # [S]
    acc_s = tl.load(part[:, None] + full[None, :], mask=live_s[:, None], other=0.0)            # [S, D]
    m = tl.max(m_s, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    c = tl.exp(m_s - m_safe)                                                                   # [S]
    l_run = tl.sum(l_s * c, axis=0)
    o = tl.sum(acc_s * c[:, None], axis=0) / tl.where(l_run > 0, l_run, 1.0)                   # [D]
    tq = b * Q + r // G
    hq = h * G + r % G
    tl.store(out_ptr + (tq * (G * HKV) + hq) * D + full, o.to(out_ptr.dtype.element_ty))


def split_plan(rows: int, kv_heads: int, max_tokens: int) -> int:
    """The splits of a bucket: enough programs to fill the GPU (about ``TARGET_PROGRAMS`` of (row, KV head, split)),
    no split shorter than one ``BLOCK_N`` step at the bucket's capacity. A bucket decides this once; the kernel then
    divides each row's own cached keys among its splits."""
    blocks = -(-max_tokens // BLOCK_N)
    splits = max(1, min(blocks, -(-TARGET_PROGRAMS // max(rows * kv_heads, 1))))
    per = -(-blocks // splits)  # BLOCK_N steps a split at capacity
    return -(-blocks // per)


def static_attention(
    q: torch.Tensor,            # [B*Q, Hq, D] before rotary; tokens and heads may be strided
    k: torch.Tensor,            # [B*Q, Hkv, D] before rotary
    v: torch.Tensor,            # [B*Q, Hkv, D]
    cos: torch.Tensor,          # [B*Q, 1, D/2] float32 (RotaryEmbedding.lookup), last dim contiguous
    sin: torch.Tensor,          # [B*Q, 1, D/2] float32, same row stride as cos
    k_cache: torch.Tensor,      # [NB, BS, Hkv, D] contiguous, written in place
    v_cache: torch.Tensor,      # [NB, BS, Hkv, D] contiguous, written in place
    block_table: torch.Tensor,  # [B, M] int64
    kv_lens: torch.Tensor,      # [B] int64: KV length of each row after this forward, in [Q, M * BS]
    q_len: int,
    splits: int = 1,            # programs per (row, KV head), each over a share of the row's cached keys (split_plan)
    tree: torch.Tensor | None = None,  # [Q] int64: the new tokens each sees, as bits (None: causal)
) -> torch.Tensor:              # [B*Q, Hq, D] contiguous, q's dtype
    check_int("q_len", q_len, 1)
    check_int("splits", splits, 1)
    check_tensor("block_table", block_table, torch.int64, (None, None))
    b, m = block_table.shape
    dev = block_table.device
    if not isinstance(q, torch.Tensor) or q.dim() != 3 or q.shape[0] != b * q_len:
        raise ValueError(f"q must have shape [{b * q_len}, Hq, D] (rows * q_len tokens), "
                         f"got {list(getattr(q, 'shape', []))}")
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"q must be float32, bfloat16 or float16, got {q.dtype}")
    t, hq, d = q.shape
    if d < 32 or d & (d - 1):
        raise ValueError(f"q's head dimension must be a power of two >= 32, got {d}")
    check_tensor("k_cache", k_cache, q.dtype, (None, None, None, d), dev)
    nb, bs, hkv, _ = k_cache.shape
    if hq % hkv:
        raise ValueError(f"k_cache has {hkv} KV heads, which do not divide q's {hq} heads")
    check_tensor("v_cache", v_cache, q.dtype, tuple(k_cache.shape), dev)
    check_tensor("k", k, q.dtype, (t, hkv, d), dev)
    check_tensor("v", v, q.dtype, (t, hkv, d), dev)
    check_tensor("cos", cos, torch.float32, (t, 1, d // 2), dev)
    check_tensor("sin", sin, torch.float32, (t, 1, d // 2), dev)
    if sin.stride(0) != cos.stride(0):
        raise ValueError(f"sin must have cos's row stride {cos.stride(0)}, got {sin.stride(0)}")
    check_tensor("kv_lens", kv_lens, torch.int64, (b,), dev)
    for name, x in (("q", q), ("k", k), ("v", v), ("cos", cos), ("sin", sin)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    if tree is not None:
        check_tensor("tree", tree, torch.int64, (q_len,), dev)
    check_launchable(_static_attention_kernel, dev)
    out = torch.empty((t, hq, d), dtype=q.dtype, device=dev)
    if b == 0:
        return out
    g = hq // hkv
    block_m = max(16, pow2_at_least(q_len * g))
    part = torch.empty((b, hkv, splits, block_m, d + 2) if splits > 1 else (1,), dtype=torch.float32, device=dev)
    _static_attention_kernel[(b, hkv, splits)](
        q, k, v, cos, sin, k_cache, v_cache, block_table.contiguous(), kv_lens.contiguous(),
        kv_lens if tree is None else tree, out, part,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0),
        m, 1.0 / math.sqrt(d),
        Q=q_len, G=g, HKV=hkv, HALF=d // 2, BS=bs, BLOCK_Q=max(16, pow2_at_least(q_len)), BLOCK_M=block_m,
        BLOCK_N=BLOCK_N, SPLITS=splits, IEEE=q.dtype == torch.float32,
        PIPELINED=not isinstance(_static_attention_kernel, InterpretedFunction), TREE=tree is not None)
    if splits > 1:
        _combine_kernel[(b, hkv, q_len * g)](part, out, Q=q_len, G=g, HKV=hkv, D=d, BLOCK_M=block_m, SPLITS=splits,
                                  BLOCK_S=pow2_at_least(splits))
    return out
