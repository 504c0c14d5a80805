"""KV slots and positions of the tokens a batch appends to a paged cache, in one launch.

Sequence b appends tokens ``cu_q[b] .. cu_q[b+1]`` of the flat batch (``cu_q``: the
exclusive prefix sum of the per-sequence token counts, ``cu_q[0] == 0``, non-decreasing).
Its j-th token sits at position ``p = start[b] + j`` and lives in slot
``block_tables[b, p // block_size] * block_size + p % block_size`` (the layout of
``engine.kv_cache``). A token whose block is past the table or is a padding entry (< 0)
gets ``PAD_SLOT_ID``; so do the tokens of a padded tail (``num_tokens > cu_q[-1]``, e.g. a
CUDA-graph bucket), whose positions are 0. Reference: ``kv_slots_reference``.

One program per block of tokens; it finds its tokens' sequences by comparing them with every
sequence end in one [tokens, B] tile of at most ``TILE`` elements, so B <= ``MAX_BATCH``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_int, check_launchable, check_tensor, pow2_at_least

PAD_SLOT_ID = -1   # slot of a token that has no cache slot: writes to it are skipped
MAX_BATCH = 1024   # sequences per call: all sequence ends are compared in one tile
MAX_BLOCK_T = 64   # tokens per program
TILE = 4096        # tokens x sequences compared per program


def kv_slots_reference(
    block_tables: torch.Tensor,  # [B, max_blocks] int32, padded with -1
    start: torch.Tensor,         # [B] int64: position of each sequence's first new token
    cu_q: torch.Tensor,          # [B+1] int64: exclusive prefix sum of the new-token counts
    block_size: int,
    num_tokens: int | None = None,  # output length; None: cu_q[-1]
) -> tuple[torch.Tensor, torch.Tensor]:  # slot_mapping [num_tokens] int64, positions [num_tokens] int64
    dev = block_tables.device
    total = int(cu_q[-1])
    num_tokens = total if num_tokens is None else num_tokens
    seq = torch.repeat_interleave(torch.arange(len(start), device=dev), cu_q.diff())  # [total]
    pos = start[seq] + torch.arange(total, device=dev) - cu_q[seq]
    max_blocks = block_tables.shape[1]
    table = torch.nn.functional.pad(block_tables.long(), (0, 1), value=-1)  # column max_blocks: past the table
    entry = table[seq, (pos // block_size).clamp(0, max_blocks)]
    slot = torch.where((pos >= 0) & (entry >= 0), entry * block_size + pos % block_size, PAD_SLOT_ID)
    slots = torch.full((num_tokens,), PAD_SLOT_ID, dtype=torch.int64, device=dev)
    positions = torch.zeros((num_tokens,), dtype=torch.int64, device=dev)
    n = min(total, num_tokens)
    slots[:n], positions[:n] = slot[:n], pos[:n]
    return slots, positions


@triton.jit
def _kv_slots_kernel(
    table_ptr,   # [B, max_blocks] int32
    start_ptr,   # [B] int64
    cu_q_ptr,    # [B+1] int64
    slot_ptr,    # [num_tokens] int64
    pos_ptr,     # [num_tokens] int64
    B, max_blocks, block_size, num_tokens,
    PAD_SLOT: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_B: tl.constexpr,  # power of two >= B
):
    tok = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_out = tok < num_tokens
    seqs = tl.arange(0, BLOCK_B)
    ends = tl.load(cu_q_ptr + 1 + seqs, mask=seqs < B, other=num_tokens)      # cu_q[b+1]
    # a token's sequence: how many sequences end at or before it (B: the padded tail)
    seq = tl.sum((ends[None, :] <= tok[:, None]).to(tl.int32), axis=1)
    live = in_out & (seq < B)
    first = tl.load(cu_q_ptr + seq, mask=live, other=0)
    pos = tl.load(start_ptr + seq, mask=live, other=0) + tok - first
    blk = pos // block_size
    in_table = live & (pos >= 0) & (blk < max_blocks)
    entry = tl.load(table_ptr + seq.to(tl.int64) * max_blocks + blk, mask=in_table, other=-1).to(tl.int64)
    slot = tl.where(in_table & (entry >= 0), entry * block_size + pos % block_size, PAD_SLOT)
    tl.store(slot_ptr + tok, slot, mask=in_out)
    tl.store(pos_ptr + tok, tl.where(live, pos, 0), mask=in_out)


def kv_slots(
    block_tables: torch.Tensor,  # [B, max_blocks] int32, padded with -1
    start: torch.Tensor,         # [B] int64: position of each sequence's first new token
    cu_q: torch.Tensor,          # [B+1] int64: exclusive prefix sum of the new-token counts
    block_size: int,
    num_tokens: int | None = None,  # output length (no host sync when given); None: cu_q[-1]
) -> tuple[torch.Tensor, torch.Tensor]:  # slot_mapping [num_tokens] int64, positions [num_tokens] int64
    check_tensor("block_tables", block_tables, torch.int32, (None, None))
    b, max_blocks = block_tables.shape
    dev = block_tables.device
    check_tensor("start", start, torch.int64, (b,), dev)
    check_tensor("cu_q", cu_q, torch.int64, (b + 1,), dev)
    check_int("block_size", block_size, 1)
    if b > MAX_BATCH:
        raise ValueError(f"block_tables must have at most {MAX_BATCH} rows (sequences per call), got {b}")
    if num_tokens is None:
        num_tokens = int(cu_q[-1])
    check_int("num_tokens", num_tokens, 0)
    check_launchable(_kv_slots_kernel, dev)
    slots = torch.empty((num_tokens,), dtype=torch.int64, device=dev)
    positions = torch.empty((num_tokens,), dtype=torch.int64, device=dev)
    if num_tokens:
        block_b = pow2_at_least(b)
        block_t = min(MAX_BLOCK_T, max(1, TILE // block_b))
        _kv_slots_kernel[(triton.cdiv(num_tokens, block_t),)](
            block_tables.contiguous(), start.contiguous(), cu_q.contiguous(), slots, positions,
            b, max_blocks, block_size, num_tokens,
            PAD_SLOT=PAD_SLOT_ID, BLOCK_T=block_t, BLOCK_B=block_b)
    return slots, positions
