"""Drafting with a language model: a layer-skip view of the target or a standalone draft LM.

The drafter owns a ``ModelRunner`` with its own paged KV cache. Per call and request it
(1) rolls its KV back to the longest prefix it shares with the committed tokens, (2) catches
up on the committed tokens it has not seen (one batched forward, which is also its prefill),
then (3) runs k-1 single-token steps. Greedy requests draft the argmax; sampled requests
draw from q = the drafter's filtered distribution, which is sent along with the drafts.
With ``top_m`` set, q is first cut to its m most likely tokens and renormalized: the drafter
samples from exactly the distribution that crosses the wire, which keeps verification lossless.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from engine.config import EngineConfig
from engine.drafters.base import DraftProposal, DraftRequest, draft_seed
from engine.models.llama import LlamaForCausalLM
from engine.runner import Chunk, ModelRunner
from engine.sampling import probs_from_logits, sample_from_probs


@dataclass
class _State:
    cached: list[int] = field(default_factory=list)  # tokens whose KV this drafter holds
    generator: torch.Generator | None = None


class ModelDrafter:
    deterministic = False

    def __init__(self, name: str, model: LlamaForCausalLM, config: EngineConfig, target_vocab: int) -> None:
        self.name = name
        self.top_m = config.draft_top_m
        self.runner = ModelRunner(model, config)
        self.target_vocab = target_vocab
        self._states: dict[str, _State] = {}

    @classmethod
    def layer_skip(cls, target: LlamaForCausalLM, num_layers: int, config: EngineConfig) -> "ModelDrafter":
        """The target's first ``num_layers`` layers + its final norm and head; shares the weights."""
        return cls(f"layerskip:{num_layers}", target.truncated(num_layers), config, target.config.vocab_size)

    def release(self, request_id: str) -> None:
        self._states.pop(request_id, None)
        self.runner.free(request_id)

    def _catch_up(self, r: DraftRequest) -> list[int]:
        st = self._states.setdefault(r.request_id, _State())
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

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        v = logits.shape[-1]
        if v > self.target_vocab:
            return logits[:, : self.target_vocab]
        if v < self.target_vocab:
            return torch.nn.functional.pad(logits, (0, self.target_vocab - v), value=float("-inf"))
        return logits

    def _pick(self, logits: torch.Tensor, reqs: Sequence[DraftRequest]) -> tuple[torch.Tensor, torch.Tensor | None]:
        # logits: [N, V] -> tokens [N], q [N, V] (None when every request is greedy)
        logits = self._fit_vocab(logits)
        tokens = logits.argmax(dim=-1)
        sampled = [i for i, r in enumerate(reqs) if not r.params.greedy]
        if not sampled:
            return tokens, None
        dev = logits.device
        params = [reqs[i].params for i in sampled]
        q_rows = probs_from_logits(
            logits[sampled],
            torch.tensor([p.temperature for p in params], device=dev),
            torch.tensor([p.top_k for p in params], device=dev),
            torch.tensor([p.top_p for p in params], device=dev))
        if self.top_m:
            q_rows = _keep_top_m(q_rows, self.top_m)
        for row, i in enumerate(sampled):
            st = self._states[reqs[i].request_id]
            if st.generator is None:
                st.generator = torch.Generator(device=dev).manual_seed(draft_seed(reqs[i].params.seed))
            noise = torch.empty(q_rows.shape[-1], device=dev).exponential_(generator=st.generator)
            tokens[i] = sample_from_probs(q_rows[row], noise)
        q = torch.zeros_like(logits)
        q[sampled] = q_rows
        return tokens, q

    def propose(self, requests: Sequence[DraftRequest]) -> DraftProposal:
        kmax = max(r.k for r in requests)
        drafts: list[list[int]] = [[] for _ in requests]
        probs: torch.Tensor | None = None
        active = list(range(len(requests)))
        chunks = [Chunk(r.request_id, self._catch_up(r)) for r in requests]
        for step in range(kmax):
            logits = self.runner.forward(chunks)
            tokens, q = self._pick(logits, [requests[i] for i in active])
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
        return DraftProposal(token_ids=drafts, probs=probs)


def _keep_top_m(q: torch.Tensor, m: int) -> torch.Tensor:
    """q [N, V] -> the same rows restricted to their m most likely tokens, renormalized."""
    if m >= q.shape[-1]:
        return q
    values, ids = q.topk(m, dim=-1)
    return torch.zeros_like(q).scatter_(-1, ids, values / values.sum(-1, keepdim=True))
