"""The attention backend interface and the per-forward metadata every backend plans from.

Prefill, decode and verify are one operation here: each sequence appends ``q_len`` new
tokens to its KV and those tokens attend causally to everything before them and among
themselves (prefill: the prompt; decode: 1 token; verify: the pending token + k drafts).
Backends may choose faster kernels for special shapes (all ``q_len == 1``), but callers
never say which phase they are in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine.kv_cache import PagedKVCache


@dataclass(frozen=True)
class AttentionMetadata:
    """Layout of one forward pass, planned once and shared by all layers."""

    q_lens: tuple[int, ...]            # new tokens per sequence
    kv_lens: tuple[int, ...]           # KV length per sequence after this forward
    block_tables: tuple[tuple[int, ...], ...]
    slot_mapping: torch.Tensor         # [T] int64 on the device: cache slot of each new token

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)

    @property
    def is_decode(self) -> bool:
        return all(q == 1 for q in self.q_lens)


class AttentionBackend(Protocol):
    name: str
    # True: ``forward`` takes q and k *before* the rotary embedding plus the forward's rope tables
    # (``RotaryEmbedding.lookup``) as a fifth argument, and rotates them itself (fused with its KV write)
    fused_rotary: bool

    def plan(self, meta: AttentionMetadata) -> None:
        """Prepare for one forward pass (called once, before the first layer)."""

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write k, v of the new tokens into the cache, then attend.

        q: [T, Hq, D]; k, v: [T, Hkv, D] -> [T, Hq, D]
        """


def create_backend(name: str, cache: PagedKVCache, num_heads: int, device: torch.device) -> AttentionBackend:
    if name == "torch":
        from engine.attention.torch_ref import TorchAttention

        return TorchAttention(cache, num_heads)
    if name == "flashinfer":
        from engine.attention.flashinfer_backend import FlashInferAttention

        return FlashInferAttention(cache, num_heads, device)
    raise ValueError(f"attention: unknown backend {name!r} (torch, flashinfer)")
