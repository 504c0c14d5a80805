"""Drafting with an EAGLE head: one decoder layer fed the target's features (engine/models/eagle.py).

Per request the drafter holds *true* entries (token + the target's feature of the position
before it) in its own one-layer paged KV, plus a buffer of fused target features it has been
handed but not consumed yet. Per call and request it
(1) drops last round's draft-chain entries and any entry whose token is no longer committed;
(2) appends true entries for committed positions whose preceding feature it now has (one
    batched forward for all requests, always re-feeding at least the last true entry so its
    output is fresh);
(3) drafts k tokens: the output of the last true entry gives draft 1, then each step feeds the
    draft token with the head's own previous output.
The head's KV need not start at the first position: after a gap in the features (a drafter that
restarted, features cut to a window to keep messages small) it starts over from the first
position it has features for. Rotary attention depends only on relative positions, so a later
start costs only the context it leaves out. A request whose features do not reach its last
committed token gets no drafts: the target then decodes it plainly, which is always correct.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from engine.config import EngineConfig
from engine.drafters.base import DraftProposal, DraftRequest
from engine.drafters.draft_sampling import DraftSampler
from engine.models.eagle import EagleHead
from engine.runner import Chunk, ModelRunner
from engine.sampling.rejection import PLACEHOLDER_TOKEN_ID
from engine.upload import upload


STEP_CAPTURE_ROWS = 8  # capture_prefills also captures the head's steps of batches up to this many rows


@dataclass
class _State:
    base: int = 1                                    # position of the first true entry in the head's KV
    tokens: list[int] = field(default_factory=list)  # tokens of the true entries base, base + 1, ...
    feats: torch.Tensor | None = None                # [m, hidden] fused features of positions feat_start ..
    feat_start: int = 0

    @property
    def feat_end(self) -> int:
        return self.feat_start + (0 if self.feats is None else self.feats.shape[0])

    def features(self, start: int, end: int) -> torch.Tensor:
        """[end - start, hidden] fused features of positions start .. end - 1 (a view, no copy)."""
        return self.feats[start - self.feat_start: end - self.feat_start]


class EagleDrafter:
    deterministic = False
    graph_rounds = True  # engine/drafters/eagle_graph.py
    tree_rounds = True
    primes = True  # ``prime``: the head's catch-up over a prompt alone; the fused round drafts
    batch_weight = 1

    def __init__(self, name: str, head: EagleHead, config: EngineConfig) -> None:
        self.name = name
        self.head = head
        self.target_features = head.eagle.aux_layers
        self.feature_size = head.eagle.aux_size
        self.runner = ModelRunner(head, config)
        self.k = config.k  # the default draft length: the step shapes capture_prefills captures
        self.sampler = DraftSampler(head.eagle.target.vocab_size, config.draft_top_m)
        self._states: dict[str, _State] = {}

    def round_program(self, rows: int, k: int, max_blocks: int, sampled: bool = False, tree=None):
        from engine.drafters.eagle_graph import EagleProgram

        return EagleProgram(self, rows, k, max_blocks, sampled, tree)

    def capture_prefills(self) -> int:
        """The head's prompt catch-up graphs (a feature row per token: the fused features), before requests; the
        short catch-ups of 2 .. k + 1 entries further in (the first two context buckets); and the steps
        ``propose`` replays for small batches (a catch-up of 1 .. k + 1 entries, the draft chain's single ones),
        both up to ``STEP_CAPTURE_ROWS`` rows: a drafter service drafts every round through them. Returns how many
        graphs it captured."""
        n = self.runner.capture_prefills(features=self.head.config.hidden_size)
        if self.runner.prefill_graphs is not None and self.runner.prefill_graphs.capture:
            n += self.runner.prefill_graphs.capture_chunks(STEP_CAPTURE_ROWS, features=self.head.config.hidden_size)
        graphs = self.runner.graphs
        if graphs is not None and graphs.capture:
            n += graphs.capture_all(tuple(range(1, self.k + 2)), features=self.head.config.hidden_size,
                                    max_rows=STEP_CAPTURE_ROWS)
        return n

    def graph_ready(self, request_id: str, committed: int) -> bool:
        """After ``propose``: the head holds true entries 1 .. committed - 1 (base 1), what a fused round
        continues from; from then on the fused rounds keep the head's KV and this state goes stale."""
        st = self._states.get(request_id)
        return st is not None and st.base == 1 and len(st.tokens) == committed - 1

    def release(self, request_id: str) -> None:
        self._states.pop(request_id, None)
        self.sampler.release(request_id)
        self.runner.free(request_id)

    @torch.inference_mode()
    def _take_features(self, st: _State, r: DraftRequest) -> None:
        if r.features is None or r.features.shape[0] == 0:
            return
        fused = self.head.fuse_features(r.features.to(self.runner.device, non_blocking=True))
        if st.feats is None or r.features_start > st.feat_end or r.features_start < st.feat_start:
            st.feats, st.feat_start = fused, r.features_start       # a gap or a rewind: start over
        else:
            st.feats = torch.cat([st.feats[: r.features_start - st.feat_start], fused])

    def _catch_up(self, r: DraftRequest) -> tuple[list[int], torch.Tensor] | None:
        """Tokens and features of the entries to (re)append; None when this request cannot draft."""
        st = self._states.setdefault(r.request_id, _State())
        self._take_features(st, r)
        committed = r.token_ids
        last = len(committed) - 1            # entry `last` (the newest token) needs feature last - 1
        if last < 1 or st.feats is None or not st.feat_start <= last - 1 < st.feat_end:
            self._reset(r.request_id, st)
            return None
        # (1) true entries whose tokens are still committed, minus the last one (re-fed for a fresh output)
        keep = 0
        limit = min(len(st.tokens), last + 1 - st.base)
        while keep < limit and st.tokens[keep] == committed[st.base + keep]:
            keep += 1
        keep = max(0, keep - 1)
        first = st.base + keep
        if first - 1 < st.feat_start:        # a gap: start the head's KV over where the features begin
            self._reset(r.request_id, st)
            st.base, keep = max(1, st.feat_start + 1), 0
            first = st.base
        elif self.runner.length(r.request_id) > keep:
            self.runner.truncate(r.request_id, keep)
        del st.tokens[keep:]
        # (2) entries first .. last
        tokens = list(committed[first: last + 1])
        feats = st.features(first - 1, last)  # entry p reads the feature of p - 1
        st.tokens.extend(tokens)
        # the next call re-feeds entry `last` at least, which needs the feature of last - 1
        drop = (last - 1) - st.feat_start
        if drop > 0:
            st.feats, st.feat_start = st.feats[drop:], st.feat_start + drop
        return tokens, feats

    def _reset(self, request_id: str, st: _State) -> None:
        self.runner.free(request_id)
        st.tokens.clear()

    def prime(self, requests: Sequence[DraftRequest]) -> None:
        """The head's true entries up to each request's last committed token (``graph_ready``), from the features
        handed over, in one forward whose output nobody reads: no drafts, no host sync."""
        _, chunks, features = self._catch_ups(requests)
        if chunks:
            self.runner.run(chunks, features=features)

    def _catch_ups(self, requests: Sequence[DraftRequest]) -> tuple[list[int], list[Chunk], torch.Tensor | None]:
        """The requests that can draft (their indices), the entries each appends (``_catch_up``) as a chunk, and
        the features of them all, in order (None: none can)."""
        active, chunks, feats = [], [], []
        for i, r in enumerate(requests):
            got = self._catch_up(r)
            if got is not None:
                active.append(i)
                chunks.append(Chunk(r.request_id, got[0]))
                feats.append(got[1])
        return active, chunks, torch.cat(feats) if feats else None

    def propose(self, requests: Sequence[DraftRequest]) -> DraftProposal:
        drafts: list[list[int]] = [[] for _ in requests]
        probs: torch.Tensor | None = None
        active, chunks, features = self._catch_ups(requests)
        if not active:
            return DraftProposal(token_ids=drafts, probs=None)
        kmax = max(requests[i].k for i in active)
        picked: list[tuple[list[int], torch.Tensor]] = []  # each step's rows (of ``requests``) and tokens [rows]
        ids = None
        for step in range(kmax):
            out = self.runner.run(chunks, features=features, input_ids=ids)
            tokens, q = self.sampler.pick(out.logits, [requests[i] for i in active], step)
            if q is not None:
                if probs is None:
                    probs = torch.zeros(len(requests), kmax, q.shape[-1], device=q.device)
                probs[upload(active, q.device), step] = q
            picked.append((active, tokens))
            keep = [j for j, i in enumerate(active) if requests[i].k > step + 1]
            if not keep:
                break
            # the next step reads this one's tokens on the device: the host reads the drafts once, at the end
            rows = None if len(keep) == len(active) else upload(keep, tokens.device)
            ids = tokens if rows is None else tokens[rows]
            active = [active[j] for j in keep]
            chunks = [Chunk(requests[i].request_id, [PLACEHOLDER_TOKEN_ID]) for i in active]
            features = out.hidden if rows is None else out.hidden[rows]
        values = iter(torch.cat([t for _, t in picked]).tolist())  # the round's one host sync
        for drafted, _ in picked:
            for i in drafted:
                drafts[i].append(next(values))
        self.sampler.end_round((r.request_id, r.params) for r in requests)
        return DraftProposal(token_ids=drafts, probs=probs)
