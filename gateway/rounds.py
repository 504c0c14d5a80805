"""Round drivers: how the gateway gets one speculative round done for a batch.

Co-located: one ``Step`` to a verifier that drafts itself.

Split: ``Draft`` then ``Verify``. While round r is verified, the drafter already drafts
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

The drafter is never on the critical path for correctness: a failed or late Draft leaves the
affected requests with no drafts (plain decoding) and marks the drafter down; a background
health probe brings drafting back, resyncing every request's history.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Sequence

import grpc

from gateway.clients import (DrafterClient, DrafterInfo, DraftResult, Verdict, VerifierClient, is_serving,
                             slice_probs)
from gateway.requests import GatewayRequest
from gateway.settings import GatewaySettings

log = logging.getLogger("tandem.gateway")


@dataclass
class RoundReport:
    verdicts: list[Verdict]
    drafted: list[int]                 # drafts sent for verification, per request
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


class ColocatedDriver:
    mode = "colocated"

    def __init__(self, verifier: VerifierClient, settings: GatewaySettings) -> None:
        self.verifier = verifier
        self.s = settings

    async def prefill(self, reqs: Sequence[GatewayRequest]) -> list[Verdict]:
        return await self.verifier.prefill(reqs)

    async def round(self, reqs: Sequence[GatewayRequest]) -> RoundReport:
        ks = [draft_len(r, self.s) for r in reqs]
        t0 = time.perf_counter()
        verdicts = await self.verifier.step(reqs, ks)
        return RoundReport(verdicts, [v.drafted for v in verdicts], verify_ms=_ms(t0))

    async def release(self, ids: Sequence[str]) -> None:
        await self.verifier.release(ids)

    @property
    def drafter_up(self) -> bool:
        return True


class SplitDriver:
    mode = "split"

    def __init__(self, verifier: VerifierClient, drafter: DrafterClient, settings: GatewaySettings,
                 target_layers: int) -> None:
        self.verifier = verifier
        self.drafter = drafter
        self.s = settings
        self.target_layers = target_layers
        self.info: DrafterInfo | None = None  # from Describe, once the drafter answers
        self.drafter_up = True
        self.unusable = ""  # why a drafter that answers cannot be used with this target (never retried)
        self._resync = False
        self._probe: asyncio.Task | None = None

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.info.feature_layers if self.info is not None else ()

    async def connect(self) -> bool:
        """Ask the drafter what it is; a drafter this target cannot feed stays unused (plain decoding)."""
        try:
            info = await self.drafter.describe()
        except grpc.aio.AioRpcError as exc:
            self.mark_down(f"Describe: {exc.code().name}: {exc.details()}")
            return False
        bad = [i for i in info.feature_layers if not 0 <= i < self.target_layers]
        if bad:
            self.unusable = f"drafter {info.name} reads target layers {bad}, the target has {self.target_layers}"
            log.error("%s: plain decoding", self.unusable)
            self.drafter_up = False
            return False
        self.info = info
        log.info("drafter %s%s", info.name, f", fed target layers {list(info.feature_layers)}"
                 if info.feature_layers else "")
        return True

    async def prefill(self, reqs: Sequence[GatewayRequest]) -> list[Verdict]:
        layers = self.feature_layers
        if not layers:
            return await self.verifier.prefill(reqs)
        # features make verdicts large: keep each response within half the message limit
        per_request = [min(len(r.tokens), self.s.feature_window) * 2 * self.info.feature_size for r in reqs]
        verdicts: list[Verdict] = []
        group: list[GatewayRequest] = []
        size = 0
        for r, n in zip(reqs, per_request):
            if group and size + n > self.s.max_message_bytes // 2:
                verdicts += await self.verifier.prefill(group, layers, self.s.feature_window)
                group, size = [], 0
            group.append(r)
            size += n
        verdicts += await self.verifier.prefill(group, layers, self.s.feature_window)
        self._keep_features(reqs, verdicts)
        return verdicts

    def _keep_features(self, reqs: Sequence[GatewayRequest], verdicts: Sequence[Verdict]) -> None:
        by_id = {r.request_id: r for r in reqs}
        for v in verdicts:
            if v.features is not None and v.request_id in by_id:
                by_id[v.request_id].features.add(v.features_start, v.features, self.s.feature_window)

    # ---------------------------------------------------------------- drafter health
    def mark_down(self, reason: str) -> None:
        if self.drafter_up:
            log.warning("drafter unavailable (%s): plain decoding until it is back", reason)
        self.drafter_up = False
        if not self.unusable and (self._probe is None or self._probe.done()):
            self._probe = asyncio.create_task(self._wait_for_drafter())

    async def _wait_for_drafter(self) -> None:
        while not (await is_serving(self.drafter.channel, timeout_s=self.s.drafter_probe_s)
                   and await self.connect()):
            if self.unusable:
                return
            await asyncio.sleep(self.s.drafter_probe_s)
        log.info("drafter is back: drafting resumes")
        self._resync = True  # a restarted drafter knows no history: send it all
        self.drafter_up = True

    async def _draft(self, reqs, starts, tokens, ks, features=None) -> list[DraftResult] | None:
        if not reqs:
            return []
        try:
            return await self.drafter.draft(reqs, starts, tokens, ks, features)
        except grpc.aio.AioRpcError as exc:
            self.mark_down(f"{exc.code().name}: {exc.details()}")
            return None

    # ---------------------------------------------------------------- the round
    async def round(self, reqs: Sequence[GatewayRequest]) -> RoundReport:
        n = len(reqs)
        ks = [draft_len(r, self.s) for r in reqs]
        if self._resync:
            for r in reqs:
                r.drafter_len, r.ready_drafts = 0, None
            self._resync = False
        drafts: list[list[int]] = [[] for _ in reqs]
        probs: list = [None] * n
        need = []
        for i, r in enumerate(reqs):
            ready, r.ready_drafts = r.ready_drafts, None
            if ks[i] == 0:
                continue
            if ready is not None:
                drafts[i] = ready[: ks[i]]
                probs[i] = slice_probs(r.ready_probs, 0, len(drafts[i]))
            else:
                need.append(i)
        report = RoundReport([], [])
        if need and self.drafter_up:
            t0 = time.perf_counter()
            feats = [reqs[i].features.take() for i in need] if self.feature_layers else None
            got = await self._draft([reqs[i] for i in need], [reqs[i].drafter_len for i in need],
                                    [reqs[i].tokens[reqs[i].drafter_len:] for i in need], [ks[i] for i in need], feats)
            report.draft_ms = _ms(t0)
            if got is None and feats is not None:  # not delivered: keep them for the next try
                for i, (start, f) in zip(need, feats):
                    if f is not None:
                        reqs[i].features.add(start, f, self.s.feature_window)
            for i, res in zip(need, got or []):
                r = reqs[i]
                if res.resync:
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
                 if drafts[i] and self.drafter_up and self.s.early_draft and not self.feature_layers]
        early_k = {i: draft_len(reqs[i], self.s, room=reqs[i].room() - len(drafts[i]) - 1) for i in early}
        early = [i for i in early if early_k[i] > 0]
        bases = {i: len(reqs[i].tokens) for i in early}
        early_task = asyncio.create_task(self._draft(
            [reqs[i] for i in early], [reqs[i].drafter_len for i in early],
            [reqs[i].tokens[reqs[i].drafter_len:] + drafts[i] for i in early], [early_k[i] + 1 for i in early]))
        t0 = time.perf_counter()
        try:
            report.verdicts = await self.verifier.verify(reqs, drafts, probs, self.feature_layers,
                                                         self.s.feature_window)
        except BaseException:
            early_task.cancel()
            raise
        self._keep_features(reqs, report.verdicts)
        report.verify_ms = _ms(t0)
        report.drafted = [len(d) for d in drafts]
        t0 = time.perf_counter()
        early_results = await early_task
        report.wait_ms = _ms(t0) if early else 0.0

        by_id = {v.request_id: v for v in report.verdicts}
        for i, res in zip(early, early_results or [None] * len(early)):
            r, v = reqs[i], by_id.get(reqs[i].request_id)
            if res is None or v is None or v.error:
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
        await self.verifier.release(ids)
        if self.drafter_up:
            try:
                await self.drafter.release(ids)
            except grpc.aio.AioRpcError as exc:
                self.mark_down(f"{exc.code().name}: {exc.details()}")
