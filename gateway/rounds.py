"""The split round driver: how the gateway gets one speculative round done for a batch (co-located serving has
no gateway-driven rounds: the verifier runs them over a Serve stream, ``gateway/streamed.py``).

``Draft`` then ``Verify``. While round r is verified, the drafter already drafts
round r+1 assuming every draft of round r is accepted: it is sent round r's drafts as if
committed and asked for k+1 tokens, the first being its guess of the bonus token. When the
verdict accepts all k drafts and the bonus equals the guess, the remaining k tokens are the
next round's drafts, ready at once; otherwise they are dropped and the next round drafts
afresh. Verification is unaffected either way, so output stays lossless.

A feature-fed drafter (an EAGLE head, ``Describe`` says which target layers it reads): the
verifier returns those layers' outputs for the positions each Prefill and Verify verified, as
bfloat16 tensors, and the gateway hands them on with the request's next Draft, each position
once (at most ``feature_window`` of them). Such a drafter cannot draft past unverified tokens,
so it gets no early draft.

Replicas: each request is pinned to one verifier (``Verifiers``: its KV lives there) and one
drafter (its drafting history), both the least loaded when it gets them. A round's batch is
split by verifier and by drafter, and the per-replica RPCs run concurrently. A lost verifier's
requests are prefilled again on another verifier (``gateway/verifiers.py``).

The drafter is never on the critical path for correctness: a failed or late Draft leaves the
affected requests with no drafts this round (plain decoding) and marks that drafter down; from
the next round they move to another drafter that is up, which is sent their whole history (a
resync), or, with none up, decode plainly until the health checks bring one back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Sequence

import grpc

from gateway.clients import DrafterClient, DrafterInfo, DraftResult, Verdict, VerifierClient, slice_probs
from gateway.replicas import Replica, ReplicaPool
from gateway.requests import GatewayRequest
from gateway.settings import GatewaySettings
from gateway.verifiers import Verifiers

log = logging.getLogger("tandem.gateway")


@dataclass
class RoundReport:
    verdicts: list[Verdict]            # one per request, in batch order
    drafted: list[int]                 # drafts verified, per request
    ks: list[int] = field(default_factory=list)  # k per request this round (its own or the server's, capped by room)
    draft_ms: float = 0.0              # waiting for Draft before Verify could start
    verify_ms: float = 0.0
    wait_ms: float = 0.0               # waiting for the early draft after Verify returned
    early_hits: int = 0
    early_misses: int = 0
    notes: list[str] = field(default_factory=list)


def draft_len(r: GatewayRequest, s: GatewaySettings, room: int | None = None) -> int:
    k = s.k if r.params.k is None else r.params.k
    return max(0, min(k, s.max_k, (r.room() if room is None else room) - 1))


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


class SplitDriver:
    mode = "split"

    def __init__(self, verifiers: ReplicaPool[VerifierClient], drafters: ReplicaPool[DrafterClient],
                 settings: GatewaySettings, target_layers: int) -> None:
        self.verifiers = Verifiers(verifiers, self._prefill_on)
        self.drafters = drafters
        drafters.connect = self.connect  # a drafter replica is used only once Describe says this target can feed it
        self.s = settings
        self.target_layers = target_layers
        self.info: DrafterInfo | None = None  # from the first drafter that answers Describe
        self.pools = [verifiers, drafters]

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.info.feature_layers if self.info is not None else ()

    @property
    def drafter_up(self) -> bool:
        return self.drafters.any_up

    async def connect(self, rep: Replica[DrafterClient]) -> bool:
        """Ask a drafter replica what it is; one this target cannot feed, or unlike the others, stays unused."""
        try:
            info = await rep.client.describe()
        except grpc.aio.AioRpcError as exc:
            log.warning("drafter %s: Describe: %s: %s", rep.address, exc.code().name, exc.details())
            return False
        bad = [i for i in info.feature_layers if not 0 <= i < self.target_layers]
        if bad:
            rep.unusable = f"drafter {info.name} reads target layers {bad}, the target has {self.target_layers}"
        elif self.info is not None and (info.feature_layers, info.feature_size) != (self.info.feature_layers,
                                                                                   self.info.feature_size):
            rep.unusable = (f"drafter {info.name} reads target layers {list(info.feature_layers)}, the drafters "
                            f"in use read {list(self.info.feature_layers)}")
        if rep.unusable:
            log.error("%s at %s: not used", rep.unusable, rep.address)
            return False
        if self.info is None:
            self.info = info
            log.info("drafter %s%s", info.name, f", fed target layers {list(info.feature_layers)}"
                     if info.feature_layers else "")
        return True

    async def prefill(self, reqs: Sequence[GatewayRequest]) -> list[Verdict]:
        verdicts = await self.verifiers.prefill(reqs)
        self._keep_features(reqs, verdicts)
        return verdicts

    async def _prefill_on(self, verifier: VerifierClient, reqs: Sequence[GatewayRequest]) -> list[Verdict]:
        layers = self.feature_layers
        if not layers:
            return await verifier.prefill(reqs)
        # features make verdicts large: keep each response within half the message limit
        per_request = [min(len(r.tokens), self.s.feature_window) * 2 * self.info.feature_size for r in reqs]
        verdicts: list[Verdict] = []
        group: list[GatewayRequest] = []
        size = 0
        for r, n in zip(reqs, per_request):
            if group and size + n > self.s.max_message_bytes // 2:
                verdicts += await verifier.prefill(group, layers, self.s.feature_window)
                group, size = [], 0
            group.append(r)
            size += n
        verdicts += await verifier.prefill(group, layers, self.s.feature_window)
        return verdicts

    def _keep_features(self, reqs: Sequence[GatewayRequest], verdicts: Sequence[Verdict]) -> None:
        by_id = {r.key: r for r in reqs}
        for v in verdicts:
            if v.features is not None and v.request_id in by_id:
                by_id[v.request_id].features.add(v.features_start, v.features, self.s.feature_window)

    # ---------------------------------------------------------------- drafters
    def _drafter_for(self, r: GatewayRequest) -> Replica[DrafterClient] | None:
        """The request's drafter; when that one is down, another that is up, sent the whole history (resync)."""
        rep = self.drafters.pinned(r.key)
        if rep is not None and rep.up:
            return rep
        r.drafter_len, r.ready_drafts = 0, None
        return self.drafters.pin(r.key)

    def _has_drafter(self, r: GatewayRequest) -> bool:
        rep = self.drafters.pinned(r.key)
        return rep is not None and rep.up

    async def _draft(self, reqs, starts, tokens, ks, features=None) -> list[DraftResult | None]:
        """Draft on each request's drafter, the drafters concurrently; None where that drafter failed."""
        out: list[DraftResult | None] = [None] * len(reqs)

        async def one(rep: Replica[DrafterClient], idx: list[int]) -> None:
            try:
                got = await rep.client.draft([reqs[i] for i in idx], [starts[i] for i in idx],
                                             [tokens[i] for i in idx], [ks[i] for i in idx],
                                             None if features is None else [features[i] for i in idx])
            except grpc.aio.AioRpcError as exc:
                self.drafters.mark_down(rep, f"{exc.code().name}: {exc.details()}")
                return
            for i, res in zip(idx, got):
                out[i] = res

        groups = self.drafters.group([r.key for r in reqs])
        await asyncio.gather(*(one(rep, idx) for rep, idx in groups.items()))
        return out

    # ---------------------------------------------------------------- the round
    async def round(self, reqs: Sequence[GatewayRequest]) -> RoundReport:
        n = len(reqs)
        ks = [draft_len(r, self.s) for r in reqs]
        drafts: list[list[int]] = [[] for _ in reqs]
        probs: list = [None] * n
        need = []
        for i, r in enumerate(reqs):
            drafter = self._drafter_for(r) if ks[i] else None
            ready, r.ready_drafts = r.ready_drafts, None
            if drafter is None:
                continue
            if ready is not None:
                drafts[i] = ready[: ks[i]]
                probs[i] = slice_probs(r.ready_probs, 0, len(drafts[i]))
            else:
                need.append(i)
        report = RoundReport([], [], ks)
        if need:
            t0 = time.perf_counter()
            feats = [reqs[i].features.take() for i in need] if self.feature_layers else None
            got = await self._draft([reqs[i] for i in need], [reqs[i].drafter_len for i in need],
                                    [reqs[i].tokens[reqs[i].drafter_len:] for i in need], [ks[i] for i in need], feats)
            report.draft_ms = _ms(t0)
            for j, (i, res) in enumerate(zip(need, got)):
                r = reqs[i]
                if res is None:  # not delivered: keep the features for the next try
                    if feats is not None and feats[j][1] is not None:
                        r.features.add(feats[j][0], feats[j][1], self.s.feature_window)
                elif res.resync:
                    r.drafter_len = 0
                elif res.error:
                    report.notes.append(f"{r.request_id}: draft rejected: {res.error}")
                else:
                    r.drafter_len = len(r.tokens)
                    drafts[i] = res.tokens[: ks[i]]
                    probs[i] = slice_probs(res.probs, 0, len(drafts[i]))

        # verify round r while the drafter already drafts round r+1 (assuming full acceptance)
        # (a feature-fed drafter cannot draft past tokens the target has not verified yet)
        early = [i for i in range(n)
                 if drafts[i] and self.s.early_draft and not self.feature_layers and self._has_drafter(reqs[i])]
        early_k = {i: draft_len(reqs[i], self.s, room=reqs[i].room() - len(drafts[i]) - 1) for i in early}
        early = [i for i in early if early_k[i] > 0]
        bases = {i: len(reqs[i].tokens) for i in early}
        early_task = asyncio.create_task(self._draft(
            [reqs[i] for i in early], [reqs[i].drafter_len for i in early],
            [reqs[i].tokens[reqs[i].drafter_len:] + drafts[i] for i in early], [early_k[i] + 1 for i in early]))
        t0 = time.perf_counter()
        try:
            report.verdicts = await self.verifiers.call(reqs, lambda client, idx: client.verify(
                [reqs[i] for i in idx], [drafts[i] for i in idx], [probs[i] for i in idx], self.feature_layers,
                self.s.feature_window))
        except BaseException:
            early_task.cancel()
            raise
        self._keep_features(reqs, report.verdicts)
        report.verify_ms = _ms(t0)
        report.drafted = [v.drafted for v in report.verdicts]
        t0 = time.perf_counter()
        early_results = await early_task
        report.wait_ms = _ms(t0) if early else 0.0

        for i, res in zip(early, early_results):
            r, v = reqs[i], report.verdicts[i]
            if res is None or v.error:
                report.early_misses += 1  # the drafter's state is unknown: keep the old sync point
                continue
            if res.resync or res.error:
                r.drafter_len = 0 if res.resync else r.drafter_len
                report.early_misses += 1
                continue
            # the drafter now holds tokens[:base] + drafts; its guess res.tokens[0] is the bonus
            if (v.accepted == len(drafts[i]) and len(v.committed) == v.accepted + 1 and v.finish_reason is None
                    and res.tokens and v.committed[-1] == res.tokens[0]):
                r.drafter_len = bases[i] + len(drafts[i])
                r.ready_drafts = res.tokens[1:]
                r.ready_probs = slice_probs(res.probs, 1, len(r.ready_drafts)) if res.probs is not None else None
                report.early_hits += 1
            else:
                r.drafter_len = bases[i] + min(v.accepted, len(drafts[i]))
                report.early_misses += 1
        return report

    async def release(self, ids: Sequence[str]) -> None:
        await asyncio.gather(self.verifiers.release(ids), self.drafters.release(ids))
