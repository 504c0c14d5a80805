"""SpecDecoder: one speculative round for a batch of requests, in one process.

Invariant: the target's KV holds every committed token of a request except the ones not yet
run through it (after a round: exactly the last, the recovered/bonus token). A round sends
per request ``[unseen committed tokens] + drafts`` through the target in one forward, so a
new request's prefill is simply its first round (its unseen tokens are the whole prompt).

Per round:
1. each request gets k = min(its k, room left); the drafter proposes up to k tokens;
2. one target forward over every request's chunk, logits for the last 1 + len(drafts) rows;
3. greedy rows: accept while the draft equals the target argmax; sampled rows: rejection
   sampling with per-request coins; each row commits accepted + 1 tokens;
4. the target KV is truncated past the accepted tokens; stop rules are applied; finished
   requests free their KV in the target and the drafter.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import deque
from typing import Sequence

import torch

from engine.config import EngineConfig, SamplingParams
from engine.drafters.base import DraftRequest, Drafter
from engine.request import FinishReason, Request, RequestOutput
from engine.runner import Chunk, ModelRunner
from engine.sampling import PLACEHOLDER_TOKEN_ID, greedy_verify, probs_from_logits, rejection_sample
from engine.tokenizer import Tokenizer


class SpecDecoder:
    def __init__(self, target: ModelRunner, tokenizer: Tokenizer, config: EngineConfig,
                 drafter: Drafter | None = None) -> None:
        self.target = target
        self.tokenizer = tokenizer
        self.config = config
        self.drafter = drafter
        self.max_context = min(config.max_context or target.model.config.max_position,
                               target.model.config.max_position)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._ids = itertools.count()
        self._reserved_blocks = 0

    # ------------------------------------------------------------------ admission
    def _blocks_needed(self, r: Request) -> int:
        worst = min(len(r.prompt_ids) + r.params.max_tokens, self.max_context) + self.config.max_k + 1
        return self.target.allocator.blocks_for(worst)

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams,
                    request_id: str | None = None) -> str:
        """Queue a request; bad input raises ValueError naming the field."""
        prompt_ids = list(prompt_ids)
        vocab = self.target.vocab_size
        if not prompt_ids:
            raise ValueError("prompt: must not be empty")
        bad = next((t for t in prompt_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt: token id {bad} is outside the vocabulary [0, {vocab})")
        if len(prompt_ids) >= self.max_context:
            raise ValueError(f"prompt: {len(prompt_ids)} tokens leave no room in the context of {self.max_context}")
        if params.k is not None and params.k > self.config.max_k:
            raise ValueError(f"k: {params.k} exceeds the server's max_k={self.config.max_k}")
        request_id = request_id or f"req-{next(self._ids)}"
        if any(r.request_id == request_id for r in itertools.chain(self.waiting, self.running)):
            raise ValueError(f"request_id: {request_id!r} is already in use")
        if params.seed is None:
            params = dataclasses.replace(params, seed=random.getrandbits(63))
        r = Request.create(request_id, prompt_ids, params, self.tokenizer, self.max_context)
        if self._blocks_needed(r) > self.target.allocator.num_blocks:
            raise ValueError(f"max_tokens: prompt ({len(prompt_ids)}) + max_tokens ({params.max_tokens}) "
                             f"does not fit the KV cache ({self.config.kv_cache_tokens} tokens)")
        self.waiting.append(r)
        return request_id

    def _admit(self) -> None:
        total = self.target.allocator.num_blocks
        while self.waiting and len(self.running) < self.config.max_batch_size:
            need = self._blocks_needed(self.waiting[0])
            if self._reserved_blocks + need > total:
                break
            self._reserved_blocks += need
            self.running.append(self.waiting.popleft())

    def abort(self, request_id: str) -> bool:
        for r in list(self.waiting):
            if r.request_id == request_id:
                self.waiting.remove(r)
                return True
        for r in self.running:
            if r.request_id == request_id:
                r.finish_reason = FinishReason.ABORT
                self._finish(r)
                self.running.remove(r)
                return True
        return False

    def _finish(self, r: Request) -> None:
        self._reserved_blocks -= self._blocks_needed(r)
        self.target.free(r.request_id)
        if self.drafter is not None:
            self.drafter.release(r.request_id)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ the round
    def _draft_len(self, r: Request) -> int:
        if self.drafter is None:
            return 0
        k = self.config.k if r.params.k is None else r.params.k
        return max(0, min(k, r.room() - 1))

    def _propose(self, reqs: list[Request]) -> tuple[list[list[int]], torch.Tensor | None]:
        """Drafts per request ([] where k == 0) and q [B, K, V] for them (None: one-hot drafts)."""
        drafts: list[list[int]] = [[] for _ in reqs]
        ks = [self._draft_len(r) for r in reqs]
        chosen = [i for i, k in enumerate(ks) if k > 0]
        if not chosen:
            return drafts, None
        proposal = self.drafter.propose(
            [DraftRequest(reqs[i].request_id, reqs[i].token_ids, ks[i], reqs[i].params) for i in chosen])
        for j, i in enumerate(chosen):
            drafts[i] = proposal.token_ids[j][: ks[i]]
        if proposal.probs is None:
            return drafts, None
        q = proposal.probs.new_zeros(len(reqs), *proposal.probs.shape[1:])
        q[chosen] = proposal.probs
        return drafts, q

    def step(self) -> list[RequestOutput]:
        """Run one round for every running request (admitting new ones first)."""
        self._admit()
        reqs = self.running
        if not reqs:
            return []
        drafts, q = self._propose(reqs)
        chunks = []
        for r, d in zip(reqs, drafts):
            unseen = r.token_ids[self.target.length(r.request_id):]
            chunks.append(Chunk(r.request_id, unseen + d, num_logits=1 + len(d)))
        logits = self.target.forward(chunks)                      # [sum(1 + n_i), V]
        out, num_accepted = self._verify(reqs, drafts, q, logits)
        outputs = []
        for r, d, row, a in zip(reqs, drafts, out.tolist(), num_accepted.tolist()):  # the round's host sync
            r.rounds += 1
            r.accepted += a
            r.drafted += len(d)
            self.target.truncate(r.request_id, len(r.token_ids) + a)
            kept, delta = r.commit(row[: a + 1])
            outputs.append(r.output(kept, delta))
            if r.finished:
                self._finish(r)
        self.running = [r for r in reqs if not r.finished]
        return outputs

    def _verify(self, reqs: list[Request], drafts: list[list[int]], q: torch.Tensor | None,
                logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dev = logits.device
        b = len(reqs)
        kmax = max(len(d) for d in drafts)
        num_draft = torch.tensor([len(d) for d in drafts], device=dev)
        draft_ids = torch.tensor([d + [PLACEHOLDER_TOKEN_ID] * (kmax - len(d)) for d in drafts],
                                 dtype=torch.long, device=dev).view(b, kmax)
        # rows of request i in the flat logits: starts[i] .. starts[i] + len(d_i); pad by repeating
        starts = torch.tensor(list(itertools.accumulate([1 + len(d) for d in drafts], initial=0))[:-1], device=dev)
        offs = torch.minimum(torch.arange(kmax + 1, device=dev).unsqueeze(0), num_draft.unsqueeze(1))
        padded = logits[starts.unsqueeze(1) + offs]                # [B, K+1, V]
        out, num_accepted = greedy_verify(draft_ids, num_draft, padded.argmax(dim=-1))
        sampled = [i for i, r in enumerate(reqs) if not r.params.greedy]
        if not sampled:
            return out, num_accepted
        params = [reqs[i].params for i in sampled]
        rows = padded[sampled].reshape(len(sampled) * (kmax + 1), -1)
        probs = probs_from_logits(
            rows,
            torch.tensor([p.temperature for p in params], device=dev).repeat_interleave(kmax + 1),
            torch.tensor([p.top_k for p in params], device=dev).repeat_interleave(kmax + 1),
            torch.tensor([p.top_p for p in params], device=dev).repeat_interleave(kmax + 1),
        ).view(len(sampled), kmax + 1, -1)
        uniforms, noise = self._coins([reqs[i] for i in sampled], kmax, probs.shape[-1], dev)
        s_out, s_acc = rejection_sample(draft_ids[sampled], num_draft[sampled], probs,
                                        None if q is None else q[sampled, :kmax], uniforms, noise)
        out[sampled] = s_out
        num_accepted[sampled] = s_acc
        return out, num_accepted

    @staticmethod
    def _coins(reqs: list[Request], k: int, vocab: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-request random draws: k uniforms and one row of Exponential(1) noise each."""
        uniforms = torch.empty(len(reqs), k, device=dev)
        noise = torch.empty(len(reqs), vocab, device=dev)
        for i, r in enumerate(reqs):
            if r.generator is None:
                r.generator = torch.Generator(device=dev).manual_seed(r.params.seed)
            uniforms[i].uniform_(generator=r.generator)
            noise[i].exponential_(generator=r.generator)
        return uniforms, noise

    # ------------------------------------------------------------------ convenience
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
                 ) -> list[RequestOutput]:
        """Run prompts to completion; returns one final output per prompt (all tokens, all text)."""
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        tokens: dict[str, list[int]] = {i: [] for i in ids}
        text: dict[str, str] = {i: "" for i in ids}
        final: dict[str, RequestOutput] = {}
        while self.has_unfinished():
            for o in self.step():
                tokens[o.request_id] += o.new_token_ids
                text[o.request_id] += o.text_delta
                if o.finished:
                    final[o.request_id] = o
        return [dataclasses.replace(final[i], new_token_ids=tokens[i], text_delta=text[i]) for i in ids]
