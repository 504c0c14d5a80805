"""SpecDecoder: one speculative round for a batch of requests, in one process.

Invariant: the target's KV holds every committed token of a request except the ones not yet
run through it (after a round: exactly the last, the recovered/bonus token). A round sends
per request ``[unseen committed tokens] + drafts`` through the target in one forward, so a
new request's prefill is simply its first round (its unseen tokens are the whole prompt).

Per round:
1. each request gets k = min(its k, room left); drafts come from the embedded drafter
   (``step``) or from outside (``run_round``, the verifier service in split mode);
2. one target forward over every request's chunk, logits for the last 1 + len(drafts) rows;
3. greedy rows: accept while the draft equals the target argmax; sampled rows: rejection
   sampling with per-request coins; each row commits accepted + 1 tokens;
4. the target KV is truncated past the accepted tokens; stop rules are applied; finished
   requests free their KV in the target and the drafter.

Two ways in: ``add_request`` + ``step`` queue and schedule in-process (the CLI, the tests);
``start`` + ``run_round`` let a caller that does its own scheduling (the verifier service)
drive exact batches.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import torch

from engine.config import EngineConfig, SamplingParams
from engine.drafters.base import Drafter, DraftRequest
from engine.fused_round import FusedRounds, FusedRow
from engine.models import ops
from engine.request import FinishReason, Request, RequestOutput
from engine.runner import Chunk, ModelRunner
from engine.sampling import PLACEHOLDER_TOKEN_ID, RowParams, coins, greedy_verify, probs_from_logits, rejection_sample
from engine.tokenizer import Tokenizer


class CapacityError(RuntimeError):
    """The KV cache or the batch cannot take this request now (overload, not bad input)."""


@dataclass(frozen=True)
class RoundItem:
    """One request's part of a round: its drafts and, for sampled requests, their distribution.

    ``prefill_chunk``: run only this many of the request's tokens not yet in the target's KV
    (chunked prefill). Fewer than all of them is a *partial* prefill: no drafts, nothing is
    verified or committed, the request's KV just grows; None runs them all.
    """

    request_id: str
    drafts: Sequence[int] = ()
    probs: torch.Tensor | None = None  # [len(drafts), V] q; None: one-hot drafts
    prefill_chunk: int | None = None


class SpecDecoder:
    def __init__(self, target: ModelRunner, tokenizer: Tokenizer, config: EngineConfig,
                 drafter: Drafter | None = None) -> None:
        self.target = target
        self.tokenizer = tokenizer
        self.config = config
        self.drafter = drafter
        # target layers a feature-fed drafter (EAGLE) drafts from; captured in every round's forward
        self.feature_layers: tuple[int, ...] = tuple(drafter.target_features) if drafter is not None else ()
        self.max_context = min(config.max_context or target.model.config.max_position,
                               target.model.config.max_position)
        self.waiting: deque[Request] = deque()
        self.requests: dict[str, Request] = {}  # running, in arrival order
        self._ids = itertools.count()
        self._reserved_blocks = 0
        # the fast path: rounds as one graph each; requests in it keep their next drafts here. ``fused`` speculates
        # (k drafts per row, or plain with no drafter), ``fused_plain`` decodes the requests of ``_plain`` plainly:
        # every request that was running while more than spec_max_batch ran (it stays plain to its end)
        self.fused: FusedRounds | None = None
        self.fused_plain: FusedRounds | None = None
        self._plain: set[str] = set()
        if config.use_fused_rounds:
            def fused(k: int, d: Drafter | None) -> FusedRounds:
                return FusedRounds(target, d, k, config.max_batch_size, self.max_context,
                                   capture=target.device.type == "cuda", pipeline_rows=config.pipeline_rows)

            if drafter is None or config.k == 0 or drafter.graph_rounds:
                self.fused = fused(config.k if drafter is not None else 0, drafter if config.k else None)
            if drafter is not None and config.k and config.spec_max_batch is not None:
                self.fused_plain = fused(0, None)
        self._pending: dict[str, tuple[list[int], torch.Tensor | None]] = {}  # fast path: next drafts and their q

    @property
    def running(self) -> list[Request]:
        return list(self.requests.values())

    # ------------------------------------------------------------------ admission
    def _blocks_needed(self, r: Request) -> int:
        worst = min(len(r.prompt_ids) + r.params.max_tokens, self.max_context) + self.config.max_k + 1
        return self.target.allocator.blocks_for(worst)

    def _create(self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str | None,
                output_ids: Sequence[int]) -> Request:
        """Validate a new request; bad input raises ValueError naming the field."""
        prompt_ids = list(prompt_ids)
        vocab = self.target.vocab_size
        if not prompt_ids:
            raise ValueError("prompt: must not be empty")
        for name, ids in (("prompt", prompt_ids), ("output", output_ids)):
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise ValueError(f"{name}: token id {bad} is outside the vocabulary [0, {vocab})")
        if len(prompt_ids) + len(output_ids) >= self.max_context:
            raise ValueError(f"prompt: {len(prompt_ids)} tokens leave no room in the context of {self.max_context}")
        if params.k is not None and params.k > self.config.max_k:
            raise ValueError(f"k: {params.k} exceeds the server's max_k={self.config.max_k}")
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self.requests or any(r.request_id == request_id for r in self.waiting):
            raise ValueError(f"request_id: {request_id!r} is already in use")
        if params.seed is None:
            params = dataclasses.replace(params, seed=random.getrandbits(63))
        r = Request.create(request_id, prompt_ids, params, self.tokenizer, self.max_context)
        if self._blocks_needed(r) > self.target.allocator.num_blocks:
            raise ValueError(f"max_tokens: prompt ({len(prompt_ids)}) + max_tokens ({params.max_tokens}) "
                             f"does not fit the KV cache ({self.target.capacity_tokens} tokens)")
        if output_ids:
            r.resume(list(output_ids))
            if r.room() == 0:
                raise ValueError(f"output: {len(output_ids)} tokens already reach max_tokens or the context")
        return r

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams,
                    request_id: str | None = None) -> str:
        """Queue a request for ``step``."""
        r = self._create(prompt_ids, params, request_id, ())
        self.waiting.append(r)
        return r.request_id

    def start(self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str,
              output_ids: Sequence[int] = ()) -> Request:
        """Admit a request now (its first ``run_round`` is its prefill), or raise CapacityError.

        ``output_ids``: output already committed elsewhere (a request moved from a lost verifier).
        """
        r = self._create(prompt_ids, params, request_id, output_ids)
        if len(self.requests) >= self.config.max_batch_size:
            raise CapacityError(f"batch full ({self.config.max_batch_size} requests)")
        self._reserve(r)
        return r

    def _reserve(self, r: Request) -> None:
        need = self._blocks_needed(r)
        if self._reserved_blocks + need > self.target.allocator.num_blocks:
            raise CapacityError(f"KV cache full: {r.request_id} needs {need} blocks")
        self._reserved_blocks += need
        self.requests[r.request_id] = r

    def _admit(self) -> None:
        while self.waiting and len(self.requests) < self.config.max_batch_size:
            try:
                self._reserve(self.waiting[0])
            except CapacityError:
                break
            self.waiting.popleft()

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is and free its KV (target and drafter)."""
        for r in self.waiting:
            if r.request_id == request_id:
                self.waiting.remove(r)
                return True
        r = self.requests.get(request_id)
        if r is None:
            return False
        r.finish_reason = FinishReason.ABORT
        self._finish(r)
        return True

    def _finish(self, r: Request) -> None:
        del self.requests[r.request_id]
        self._pending.pop(r.request_id, None)
        self._plain.discard(r.request_id)
        self._reserved_blocks -= self._blocks_needed(r)
        self.target.free(r.request_id)
        if self.drafter is not None:
            self.drafter.release(r.request_id)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.requests)

    # ------------------------------------------------------------------ the round
    def draft_len(self, r: Request, k: int | None = None) -> int:
        """Draft tokens this request may take this round: its k, capped by the room left."""
        if r.request_id in self._plain:
            return 0
        if k is None:
            k = self.config.k if r.params.k is None else r.params.k
        return max(0, min(k, self.config.max_k, r.room() - 1))

    def propose(self, reqs: Sequence[Request], ks: Sequence[int]) -> list[RoundItem]:
        """Drafts from the embedded drafter (none where k == 0 or there is no drafter)."""
        chosen = [i for i, k in enumerate(ks) if k > 0] if self.drafter is not None else []
        items = [RoundItem(r.request_id) for r in reqs]
        if not chosen:
            return items
        wanted = []
        for i in chosen:
            start, feats = reqs[i].features.take()
            wanted.append(DraftRequest(reqs[i].request_id, reqs[i].token_ids, ks[i], reqs[i].params,
                                       features=feats, features_start=start))
        proposal = self.drafter.propose(wanted)
        for j, i in enumerate(chosen):
            drafts = proposal.token_ids[j][: ks[i]]
            probs = None if proposal.probs is None else proposal.probs[j, : len(drafts)]
            items[i] = RoundItem(reqs[i].request_id, drafts, probs)
        return items

    def unseen(self, r: Request) -> int:
        """Tokens of ``r`` not yet run through the target: 1 once prefilled (the newest token)."""
        return len(r.token_ids) - self.target.length(r.request_id)

    def plan_round(self, reqs: Sequence[Request]) -> tuple[list[Request], list[int], list[int | None]]:
        """Who runs this round, with how many drafts and (for prefills) how many prompt tokens.

        Without ``max_round_tokens`` every request runs whole. With it, requests already decoding
        go first (their 1 + k tokens each: arrivals never stall running streams), then prefills in
        arrival order take what is left of the budget, chunk by chunk; the first prefill in line
        always gets at least one KV block's worth so it cannot starve.
        """
        budget = self.config.max_round_tokens
        if budget is None:
            return list(reqs), [self.draft_len(r) for r in reqs], [None] * len(reqs)
        decoding = [r for r in reqs if self.unseen(r) == 1]
        prefilling = [r for r in reqs if self.unseen(r) > 1]
        run, ks, chunks = [], [], []
        for r in decoding:
            run.append(r)
            ks.append(self.draft_len(r))
            chunks.append(None)
        left = budget - sum(1 + k for k in ks)
        for i, r in enumerate(prefilling):
            room = max(left, self.config.kv_block_size if i == 0 else 0)
            k = self.draft_len(r)  # the last chunk takes the request's usual drafts: the output never
            whole = self.unseen(r) + k <= room  # depends on the budget
            n = self.unseen(r) if whole else min(self.unseen(r) - 1, room)
            if n <= 0:
                break
            run.append(r)
            ks.append(k if whole else 0)
            chunks.append(None if whole else n)
            left -= n + ks[-1]
        return run, ks, chunks

    def step(self) -> list[RequestOutput]:
        """Admit queued requests, then run one round for the running requests the token budget admits."""
        self._admit()
        self._batch_policy()
        reqs, ks, chunks = self.plan_round(self.running)
        return self.decode_round(reqs, ks, chunks) if reqs else []

    def decode_round(self, reqs: Sequence[Request], ks: Sequence[int | None] | None = None,
                     chunks: Sequence[int | None] | None = None) -> list[RequestOutput]:
        """One round for these running requests, drafting with the embedded drafter: decoding requests on the
        fast path in one fused round, the others (prefill chunks, a request's first drafts, a k the graph
        does not hold) in an eager round beside it. ``ks``: each request's k (None: its own), capped by
        ``draft_len``; ``chunks``: prefill chunks as from ``plan_round`` (None: run whole). Returns the
        outputs in the order of ``reqs`` (partial prefills have none)."""
        self._batch_policy()
        ks = [self.draft_len(r, k) for r, k in zip(reqs, ks or [None] * len(reqs))]
        chunks = chunks or [None] * len(reqs)
        plain, fast, slow = [], [], []  # fast: (request, its drafts to verify)
        for r, k, c in zip(reqs, ks, chunks):
            if c is None and self._plain_ready(r):
                plain.append((r, 0))
            elif c is None and self._fused_ready(r, k):
                fast.append((r, min(k, self.fused.k)))  # no drafter: plain, whatever k asks
            else:
                slow.append((r, k, c))
        # a round launched ahead for other rows than those about to run gives back the KV blocks it held
        for f, group in ((self.fused, fast), (self.fused_plain, plain)):
            if f is not None:
                f.expect(() if slow else tuple(r.request_id for r, _ in group))
        eager = []
        for r, _, _ in slow:  # left the fast path (e.g. near the end of its context): its drafter state is stale
            self._pending.pop(r.request_id, None)
        for (r, _, c), it in zip(slow, self.propose([r for r, _, _ in slow], [k for _, k, _ in slow])):
            if c is None and self._fused_takes(r, it):
                self._pending[r.request_id] = (list(it.drafts), it.probs)
                fast.append((r, len(it.drafts)))
            else:
                eager.append(dataclasses.replace(it, prefill_chunk=c) if c is not None else it)
        # launch the next round before reading this one only while the same rows will come back: no request
        # waits to join, none runs outside the fast path, and one fast path runs
        ahead = not (self.waiting or eager or (fast and plain))
        outputs = self._fused_round(fast, self.fused, ahead) if fast else []
        outputs += self._fused_round(plain, self.fused_plain, ahead) if plain else []
        outputs += self.run_round(eager) if eager else []
        by_id = {o.request_id: o for o in outputs}
        return [by_id[r.request_id] for r in reqs if r.request_id in by_id]

    def _batch_policy(self) -> None:
        """With spec_max_batch: once more than that many run, every running request decodes plainly to its end."""
        if self.fused_plain is not None and len(self.requests) > self.config.spec_max_batch:
            for rid in self.requests.keys() - self._plain:
                self._plain.add(rid)
                self._pending.pop(rid, None)
                self.drafter.release(rid)

    def capture_prefills(self) -> int:
        """On a GPU: capture the target's prefill graph of every whole-prompt length now (with the features the
        drafter reads), and the drafter's own for its catch-up over a prompt, before requests arrive; returns
        the prefill graphs captured (0 without graphs)."""
        n = self.target.capture_prefills(self.feature_layers)
        if self.drafter is not None:
            n += self.drafter.capture_prefills()
        return n

    # ------------------------------------------------------------------ the fast path
    def _fused_ready(self, r: Request, k: int) -> bool:
        """On the fast path this round: decoding, its drafts (if any) in hand, room for a round, and asking
        for the drafts the graph verifies (its k, fewer only where the room left caps it)."""
        f = self.fused
        if f is None or r.request_id in self._plain or self.unseen(r) != 1 or not f.fits(len(r.token_ids)):
            return False
        if f.k == 0:
            return self.drafter is None or k == 0
        return k == min(f.k, r.room() - 1) and r.request_id in self._pending

    def _plain_ready(self, r: Request) -> bool:
        """On the plain fast path this round: a request of a large batch, decoding, with room for a round."""
        return (r.request_id in self._plain and self.unseen(r) == 1
                and self.fused_plain.fits(len(r.token_ids)))

    def _fused_takes(self, r: Request, item: RoundItem) -> bool:
        """A request the drafter has just drafted a full k for (with their q when it samples) moves to the
        fast path."""
        f = self.fused
        return (f is not None and f.k > 0 and self.unseen(r) == 1 and len(item.drafts) == f.k
                and (r.params.greedy or item.probs is not None)
                and f.fits(len(r.token_ids)) and self.drafter.graph_ready(r.request_id, len(r.token_ids)))

    def _fused_round(self, reqs: list[tuple[Request, int]], fused: FusedRounds, ahead: bool = False
                     ) -> list[RequestOutput]:
        """reqs: each request with the drafts it verifies (``draft_len``: the graph's k, fewer near its end);
        ``ahead``: the same requests are expected back next round (``FusedRounds.run``)."""
        rows = []
        for r, num_draft in reqs:
            drafts, q = self._pending.get(r.request_id, ([], None))
            rows.append(FusedRow(r.request_id, r.token_ids, drafts, r.params, num_draft, q, r.draws, r.room()))
            if not r.params.greedy:
                r.draws += 1
        results = fused.run(rows, ahead)
        outputs = []
        for (r, _), row, res in zip(reqs, rows, results):
            drafted = row.num_draft
            accepted = res.num_accepted
            r.rounds += 1
            r.accepted += accepted
            r.drafted += drafted
            kept, delta = r.commit(res.committed)
            outputs.append(r.output(kept, delta, accepted, drafted))
            if r.finished:
                self._finish(r)
            elif fused.k:
                self._pending[r.request_id] = (res.next_drafts, res.next_q)
        return outputs

    def run_round(self, items: Sequence[RoundItem], feature_layers: Sequence[int] | None = None
                  ) -> list[RequestOutput]:
        """One target forward + verification for these requests (each at most once).

        ``feature_layers``: capture these target layers' outputs for a feature-fed drafter
        (default: what the embedded drafter declares); each request queues the features of its
        newly verified positions (``Request.features``). Partial prefills (``prefill_chunk``)
        only extend their KV and produce no output.
        """
        layers = self.feature_layers if feature_layers is None else tuple(feature_layers)
        for f in (self.fused, self.fused_plain):  # a caller doing its own scheduling (the verifier service)
            if f is not None:
                f.expect(())
        reqs = []
        for it in items:
            r = self.requests.get(it.request_id)
            if r is None:
                raise KeyError(f"request_id: {it.request_id!r} is not running")
            if len(it.drafts) > self.draft_len(r, self.config.max_k):
                raise ValueError(f"draft_tokens: {len(it.drafts)} drafts exceed what {it.request_id} may take")
            reqs.append(r)
        drafts = [list(it.drafts) for it in items]
        chunks, starts, partial = [], [], []
        for r, d, it in zip(reqs, drafts, items):
            starts.append(self.target.length(r.request_id))
            unseen = r.token_ids[starts[-1]:]
            partial.append(it.prefill_chunk is not None and it.prefill_chunk < len(unseen))
            if partial[-1]:
                if d or it.prefill_chunk < 1:
                    raise ValueError(f"prefill_chunk: a partial prefill of {it.request_id} takes >= 1 token "
                                     "and no drafts")
                chunks.append(Chunk(r.request_id, unseen[: it.prefill_chunk], num_logits=0))
            else:
                chunks.append(Chunk(r.request_id, unseen + d, num_logits=1 + len(d)))
        res = self.target.run(chunks, aux_layers=layers)          # logits [sum(1 + n_i) over full rows, V]
        offsets = list(itertools.accumulate([len(c.token_ids) for c in chunks], initial=0))
        for i in (i for i, p in enumerate(partial) if p and res.aux is not None):
            reqs[i].features.add(starts[i], res.aux[offsets[i]: offsets[i + 1]])
        full = [i for i, p in enumerate(partial) if not p]
        if not full:
            return []
        out, num_accepted = self._verify([reqs[i] for i in full], [items[i] for i in full], res.logits)
        outputs = []
        for i, row, a in zip(full, out.tolist(), num_accepted.tolist()):
            r, d = reqs[i], drafts[i]
            if res.aux is not None:  # features of the positions now verified: unseen + accepted drafts
                n = len(chunks[i].token_ids) - len(d) + a
                r.features.add(starts[i], res.aux[offsets[i]: offsets[i] + n])
            r.rounds += 1
            r.accepted += a
            r.drafted += len(d)
            self.target.truncate(r.request_id, len(r.token_ids) + a)
            kept, delta = r.commit(row[: a + 1])
            outputs.append(r.output(kept, delta, a, len(d)))
            if r.finished:
                self._finish(r)
        return outputs

    def _verify(self, reqs: list[Request], items: Sequence[RoundItem],
                logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dev = logits.device
        b = len(reqs)
        kmax = max(len(it.drafts) for it in items)
        num_draft = torch.tensor([len(it.drafts) for it in items], device=dev)
        draft_ids = torch.tensor([list(it.drafts) + [PLACEHOLDER_TOKEN_ID] * (kmax - len(it.drafts)) for it in items],
                                 dtype=torch.long, device=dev).view(b, kmax)
        # rows of request i in the flat logits: starts[i] .. starts[i] + n_i; pad by repeating
        starts = torch.tensor(list(itertools.accumulate([1 + len(it.drafts) for it in items], initial=0))[:-1],
                              device=dev)
        offs = torch.minimum(torch.arange(kmax + 1, device=dev).unsqueeze(0), num_draft.unsqueeze(1))
        padded = logits[starts.unsqueeze(1) + offs]                # [B, K+1, V]
        out, num_accepted = greedy_verify(draft_ids, num_draft, ops.argmax(padded))
        sampled = [i for i, r in enumerate(reqs) if not r.params.greedy]
        if not sampled:
            return out, num_accepted
        p = RowParams.of([reqs[i].params for i in sampled], dev).repeat(kmax + 1)
        rows = padded[sampled].reshape(len(sampled) * (kmax + 1), -1)
        probs = probs_from_logits(rows, p.temperature, p.top_k, p.top_p).view(len(sampled), kmax + 1, -1)
        q = self._draft_probs([items[i] for i in sampled], kmax, probs.shape[-1], dev)
        uniforms, noise = self._coins([reqs[i] for i in sampled], kmax, probs.shape[-1], dev)
        s_out, s_acc = rejection_sample(draft_ids[sampled], num_draft[sampled], probs, q, uniforms, noise)
        out[sampled] = s_out
        num_accepted[sampled] = s_acc
        return out, num_accepted

    @staticmethod
    def _draft_probs(items: Sequence[RoundItem], k: int, vocab: int, dev: torch.device) -> torch.Tensor | None:
        """q [B, K, V] for sampled rows; rows without a distribution are one-hot at their drafts."""
        if all(it.probs is None for it in items):
            return None
        q = torch.zeros(len(items), k, vocab, device=dev)
        for i, it in enumerate(items):
            n = len(it.drafts)
            if it.probs is not None:
                q[i, :n] = it.probs.to(dev)
            elif n:
                q[i, torch.arange(n, device=dev), torch.tensor(list(it.drafts), device=dev)] = 1.0
        return q

    @staticmethod
    def _coins(reqs: list[Request], k: int, vocab: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """This round's draws of each request: k acceptance uniforms and one row of Exponential(1) noise,
        at the request's next draw number (engine/sampling/coins.py: a draw depends only on the request's
        seed and draw number, so its seeded output does not depend on which requests share its rounds)."""
        seeds, counters = [r.params.seed for r in reqs], [r.draws for r in reqs]
        for r in reqs:
            r.draws += 1
        return (coins.draw(seeds, counters, k, coins.Stream.ACCEPT, dev),
                coins.draw(seeds, counters, vocab, coins.Stream.RECOVER, dev, exponential=True))

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
