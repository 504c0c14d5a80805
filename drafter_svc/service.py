"""The drafter's engine side, free of gRPC.

Per request it keeps the history it has been told (``history[:start] + tokens``) and lets the
engine drafter catch up on it, rolling back its own rejected drafts. A ``start`` beyond the
known history means this process has lost the request (restarted): it asks for a resync.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch

from engine.config import SamplingParams
from engine.drafters.base import Drafter, DraftRequest
from rpc.leases import Leases


class ResyncNeeded(Exception):
    """The drafter does not hold this request's history: resend it from position 0."""


@dataclass(frozen=True)
class DraftItem:
    request_id: str
    start: int
    tokens: list[int]
    k: int
    params: SamplingParams
    features: torch.Tensor | None = None  # [n, F] target features of positions features_start .. (EAGLE)
    features_start: int = 0


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    probs: torch.Tensor | None  # [len(tokens), V] q for sampled requests; None: one-hot


class DrafterEngine:
    def __init__(self, drafter: Drafter, vocab_size: int, max_k: int, lease_s: float = 300.0) -> None:
        self.drafter = drafter
        self.vocab = vocab_size
        self.max_k = max_k
        self.histories: dict[str, list[int]] = {}
        self.leases = Leases(lease_s)  # a history no Draft names for this long belongs to a gateway that is gone
        self.draft_s = 0.0  # time drafting (the drafter's own work, no gRPC), a running total

    def capture_prefills(self) -> int:
        """The drafter's catch-up graphs for whole prompts, before requests (on a GPU; 0 where nothing is captured)."""
        return self.drafter.capture_prefills()

    def _update(self, it: DraftItem) -> None:
        if it.k < 1 or it.k > self.max_k + 1:  # k + 1: the early draft also guesses the bonus token
            raise ValueError(f"k: must be in [1, {self.max_k + 1}], got {it.k}")
        if any(not 0 <= t < self.vocab for t in it.tokens):
            raise ValueError(f"tokens: ids must be in [0, {self.vocab})")
        history = self.histories.get(it.request_id, [])
        if it.start > len(history):
            raise ResyncNeeded(f"request_id: {it.request_id!r}: history has {len(history)} tokens, start is {it.start}")
        if it.start + len(it.tokens) == 0:
            raise ValueError("tokens: a request's history must not be empty")
        self.histories[it.request_id] = history[: it.start] + it.tokens

    def draft(self, items: Sequence[DraftItem | Exception]) -> list[Draft | Exception]:
        results: list[Draft | Exception] = []
        ok: list[int] = []
        for i, it in enumerate(items):
            if isinstance(it, Exception):
                results.append(it)
                continue
            try:
                if any(items[j].request_id == it.request_id for j in ok):
                    raise ValueError(f"request_id: {it.request_id!r} appears twice in one batch")
                self._check_features(it)
                self._update(it)
                ok.append(i)
                results.append(None)  # type: ignore[arg-type]
            except (ValueError, ResyncNeeded) as exc:
                results.append(exc)
        self.leases.renew(items[i].request_id for i in ok)
        if ok:
            reqs = [DraftRequest(items[i].request_id, self.histories[items[i].request_id], items[i].k, items[i].params,
                                 features=items[i].features, features_start=items[i].features_start) for i in ok]
            t0 = time.perf_counter()
            proposal = self.drafter.propose(reqs)
            self.draft_s += time.perf_counter() - t0
            for j, i in enumerate(ok):
                tokens = proposal.token_ids[j]
                sampled = proposal.probs is not None and not items[i].params.greedy
                results[i] = Draft(tokens, proposal.probs[j, : len(tokens)] if sampled else None)
        return results

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return tuple(self.drafter.target_features)

    def _check_features(self, it: DraftItem) -> None:
        f = it.features
        if f is None:
            return
        if not self.feature_layers:
            raise ValueError("features: this drafter drafts from tokens alone; send no features")
        if f.ndim != 2 or f.shape[1] != self.feature_size:
            raise ValueError(f"features: expected [n, {self.feature_size}], got {list(f.shape)}")
        if it.features_start + f.shape[0] > it.start + len(it.tokens):
            raise ValueError(f"features: positions up to {it.features_start + f.shape[0] - 1} lie beyond the history "
                             f"({it.start + len(it.tokens)} tokens)")

    @property
    def feature_size(self) -> int:
        return self.drafter.feature_size

    def reap(self) -> int:
        """Free the histories no Draft has named for the lease period; returns how many."""
        return self.release(self.leases.expired())

    def release(self, ids: Sequence[str]) -> int:
        self.leases.drop(ids)
        n = 0
        for rid in ids:
            n += self.histories.pop(rid, None) is not None
            self.drafter.release(rid)
        return n

    def stats(self) -> dict[str, int]:
        runner = getattr(self.drafter, "runner", None)
        alloc = runner.allocator if runner is not None else None
        return {"running": len(self.histories),
                "kv_blocks_used": alloc.num_blocks - alloc.free_blocks if alloc else 0,
                "kv_blocks_total": alloc.num_blocks if alloc else 0}
