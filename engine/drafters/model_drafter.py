"""Drafting with a language model: a layer-skip view of the target or a standalone draft LM.

The drafter owns a ``ModelRunner`` with its own paged KV cache. Per call and request it
(1) rolls its KV back to the longest prefix it shares with the committed tokens, (2) catches
up on the committed tokens it has not seen (one batched forward, which is also its prefill),
then (3) runs k-1 single-token steps. Tokens and q come from ``DraftSampler``.

Inside a fused round (``graph_rounds``) the same three steps run in the round's graph
(``ModelProgram``): entry p of its KV is the token at position p.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from engine.attention.static import StaticAttention
from engine.config import EngineConfig
from engine.drafters.base import DraftProposal, DraftRequest
from engine.drafters.draft_sampling import DraftSampler
from engine.drafters.graph_program import GraphDraftProgram
from engine.models.llama import LlamaForCausalLM
from engine.runner import Chunk, ModelRunner


@dataclass
class _State:
    cached: list[int] = field(default_factory=list)  # tokens whose KV this drafter holds


class ModelDrafter:
    deterministic = False
    target_features: tuple[int, ...] = ()
    feature_size = 0
    graph_rounds = True  # ModelProgram
    tree_rounds = True
    primes = True  # ``prime``: its KV over the committed tokens alone; the fused round drafts
    batch_weight = 1

    def __init__(self, name: str, model: LlamaForCausalLM, config: EngineConfig, target_vocab: int) -> None:
        self.name = name
        self.runner = ModelRunner(model, config)
        self.sampler = DraftSampler(target_vocab, config.draft_top_m)
        self._states: dict[str, _State] = {}

    def round_program(self, rows: int, k: int, max_blocks: int, sampled: bool = False, tree=None) -> "ModelProgram":
        return ModelProgram(self, rows, k, max_blocks, sampled, tree)

    def graph_ready(self, request_id: str, committed: int) -> bool:
        """After ``propose``: this drafter's KV holds every committed token at its position (and the draft
        chain past them), what a fused round continues from; from then on the rounds keep the KV."""
        st = self._states.get(request_id)
        return st is not None and len(st.cached) >= committed

    @classmethod
    def layer_skip(cls, target: LlamaForCausalLM, num_layers: int, config: EngineConfig) -> "ModelDrafter":
        """The target's first ``num_layers`` layers + its final norm and head; shares the weights."""
        return cls(f"layerskip:{num_layers}", target.truncated(num_layers), config, target.config.vocab_size)

    def capture_prefills(self) -> int:
        """The draft model's prompt catch-up graphs, before requests."""
        return self.runner.capture_prefills()

    def release(self, request_id: str) -> None:
        self._states.pop(request_id, None)
        self.sampler.release(request_id)
        self.runner.free(request_id)

    def _catch_up(self, r: DraftRequest) -> list[int]:
        st = self._states.setdefault(r.request_id, _State())
        if self.runner.length(r.request_id) != len(st.cached):  # fused rounds moved the KV on: start over
            self.runner.free(r.request_id)
            st.cached.clear()
        tokens = r.token_ids
        limit = min(len(st.cached), len(tokens) - 1)  # always re-feed at least the last token
        # longest common prefix, vectorized (the context may also have been rolled back by the caller)
        diff = np.flatnonzero(np.asarray(st.cached[:limit]) != np.asarray(tokens[:limit]))
        n = int(diff[0]) if diff.size else limit
        if n < len(st.cached):
            self.runner.truncate(r.request_id, n)
            del st.cached[n:]
        new = list(tokens[n:])
        st.cached.extend(new)
        return new

    def prime(self, requests: Sequence[DraftRequest]) -> None:
        """Its KV over each request's committed tokens (``graph_ready``), in one forward nobody reads."""
        chunks = [Chunk(r.request_id, new) for r in requests if (new := self._catch_up(r))]
        if chunks:
            self.runner.forward(chunks)

    def propose(self, requests: Sequence[DraftRequest]) -> DraftProposal:
        kmax = max(r.k for r in requests)
        drafts: list[list[int]] = [[] for _ in requests]
        probs: torch.Tensor | None = None
        active = list(range(len(requests)))
        chunks = [Chunk(r.request_id, self._catch_up(r)) for r in requests]
        for step in range(kmax):
            logits = self.runner.forward(chunks)
            tokens, q = self.sampler.pick(logits, [requests[i] for i in active], step)
            tokens = tokens.tolist()
            if q is not None:
                if probs is None:
                    probs = torch.zeros(len(requests), kmax, q.shape[-1], device=q.device)
                probs[active, step] = q
            for i, t in zip(active, tokens):
                drafts[i].append(t)
            active = [i for i in active if requests[i].k > step + 1]
            if not active:
                break
            chunks = []
            for i in active:
                self._states[requests[i].request_id].cached.append(drafts[i][-1])
                chunks.append(Chunk(requests[i].request_id, [drafts[i][-1]]))
        self.sampler.end_round((r.request_id, r.params) for r in requests)
        return DraftProposal(token_ids=drafts, probs=probs)


class ModelProgram(GraphDraftProgram):
    """A draft LM's (or layer-skip view's) part of a fused round: entry p is the token at position p."""

    first_position = 0

    def __init__(self, drafter: ModelDrafter, rows: int, k: int, max_blocks: int, sampled: bool = False,
                 tree=None) -> None:
        super().__init__(drafter.runner, drafter.sampler, rows, k, max_blocks, sampled, tree)
        self.model = drafter.runner.model

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attn: StaticAttention, extra,
                keep: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(tokens, positions, attn, keep)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.sampler.fit_vocab(self.model.lm_logits(hidden))

