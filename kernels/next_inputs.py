"""The next round's inputs from this round's verdict, in one launch and without a host sync.

Contract. Before the round row b had ``seq_lens[b]`` committed tokens, all but the last in
the target's KV (``engine.spec``'s invariant). Verification (``greedy_accept``, or rejection
sampling) commits ``output_ids[b, :num_accepted[b] + 1]``: the accepted drafts, then the
recovered or bonus token at index ``num_accepted[b]``. So after the round

- ``new_seq_lens = seq_lens + num_accepted + 1`` tokens are committed;
- ``last_token = output_ids[b, num_accepted[b]]`` is the one committed token the target has
  not seen: the next round feeds it (then its drafts) at position ``new_seq_lens - 1``,
  which is also the length the target's KV is rolled back to.

``num_accepted`` must lie in [0, K] (what verification returns); the kernel clamps the index
so it never reads outside ``output_ids``. Reference: ``next_inputs_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_launchable, check_tensor

BLOCK_B = 128  # rows per program


def next_inputs_reference(
    output_ids: torch.Tensor,    # [B, K+1] int64
    num_accepted: torch.Tensor,  # [B] int64
    seq_lens: torch.Tensor,      # [B] int64: committed tokens before the round
) -> tuple[torch.Tensor, torch.Tensor]:  # last_token [B] int64, new_seq_lens [B] int64
    last_token = output_ids.gather(1, num_accepted.unsqueeze(1)).squeeze(1)
    return last_token, seq_lens + num_accepted + 1


@triton.jit
def _next_inputs_kernel(
    output_ids_ptr,    # [B, K+1] int64
    num_accepted_ptr,  # [B] int64
    seq_lens_ptr,      # [B] int64
    last_token_ptr,    # [B] int64
    new_seq_lens_ptr,  # [B] int64
    B, K1,
    BLOCK_B: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    live = rows < B
    n = tl.load(num_accepted_ptr + rows, mask=live, other=0)
    col = tl.minimum(tl.maximum(n, 0), K1 - 1)
    last = tl.load(output_ids_ptr + rows * K1 + col, mask=live, other=0)
    tl.store(last_token_ptr + rows, last, mask=live)
    tl.store(new_seq_lens_ptr + rows, tl.load(seq_lens_ptr + rows, mask=live, other=0) + n + 1, mask=live)


def next_inputs(
    output_ids: torch.Tensor,    # [B, K+1] int64: accepted drafts, recovered/bonus token, placeholders
    num_accepted: torch.Tensor,  # [B] int64 in [0, K]
    seq_lens: torch.Tensor,      # [B] int64: committed tokens before the round
) -> tuple[torch.Tensor, torch.Tensor]:  # last_token [B] int64, new_seq_lens [B] int64
    check_tensor("output_ids", output_ids, torch.int64, (None, None))
    b, k1 = output_ids.shape
    dev = output_ids.device
    if k1 < 1:
        raise ValueError(f"output_ids must have K+1 >= 1 columns, got {list(output_ids.shape)}")
    check_tensor("num_accepted", num_accepted, torch.int64, (b,), dev)
    check_tensor("seq_lens", seq_lens, torch.int64, (b,), dev)
    check_launchable(_next_inputs_kernel, dev)
    last_token = torch.empty((b,), dtype=torch.int64, device=dev)
    new_seq_lens = torch.empty((b,), dtype=torch.int64, device=dev)
    if b:
        _next_inputs_kernel[(triton.cdiv(b, BLOCK_B),)](
            output_ids.contiguous(), num_accepted.contiguous(), seq_lens.contiguous(), last_token, new_seq_lens,
            b, k1, BLOCK_B=BLOCK_B)
    return last_token, new_seq_lens
