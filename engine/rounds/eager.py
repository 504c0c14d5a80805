"""The eager round: one target forward over every row's unseen tokens and drafts, verified step by step.

Per row it sends ``[unseen committed tokens] + drafts`` through the target in one forward (a new request's
prefill is its first round: its unseen tokens are the whole prompt; a partial prefill chunk only grows its
KV), then greedy rows accept while the draft equals the target's argmax and sampled rows run rejection
sampling with their coins (engine/sampling/coins.py: each request's draws at its seed and draw number, as
the fused round draws them). It owns nothing across rounds: it rolls each row's target KV back past the
accepted tokens, queues the target features a feature-fed drafter reads (``Request.features``) and returns
one ``RowResult`` per row; the decoder commits them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import torch

from engine.models import ops
from engine.request import Request
from engine.rounds.base import RoundItem, RowResult
from engine.runner import Chunk, ModelRunner
from engine.sampling import PLACEHOLDER_TOKEN_ID, RowParams, coins, greedy_verify, probs_from_logits, rejection_sample
from engine.upload import upload


@dataclass
class Launched:
    """An eager round on its way (``EagerRound.launch``): what ``finish`` needs to read and hand it out."""

    reqs: Sequence[Request]
    items: Sequence[RoundItem]
    drafts: list[list[int]]          # each row's drafts through the target (padding included)
    widths: list[int]                # each row's tokens through the target
    starts: list[int]                # each row's KV length before the round
    full: list[int]                  # rows that are not partial prefills (they have a result)
    aux: torch.Tensor | None         # [sum(widths), F] the target features of every row's tokens
    out: torch.Tensor | None         # [len(full), K + 2] long: each full row's tokens, then its accepted count
    done: "torch.cuda.Event | None"  # recorded after ``out``'s copy to the host (CUDA)


class EagerRound:
    def __init__(self, target: ModelRunner, pad: bool | None = None, k: int = 0) -> None:
        self.target = target
        self.k = k  # a padded round's rows take at least this many drafts: the verify shape captured at warm-up
        # pad decoding rows to one draft count (``_uniform``): only worth it where the runner replays step graphs
        self.pad = target.graphs is not None if pad is None else pad
        self.padded_rounds = 0  # rounds whose rows were padded to one draft count
        self._pinned: torch.Tensor | None = None  # where a round's output lands on the host (CUDA), grown as needed

    def run(self, reqs: Sequence[Request], items: Sequence[RoundItem], aux_layers: tuple[int, ...]
            ) -> list[RowResult | None]:
        """One target forward + verification for these rows (each request at most once) -> per row its result,
        None for a partial prefill. ``aux_layers``: target layers whose outputs each request queues for its
        newly verified positions."""
        return self.finish(self.launch(reqs, items, aux_layers))

    def launch(self, reqs: Sequence[Request], items: Sequence[RoundItem], aux_layers: tuple[int, ...]) -> Launched:
        """``run``'s device work, queued: nothing waits for the GPU here, so a graph round launched after it (the
        decoder's next round launched ahead) queues behind it and ``finish`` waits for this round alone."""
        starts = [self.target.length(r.request_id) for r in reqs]
        drafts = [list(it.drafts) for it in items]
        if self.pad:
            uniform = _uniform(drafts, reqs, items, starts, self.k)
            self.padded_rounds += uniform is not drafts
            drafts = uniform
        chunks, partial = [], []
        for r, d, it, start in zip(reqs, drafts, items, starts):
            unseen = r.token_ids[start:]
            partial.append(it.prefill_chunk is not None and it.prefill_chunk < len(unseen))
            if partial[-1]:
                if d or it.prefill_chunk < 1:
                    raise ValueError(f"prefill_chunk: a partial prefill of {it.request_id} takes >= 1 token "
                                     "and no drafts")
                chunks.append(Chunk(r.request_id, unseen[: it.prefill_chunk], num_logits=0))
            else:
                chunks.append(Chunk(r.request_id, unseen + d, num_logits=1 + len(d)))
        res = self.target.run(chunks, aux_layers=aux_layers)          # logits [sum(1 + n_i) over full rows, V]
        widths = [len(c.token_ids) for c in chunks]
        offsets = list(itertools.accumulate(widths, initial=0))
        for i in (i for i, p in enumerate(partial) if p and res.aux is not None):
            reqs[i].features.add(starts[i], res.aux[offsets[i]: offsets[i + 1]])
        full = [i for i, p in enumerate(partial) if not p]
        launched = Launched(reqs, items, drafts, widths, starts, full, res.aux, None, None)
        if not full:
            return launched
        out, num_accepted = self._verify([reqs[i] for i in full], [items[i] for i in full], res.logits,
                                         [chunks[i].num_logits for i in full])
        result = torch.cat([out, num_accepted[:, None]], dim=1)                # [len(full), K + 2]
        if not result.is_cuda:
            launched.out = result
            return launched
        if self._pinned is None or self._pinned.numel() < result.numel():
            self._pinned = torch.empty(max(result.numel(), 1024), dtype=torch.long, pin_memory=True)
        launched.out = self._pinned[: result.numel()].view(result.shape)
        launched.out.copy_(result, non_blocking=True)
        launched.done = torch.cuda.Event()
        launched.done.record()
        return launched

    def finish(self, p: Launched) -> list[RowResult | None]:
        """Wait for a launched round, roll each row's KV back past what it accepted, queue the features of its
        newly verified positions and return its result (None for a partial prefill)."""
        results: list[RowResult | None] = [None] * len(p.reqs)
        if p.out is None:
            return results
        if p.done is not None:
            p.done.synchronize()
        offsets = list(itertools.accumulate(p.widths, initial=0))
        for i, row in zip(p.full, p.out.tolist()):
            r, d, a = p.reqs[i], p.drafts[i], row[-1]
            if p.aux is not None:  # features of the positions now verified: unseen + accepted drafts
                n = p.widths[i] - len(d) + a
                r.features.add(p.starts[i], p.aux[offsets[i]: offsets[i] + n])
            self.target.truncate(r.request_id, len(r.token_ids) + a)
            results[i] = RowResult(row[: a + 1], a, len(p.items[i].drafts))
        return results

    def _verify(self, reqs: list[Request], items: Sequence[RoundItem], logits: torch.Tensor,
                widths: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """logits: [sum(widths), V], row i's ``widths[i]`` (1 + its drafts, padding included) after row i - 1's."""
        dev = logits.device
        b = len(reqs)
        kmax = max(len(it.drafts) for it in items)
        num_draft = upload([len(it.drafts) for it in items], dev)
        draft_ids = upload([list(it.drafts) + [PLACEHOLDER_TOKEN_ID] * (kmax - len(it.drafts)) for it in items],
                           dev).view(b, kmax)
        # rows of request i in the flat logits: starts[i] .. starts[i] + n_i; pad by repeating
        starts = upload(list(itertools.accumulate(widths, initial=0))[:-1], dev)
        offs = torch.minimum(torch.arange(kmax + 1, device=dev).unsqueeze(0), num_draft.unsqueeze(1))
        padded = logits[starts.unsqueeze(1) + offs]                # [B, K+1, V]
        out, num_accepted = greedy_verify(draft_ids, num_draft, ops.argmax(padded))
        sampled = [i for i, r in enumerate(reqs) if not r.params.greedy]
        if not sampled:
            return out, num_accepted
        params = [reqs[i].params for i in sampled]
        p = RowParams.of(params, dev).repeat(kmax + 1)
        at = upload(sampled, dev)  # (a list index would copy it with a stream sync)
        rows = padded[at].reshape(len(sampled) * (kmax + 1), -1)
        filtered = any(x.filters for x in params)  # known here: no look on the device
        probs = probs_from_logits(rows, p.temperature, p.top_k, p.top_p, filtered).view(len(sampled), kmax + 1, -1)
        q = self._draft_probs([items[i] for i in sampled], kmax, probs.shape[-1], dev)
        uniforms, noise = self._coins([reqs[i] for i in sampled], kmax, probs.shape[-1], dev)
        s_out, s_acc = rejection_sample(draft_ids[at], num_draft[at], probs, q, uniforms, noise)
        out[at] = s_out
        num_accepted[at] = s_acc
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
                q[i, :n] = it.probs.to(dev, non_blocking=True)
            elif n:
                q[i, torch.arange(n, device=dev), upload(list(it.drafts), dev)] = 1.0
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


def _uniform(drafts: list[list[int]], reqs: Sequence[Request], items: Sequence[RoundItem],
             starts: Sequence[int], k: int) -> list[list[int]]:
    """The drafts each row sends through the target: a round of decoding rows (one unseen token each) with drafts
    is padded to one count, the longest or ``k`` where that is more (the verify shape captured at warm-up), so
    that it is a uniform step and replays the runner's step graph instead of running eagerly or capturing one.
    The padding (the row's last token, any id would do) is never verified: acceptance reads only a row's own
    ``items[i].drafts``, and its KV and features past them are dropped. Rows stay as they are where none has
    drafts, any row is a prompt chunk or a padded row would pass its context."""
    longest = max((len(d) for d in drafts), default=0)
    kmax = max(longest, k)
    if not longest or all(len(d) == kmax for d in drafts) or any(it.prefill_chunk is not None for it in items):
        return drafts
    if any(len(r.token_ids) - s != 1 or len(r.token_ids) + kmax > r.max_context for r, s in zip(reqs, starts)):
        return drafts
    return [d + [r.token_ids[-1]] * (kmax - len(d)) for d, r in zip(drafts, reqs)]
