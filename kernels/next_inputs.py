"""The next round's inputs from this round's verdict, in place, in one launch and without a host sync.

What a fused round launched ahead reads (``engine.rounds.fused``): row b of a round ran with its last
committed token t0 and W drafts in ``inputs[b, :W+1]`` (``inputs[b, W+1]``: how many of them to verify,
left as it is; W is k, or a draft tree's nodes) and a KV length ``kv_lens[b]`` = L + W + 1. Verification
committed ``committed[b, :num_accepted[b] + 1]`` (accepted drafts, then the recovered or bonus token; K + 1
columns, K <= W), and the drafter made ``next_drafts[b]``. Then, for every *live* row (``kv_lens[b] > W + 1``;
a padding row holds exactly its W + 1 tokens and is left alone):

- ``inputs[b, 0] = committed[b, num_accepted[b]]``, the one committed token the target has not seen;
- ``inputs[b, 1:W+1] = next_drafts[b]``;
- ``kv_lens[b] += num_accepted[b] + 1``: the next round's KV length, L' + W + 1 with L' = L + a + 1.

``num_accepted`` must lie in [0, K] (what verification returns); the kernel clamps the index so it never
reads outside ``committed``. Reference: ``next_inputs_reference`` (the same steps in torch, out of place).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_launchable, check_tensor, pow2_at_least


def next_inputs_reference(
    inputs: torch.Tensor,              # [R, W+2] int64
    kv_lens: torch.Tensor,             # [R] int64
    committed: torch.Tensor,           # [R, K+1] int64, K <= W
    num_accepted: torch.Tensor,        # [R] int64
    next_drafts: torch.Tensor | None,  # [R, W] int64; None when W == 0
) -> tuple[torch.Tensor, torch.Tensor]:  # the new inputs [R, W+2], kv_lens [R]
    k, w = committed.shape[1] - 1, inputs.shape[1] - 2
    live = kv_lens > w + 1
    nxt = committed.gather(1, num_accepted.clamp(0, k)[:, None])
    if next_drafts is not None:
        nxt = torch.cat([nxt, next_drafts], dim=1)
    out = inputs.clone()
    out[:, : w + 1] = torch.where(live[:, None], nxt, inputs[:, : w + 1])
    return out, torch.where(live, kv_lens + num_accepted + 1, kv_lens)


@triton.jit
def _next_inputs_kernel(
    inputs_ptr,        # [R, W+2] int64, row stride stride_i
    kv_ptr,            # [R] int64
    committed_ptr,     # [R, K+1] int64, row stride stride_c
    num_accepted_ptr,  # [R] int64
    drafts_ptr,        # [R, W] int64, row stride stride_d (unused when W == 0)
    K, W, stride_i, stride_c, stride_d,
    BLOCK: tl.constexpr,  # power of two >= W + 1
):
    row = tl.program_id(0).to(tl.int64)
    kv = tl.load(kv_ptr + row)
    if kv > W + 1:  # a live row (padding rows hold exactly W + 1 tokens)
        n = tl.load(num_accepted_ptr + row)
        last = tl.load(committed_ptr + row * stride_c + tl.minimum(tl.maximum(n, 0), K))
        cols = tl.arange(0, BLOCK)
        drafts = tl.load(drafts_ptr + row * stride_d + cols - 1, mask=(cols >= 1) & (cols <= W), other=0)
        tl.store(inputs_ptr + row * stride_i + cols, tl.where(cols == 0, last, drafts), mask=cols <= W)
        tl.store(kv_ptr + row, kv + n + 1)


def next_inputs(
    inputs: torch.Tensor,              # [R, W+2] int64, updated in place (columns contiguous), W >= K
    kv_lens: torch.Tensor,             # [R] int64, updated in place (contiguous)
    committed: torch.Tensor,           # [R, K+1] int64: this round's output ids
    num_accepted: torch.Tensor,        # [R] int64 in [0, K]
    next_drafts: torch.Tensor | None,  # [R, W] int64: the drafter's next drafts; None when W == 0
) -> None:
    check_tensor("committed", committed, torch.int64, (None, None))
    r, k1 = committed.shape
    dev = committed.device
    if k1 < 1:
        raise ValueError(f"committed must have K+1 >= 1 columns, got {list(committed.shape)}")
    k = k1 - 1
    check_tensor("inputs", inputs, torch.int64, (r, None), dev)
    w = inputs.shape[1] - 2
    if w < k:
        raise ValueError(f"inputs must have K+2 = {k + 2} columns or more (t0, the drafts, how many to verify), "
                         f"got {list(inputs.shape)}")
    check_tensor("kv_lens", kv_lens, torch.int64, (r,), dev)
    check_tensor("num_accepted", num_accepted, torch.int64, (r,), dev)
    if (next_drafts is None) != (w == 0):
        raise ValueError(f"next_drafts must be given exactly when W > 0 (W = {w}), got "
                         f"{'None' if next_drafts is None else list(next_drafts.shape)}")
    if next_drafts is not None:
        check_tensor("next_drafts", next_drafts, torch.int64, (r, w), dev)
    if inputs.stride(1) != 1 or kv_lens.stride(0) != 1:
        raise ValueError("inputs (columns) and kv_lens must be contiguous: they are updated in place")
    check_launchable(_next_inputs_kernel, dev)
    if not r:
        return
    drafts = committed if next_drafts is None else next_drafts
    if w > 1 and drafts.stride(1) != 1:
        drafts = drafts.contiguous()
    if k and committed.stride(1) != 1:
        committed = committed.contiguous()
    _next_inputs_kernel[(r,)](inputs, kv_lens, committed, num_accepted.contiguous(), drafts, k, w, inputs.stride(0),
                              committed.stride(0), drafts.stride(0), BLOCK=pow2_at_least(w + 1))
