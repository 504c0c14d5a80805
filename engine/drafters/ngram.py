"""Prompt-lookup (n-gram) drafting: model-free.

Finds the most recent earlier occurrence of the sequence's last n tokens (n from ``max_n``
down to ``min_n``) and proposes the tokens that followed it. Deterministic: drafts are
one-hot, so sampled requests stay lossless through rejection sampling with q = one-hot.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from engine.drafters.base import DraftProposal, DraftRequest


class NgramDrafter:
    name = "ngram"
    deterministic = True
    target_features: tuple[int, ...] = ()
    feature_size = 0
    graph_rounds = False  # drafts on the host, from the token history

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"draft: ngram sizes must satisfy 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.max_n, self.min_n = max_n, min_n

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
        return DraftProposal(token_ids=[self.lookup(r.token_ids, r.k) for r in requests], probs=None)

    def release(self, request_id: str) -> None:
        pass

    def capture_prefills(self) -> int:
        return 0  # no model, no graphs
