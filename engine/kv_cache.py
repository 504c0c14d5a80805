"""Paged KV cache: fixed-size blocks, a block table per sequence, rollback by truncation.

Storage is one tensor per layer for keys and one for values, each
``[num_blocks, block_size, num_kv_heads, head_dim]`` (flashinfer's NHD page layout).
Token ``p`` of a sequence lives in slot ``table[p // block_size] * block_size + p % block_size``.

Speculative rounds write KV for draft tokens that may be rejected; ``truncate()`` rolls a
sequence back to its committed length and returns whole blocks to the free list.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

GiB = 1 << 30
DEFAULT_KV_BYTES = {"cpu": 1 * GiB, "cuda": 8 * GiB}


def default_kv_tokens(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: str) -> int:
    """KV capacity in tokens that fits the default memory budget of the device (1 GiB cpu, 8 GiB cuda)."""
    per_token = 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8
    budget = DEFAULT_KV_BYTES["cpu" if str(device) == "cpu" else "cuda"]
    return max(1024, budget // per_token)


class KVCacheFull(RuntimeError):
    """No free block is left; admission control should have prevented this."""


@dataclass
class _Sequence:
    length: int = 0
    blocks: list[int] = field(default_factory=list)


class BlockAllocator:
    """Host-side bookkeeping: which blocks each sequence owns and how many tokens it holds."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self._seqs: dict[str, _Sequence] = {}

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def __contains__(self, seq_id: str) -> bool:
        return seq_id in self._seqs

    def length(self, seq_id: str) -> int:
        seq = self._seqs.get(seq_id)
        return seq.length if seq else 0

    def block_table(self, seq_id: str) -> list[int]:
        return self._seqs[seq_id].blocks

    def extend(self, seq_id: str, new_length: int) -> None:
        """Grow ``seq_id`` to hold ``new_length`` tokens, allocating blocks as needed."""
        seq = self._seqs.setdefault(seq_id, _Sequence())
        if new_length < seq.length:
            raise ValueError(f"extend({seq_id}): {new_length} < current length {seq.length}; use truncate")
        need = self.blocks_for(new_length) - len(seq.blocks)
        if need > len(self._free):
            raise KVCacheFull(f"KV cache full: {seq_id} needs {need} more blocks, {len(self._free)} free")
        seq.blocks.extend(self._free.pop() for _ in range(need))
        seq.length = new_length

    def truncate(self, seq_id: str, new_length: int, keep_blocks: bool = False) -> None:
        """Roll ``seq_id`` back to its first ``new_length`` tokens, freeing blocks past them; with
        ``keep_blocks`` the sequence keeps its blocks (a round already launched writes into them) and a
        later ``truncate`` or ``free`` returns them."""
        seq = self._seqs[seq_id]
        if new_length > seq.length:
            raise ValueError(f"truncate({seq_id}): {new_length} > current length {seq.length}")
        keep = max(self.blocks_for(new_length), len(seq.blocks) if keep_blocks else 0)
        self._free.extend(reversed(seq.blocks[keep:]))
        del seq.blocks[keep:]
        seq.length = new_length

    def free(self, seq_id: str) -> None:
        seq = self._seqs.pop(seq_id, None)
        if seq is not None:
            self._free.extend(reversed(seq.blocks))

    def slots(self, seq_id: str, start: int, end: int) -> list[int]:
        """Cache slots of token positions [start, end) of ``seq_id``."""
        bs, table = self.block_size, self._seqs[seq_id].blocks
        return [table[p // bs] * bs + p % bs for p in range(start, end)]


class PagedKVCache:
    """The device tensors plus their allocator."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int,
                 block_size: int, dtype: torch.dtype, device: torch.device | str) -> None:
        num_blocks = -(-num_tokens // block_size)
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.block_size = block_size
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        # slots: [T] int64; k, v: [T, Hkv, D]
        hkv, d = k.shape[1:]
        self.k[layer].view(-1, hkv, d).index_copy_(0, slots, k)
        self.v[layer].view(-1, hkv, d).index_copy_(0, slots, v)
