"""Prompt-lookup (n-gram) drafting: model-free.

Finds the most recent earlier occurrence of the sequence's last n tokens (n from ``max_n``
down to ``min_n``) and proposes the tokens that followed it. Deterministic: drafts are
one-hot, so sampled requests stay lossless through rejection sampling with q = one-hot.

Given a ``TokenHistory`` (the engine runs fused rounds) it also drafts inside the round's graph, on the
device (engine/drafters/ngram_graph.py): the same match over the same tokens, so the same drafts.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from engine.drafters.base import DraftProposal, DraftRequest
from engine.drafters.ngram_graph import NgramProgram, TokenHistory


class NgramDrafter:
    name = "ngram"
    deterministic = True
    primes = False  # its first drafts, a host lookup, cost no forward
    # 1.25-1.6 tokens a round: in waves 4 greedy rows neither gain nor lose (0.96-1.02x), 16 greedy or 4 sampled lose
    # (bench/RESULTS.md): with spec_max_batch 16, 3 greedy requests speculate, or 1 sampled
    batch_weight = 5
    target_features: tuple[int, ...] = ()
    feature_size = 0

    def __init__(self, max_n: int = 3, min_n: int = 1, history: TokenHistory | None = None) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"draft: ngram sizes must satisfy 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.max_n, self.min_n = max_n, min_n
        self.history = history
        self.graph_rounds = history is not None  # drafts inside fused rounds from the device's copy of the tokens
        self.tree_rounds = False  # one continuation a lookup

    def lookup(self, tokens: Sequence[int], k: int) -> list[int]:
        arr = np.asarray(tokens, dtype=np.int64)
        for n in range(min(self.max_n, len(arr) - 1), self.min_n - 1, -1):
            suffix = arr[-n:]
            windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)  # excludes the suffix itself
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return arr[start:start + k].tolist()
        return []

    def propose(self, requests: Sequence[DraftRequest]) -> DraftProposal:
        if self.history is not None:  # what a fused round continues from
            for r in requests:
                self.history.write(r.request_id, r.token_ids)
        return DraftProposal(token_ids=[self.lookup(r.token_ids, r.k) for r in requests], probs=None)

    def round_program(self, rows: int, k: int, max_blocks: int, sampled: bool = False) -> NgramProgram:
        return NgramProgram(self, rows, k)

    def graph_ready(self, request_id: str, committed: int) -> bool:
        """After ``propose``: the device holds the request's committed tokens (there was a free history row)."""
        return self.history is not None and self.history.holds(request_id, committed)

    def release(self, request_id: str) -> None:
        if self.history is not None:
            self.history.release(request_id)

    def capture_prefills(self) -> int:
        return 0  # no model, no graphs
