"""Continuous batching: requests join and leave at round boundaries; one task drives the rounds.

Each loop iteration: release what left (finished or cancelled), admit waiting requests up
to the batch size and prefill them, then run one round for everything running. Every round
gets a ``spec.round`` span (the Draft/Verify/Step RPC spans are its children); every request
gets a ``tandem.request`` span linked to the rounds it took part in. Which verifier and drafter
replica serve a request, and moving it when one is lost, is the driver's business (rounds.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Protocol, Sequence

import grpc
from opentelemetry import trace

from engine.request import FinishReason
from gateway.clients import Verdict
from gateway.delivery import Delivery
from gateway.metrics import GatewayMetrics
from gateway.requests import GatewayRequest
from gateway.rounds import RoundReport
from gateway.settings import GatewaySettings
from gateway.tasks import cancel_and_wait

log = logging.getLogger("tandem.gateway")
tracer = trace.get_tracer("tandem.gateway")

# a verdict with one of these codes means "not now": no verifier is up (lost, restarting) or none has KV room.
# The request waits (its output so far kept) and is admitted again, until its deadline.
WAIT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
RETRY_S = 0.25


class Overloaded(Exception):
    """The queue is full: the request is refused before any work is queued."""


class RoundDriver(Protocol):
    mode: str
    drafter_up: bool

    async def prefill(self, reqs: Sequence[GatewayRequest]) -> list[Verdict]: ...

    async def round(self, reqs: Sequence[GatewayRequest]) -> RoundReport: ...

    async def release(self, ids: Sequence[str]) -> None: ...


class Scheduler:
    def __init__(self, driver: RoundDriver, settings: GatewaySettings, metrics: GatewayMetrics) -> None:
        self.driver = driver
        self.s = settings
        self.m = metrics
        self.delivery = Delivery(metrics)
        self.waiting: deque[GatewayRequest] = deque()
        self.running: dict[str, GatewayRequest] = {}  # by key: a client's request_id is only a label
        self._leaving: list[str] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._retry_at = 0.0  # no admission before this (the last one found no verifier or no room)

    # ---------------------------------------------------------------- the client side
    def submit(self, r: GatewayRequest) -> None:
        if len(self.waiting) >= self.s.max_queue + max(0, self.s.max_batch_size - len(self.running)):
            raise Overloaded(f"queue full ({len(self.waiting)} waiting, {len(self.running)} running)")
        r.span = tracer.start_span("tandem.request", attributes={
            "tandem.request_id": r.request_id, "tandem.prompt_tokens": len(r.prompt_ids),
            "tandem.max_tokens": r.params.max_tokens, "tandem.temperature": r.params.temperature})
        self.waiting.append(r)
        self.m.queue_depth.set(len(self.waiting))
        self._wake.set()

    def cancel(self, r: GatewayRequest) -> None:
        """The client went away (cancelled, deadline): free its KV on both services."""
        if r.finished:
            return
        r.finish_reason = FinishReason.ABORT
        if r in self.waiting:  # maybe parked after it ran: its drafter (and verifier) may hold its state
            self.waiting.remove(r)
            self._end(r, release=True)
        elif r.key in self.running:
            del self.running[r.key]
            self._end(r, release=True)
        self._wake.set()

    # ---------------------------------------------------------------- the loop
    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="round-driver")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _loop(self) -> None:
        while True:
            if not (self.running or self._leaving):
                self._wake.clear()
                if not self.waiting:
                    await self._wake.wait()
                elif self._retry_at > self.m.now():  # only requests waiting for a verifier: not a busy loop
                    try:
                        await asyncio.wait_for(self._wake.wait(), self._retry_at - self.m.now())
                    except asyncio.TimeoutError:
                        pass
            try:
                self._expire()
                await self._release()
                await self._admit()
                if self.running:
                    await self._round(list(self.running.values()))
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:  # not seen in practice: the drivers turn RPC failures into
                # per-request verdicts, and move the requests of a lost verifier to another one
                log.error("call failed: %s: %s", exc.code().name, exc.details())
                for r in list(self.running.values()):
                    self._fail(r, exc.code(), f"verifier failed: {exc.details()}")
            except Exception:
                log.exception("round failed")
                for r in list(self.running.values()):
                    self._fail(r, grpc.StatusCode.INTERNAL, "internal error in the round driver")

    async def _release(self) -> None:
        if self._leaving:
            ids, self._leaving = self._leaving, []
            try:
                await self.driver.release(ids)
            except grpc.aio.AioRpcError as exc:  # a verifier that is gone holds no KV worth freeing
                log.warning("release of %d requests failed: %s", len(ids), exc.code().name)

    def _expire(self) -> None:
        """Waiting requests past their deadline fail (they waited for a verifier, or for room, that did not come)."""
        now = self.m.now()
        for r in [w for w in self.waiting if w.expired(now)]:
            self.waiting.remove(r)
            self.delivery.fail(r, grpc.StatusCode.DEADLINE_EXCEEDED,
                               "no verifier could take the request before its deadline")
            self._end(r, release=True)  # parked after it ran, it may hold state on its drafter

    def _park(self, r: GatewayRequest, reason: str) -> None:
        """``r`` waits at the head of the queue, its output so far kept, and is prefilled again later."""
        self.running.pop(r.key, None)
        self.waiting.appendleft(r)
        self._retry_at = self.m.now() + RETRY_S
        log.info("%s waits (%s); it is admitted again when a verifier can take it", r.request_id, reason)

    async def _admit(self) -> None:
        if self.m.now() < self._retry_at:
            return
        new = []
        while self.waiting and len(self.running) + len(new) < self.s.max_batch_size:
            new.append(self.waiting.popleft())
        self.m.queue_depth.set(len(self.waiting))
        if not new:
            return
        for r in new:
            self.running[r.key] = r
        with tracer.start_as_current_span("spec.prefill", attributes={
                "spec.batch_size": len(new), "spec.request_ids": [r.request_id for r in new]}):
            verdicts = await self.driver.prefill(new)
        self._apply(new, verdicts)

    async def _round(self, reqs: list[GatewayRequest]) -> None:
        t0 = self.m.now()
        with tracer.start_as_current_span("spec.round") as span:
            report = await self.driver.round(reqs)
            accepted = [v.accepted for v in report.verdicts]
            # tokens a round: a co-located Step's replay may run several rounds (--spec-rounds)
            committed = [len(v.committed) / v.rounds for v in report.verdicts if not v.error]
            held = max((v.rounds for v in report.verdicts), default=1)
            tau = sum(committed) / len(committed) if committed else 0.0
            span.set_attributes({
                "spec.mode": self.driver.mode, "spec.batch_size": len(reqs), "spec.rounds": held,
                "spec.request_ids": [r.request_id for r in reqs], "spec.k": report.ks,
                "spec.drafted": report.drafted,
                "spec.accepted": accepted, "spec.acceptance_length": tau,
                "spec.draft_ms": report.draft_ms, "spec.verify_ms": report.verify_ms, "spec.wait_ms": report.wait_ms,
                "spec.early_draft_hits": report.early_hits, "spec.early_draft_misses": report.early_misses,
                "spec.drafter_available": self.driver.drafter_up})
            link = span.get_span_context()
        for r in reqs:
            if r.span is not None:
                r.span.add_link(link)
        self.m.rounds.inc(held)
        self.m.draft_tokens.inc(sum(report.drafted))
        self.m.accepted_tokens.inc(sum(accepted))
        self.m.round_seconds.observe(self.m.now() - t0)
        for phase, ms in (("draft", report.draft_ms), ("verify", report.verify_ms), ("wait", report.wait_ms)):
            self.m.round_phase.labels(phase).observe(ms / 1e3)
        self.m.batch_size.set(len(reqs))
        self.m.drafter_up.set(1 if self.driver.drafter_up else 0)
        self.m.early_outcome(report.early_hits, report.early_misses)
        for n in committed:
            self.m.acceptance_length.observe(n)
        for note in report.notes:
            log.warning(note)
        self._apply(reqs, report.verdicts)

    # ---------------------------------------------------------------- outcomes
    def _apply(self, reqs: Sequence[GatewayRequest], verdicts: Sequence[Verdict]) -> None:
        by_key = {v.request_id: v for v in verdicts}
        now = self.m.now()
        for r in reqs:
            if r.finished:  # cancelled while the round ran: its output is dropped
                continue
            v = by_key.get(r.key)
            if v is not None and v.error and v.error_code in WAIT and not r.expired(now):
                self._park(r, v.error)
                continue
            if v is None or v.error:
                code = v.error_code if v is not None and v.error_code else grpc.StatusCode.INTERNAL
                self._fail(r, code, v.error if v is not None else "no verdict for this request")
                continue
            self.delivery.commit(r, v.committed, v.text, v.finish_reason, v.accepted, v.drafted, now)
            if r.finished:
                del self.running[r.key]
                self._end(r, release=True)

    def _fail(self, r: GatewayRequest, code: grpc.StatusCode, message: str) -> None:
        self.running.pop(r.key, None)
        self.delivery.fail(r, code, message)
        self._end(r, release=True)

    def _end(self, r: GatewayRequest, release: bool) -> None:
        if release:
            self._leaving.append(r.key)
        self.delivery.end(r)
