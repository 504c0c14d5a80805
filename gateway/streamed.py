"""Co-located serving over Serve streams: the verifier runs the rounds, the gateway admits, cancels and streams.

Each verifier replica gets one persistent ``Verifier.Serve`` stream (a ``Link``) while it has requests. A new
request is pinned to the least-loaded verifier and admitted on its stream under a slot (a number of the link's
own: no client-chosen id ever reaches the verifier); the verifier runs rounds back to back for everything it
holds and sends one packed ``RoundReport`` per round. Each report is applied here: every row's tokens and text
go to its client's stream (``Delivery``), and the round gets its ``spec.round`` span, timed by the verifier's
clock, linked from the requests' spans. Cancellation sends the slot back; closing a stream frees everything it
admitted.

A stream that fails (the verifier restarted or is gone, or its health checks fail) moves its requests: each is
admitted again, with the output it has so far, on another verifier, or on the same one once it is back, and its
client stream goes on without a gap or a repeat. While no verifier is up, requests wait (``parked``) until one
is, each until its own deadline (DEADLINE_EXCEEDED then).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
from typing import AsyncIterator

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace

from engine.request import FinishReason
from gateway.clients import VerifierClient
from gateway.delivery import Delivery
from gateway.metrics import GatewayMetrics
from gateway.replicas import Replica, ReplicaPool
from gateway.requests import GatewayRequest
from gateway.scheduler import Overloaded
from gateway.settings import GatewaySettings
from gateway.tasks import cancel_and_wait
from protos.tandem.v1 import verifier_pb2
from rpc import convert, tensors

log = logging.getLogger("tandem.gateway")
tracer = trace.get_tracer("tandem.gateway")

_CODES = {c.value[0]: c for c in grpc.StatusCode}
_CLOSE = object()


class Link:
    """One verifier's Serve stream: its slots, what goes out, the task that reads what comes back."""

    def __init__(self, rep: Replica[VerifierClient]) -> None:
        self.rep = rep
        self.slots: dict[int, GatewayRequest] = {}
        self.out: asyncio.Queue = asyncio.Queue()
        self._next = itertools.count()
        self.task: asyncio.Task | None = None

    def slot_for(self, r: GatewayRequest) -> int:
        slot = next(self._next)
        self.slots[slot] = r
        r.slot = slot
        return slot

    async def controls(self) -> AsyncIterator[verifier_pb2.ServeControl]:
        """What the stream sends: admissions and cancellations as they come, several at once when queued."""
        while True:
            items = [await self.out.get()]
            while not self.out.empty():
                items.append(self.out.get_nowait())
            ctl = verifier_pb2.ServeControl()
            cancels = []
            for item in items:
                if item is _CLOSE:
                    return
                if isinstance(item, int):
                    cancels.append(item)
                else:
                    ctl.admit.append(item)
            if cancels:
                ctl.cancel.CopyFrom(tensors.encode(cancels, "int32"))
            yield ctl


class StreamedScheduler:
    """The client side of the scheduler (``submit``, ``cancel``) over the verifiers' Serve streams."""

    mode = "verifier-rounds"  # the verifier runs the rounds (co-located, or split with its own drafter service)

    def __init__(self, verifiers: ReplicaPool[VerifierClient], settings: GatewaySettings,
                 metrics: GatewayMetrics) -> None:
        self.pool = verifiers
        self.pools = [verifiers]
        self.s = settings
        self.m = metrics
        self.delivery = Delivery(metrics)
        self.links: dict[Replica[VerifierClient], Link] = {}
        self.in_flight = 0
        self.parked: list[GatewayRequest] = []  # waiting for a verifier to be up
        self._unpark: asyncio.Task | None = None

    # ---------------------------------------------------------------- the client side
    def submit(self, r: GatewayRequest) -> None:
        if self.in_flight >= self.s.max_batch_size + self.s.max_queue:
            raise Overloaded(f"queue full ({self.in_flight} requests in flight)")
        r.span = tracer.start_span("tandem.request", attributes={
            "tandem.request_id": r.request_id, "tandem.prompt_tokens": len(r.prompt_ids),
            "tandem.max_tokens": r.params.max_tokens, "tandem.temperature": r.params.temperature})
        self.in_flight += 1
        self.m.queue_depth.set(self.in_flight)
        self._admit(r)

    def cancel(self, r: GatewayRequest) -> None:
        """The client went away (cancelled, deadline): its request ends and its KV is freed."""
        if r.finished:
            return
        r.finish_reason = FinishReason.ABORT
        link = self._link_of(r)
        if link is not None:
            del link.slots[r.slot]  # a round already on its way for it is dropped (slots are never reused)
            link.out.put_nowait(r.slot)
        self._end(r)

    # ---------------------------------------------------------------- the streams
    def start(self) -> None:
        pass  # a stream opens with its verifier's first request

    async def stop(self) -> None:
        await cancel_and_wait(self._unpark)
        for link in list(self.links.values()):
            link.out.put_nowait(_CLOSE)
            await cancel_and_wait(link.task)

    def _link_of(self, r: GatewayRequest) -> Link | None:
        rep = self.pool.pinned(r.key)
        link = self.links.get(rep) if rep is not None else None
        return link if link is not None and link.slots.get(r.slot) is r else None

    def _admit(self, r: GatewayRequest) -> None:
        rep = self.pool.pin(r.key)
        if rep is None:  # none up: it waits, its output so far kept, until one is (or its deadline)
            self.parked.append(r)
            if self._unpark is None or self._unpark.done():
                self._unpark = asyncio.create_task(self._retry_parked(), name="unpark", context=contextvars.Context())
            return
        link = self.links.get(rep)
        if link is None:
            link = self.links[rep] = Link(rep)
            # a context of its own: the stream serves every client, not the one whose request opened it (its spans
            # and the Serve call's would otherwise all land in that client's trace)
            link.task = asyncio.create_task(self._run(link), name=f"serve-{rep.address}", context=contextvars.Context())
        link.out.put_nowait(verifier_pb2.ServeAdmit(
            slot=link.slot_for(r), prompt=tensors.encode(r.prompt_ids, "int32"),
            output=tensors.encode(r.output_ids, "int32"), sampling=convert.sampling_to_pb(r.params)))

    async def _retry_parked(self) -> None:
        """Until no request is parked: each probe period, admit the parked requests if a verifier is up, and fail
        those past their deadline."""
        while self.parked:
            await asyncio.sleep(self.pool.probe_s)
            now = self.m.now()
            parked, self.parked = self.parked, []
            for r in parked:
                if r.finished:
                    continue
                if r.expired(now):
                    self._fail(r, grpc.StatusCode.DEADLINE_EXCEEDED, "no verifier came up before its deadline")
                elif self.pool.any_up:
                    self._admit(r)
                else:
                    self.parked.append(r)

    async def _run(self, link: Link) -> None:
        """Read one verifier's stream until it ends; then its requests move."""
        reason = "stream closed"
        try:
            call = link.rep.client.stub.Serve(link.controls(), timeout=None)
            gone = asyncio.ensure_future(link.rep.gone.wait())
            try:
                while True:
                    read = asyncio.ensure_future(call.read())
                    await asyncio.wait({read, gone}, return_when=asyncio.FIRST_COMPLETED)
                    if not read.done():
                        read.cancel()
                        call.cancel()
                        reason = "its health checks failed"
                        break
                    update = read.result()
                    if update is grpc.aio.EOF:
                        break
                    self._apply(link, update)
            finally:
                gone.cancel()
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self.pool.mark_down(link.rep, reason)
        except Exception:
            log.exception("serve stream to %s failed", link.rep.address)
            reason = "internal error"
        finally:
            if self.links.get(link.rep) is link:
                del self.links[link.rep]
        moving = [r for r in link.slots.values() if not r.finished]
        if moving:
            log.warning("verifier %s: stream ended (%s): %d requests move", link.rep.address, reason, len(moving))
            for r in moving:
                self._admit(r)  # the output so far goes with it

    # ---------------------------------------------------------------- outcomes
    def _apply(self, link: Link, update: verifier_pb2.ServeUpdate) -> None:
        for e in update.errors:
            r = link.slots.pop(e.slot, None)
            if r is not None and not r.finished:
                self._fail(r, _CODES.get(e.code, grpc.StatusCode.INTERNAL), e.message)
        for report in update.rounds:
            self._round(link, report)

    def _round(self, link: Link, rr: verifier_pb2.RoundReport) -> None:
        now = self.m.now()
        slots = tensors.to_numpy(rr.slots, "slots").tolist()
        counts = tensors.to_numpy(rr.counts, "counts").tolist()
        tokens = tensors.to_numpy(rr.tokens, "tokens").tolist()
        accepted = tensors.to_numpy(rr.accepted, "accepted").tolist()
        drafted = tensors.to_numpy(rr.drafted, "drafted").tolist()
        finish = tensors.to_numpy(rr.finish, "finish").tolist()
        offsets = tensors.to_numpy(rr.text_offsets, "text_offsets").tolist()
        # rounds each row took: one replay may run several (--spec-rounds); a verifier that does not say: one each
        rounds = tensors.to_numpy(rr.rounds, "rounds").tolist() if rr.HasField("rounds") else [1] * len(slots)
        text = rr.text
        reqs, rows, done, at = [], [], [], 0
        for i, slot in enumerate(slots):
            n = counts[i]
            committed, at = tokens[at: at + n], at + n
            r = link.slots.get(slot)
            if r is None or r.finished:  # cancelled while the round ran: its output is dropped
                continue
            reqs.append(r)
            rows.append(i)
            reason = convert.finish_from_pb(finish[i])
            self.delivery.commit(r, committed, text[offsets[i]: offsets[i + 1]].decode(), reason, accepted[i],
                                 drafted[i], now)
            if reason is not None:
                del link.slots[slot]
                done.append(r)
        self._observe(rr, reqs, rows, counts, accepted, drafted, rounds)
        for r in done:  # after the round's span: a request's last round is linked from its span too
            self._end(r)

    def _observe(self, rr: verifier_pb2.RoundReport, reqs: list[GatewayRequest], rows: list[int], counts: list[int],
                 accepted: list[int], drafted: list[int], rounds: list[int]) -> None:
        """The round's metrics (every row it ran) and its span (the rows still wanted: ``reqs``, at ``rows`` of the
        report), from the verifier's timings: no round waits on the gateway. A report of one replay of several
        rounds (``rounds``, --spec-rounds) counts them all, its acceptance lengths per round; its one span, timed
        by the replay (the rounds of one graph have no timings of their own), says how many it holds."""
        seconds = rr.duration_ns / 1e9
        held = max(rounds, default=1)
        self.m.rounds.inc(held)
        self.m.draft_tokens.inc(sum(drafted))
        self.m.accepted_tokens.inc(sum(accepted))
        for _ in range(held):  # (a replay's rounds share its time)
            self.m.round_seconds.observe(seconds / held)
            self.m.round_phase.labels("verify").observe(seconds / held)
        self.m.batch_size.set(len(counts))
        for n, m in zip(counts, rounds):
            if n:
                self.m.acceptance_length.observe(n / max(m, 1))
        # a root: each round is a trace of its own (sampled alone), linked from its requests' spans
        span = tracer.start_span("spec.round", context=otel_context.Context(), start_time=rr.start_unix_nano)
        if span.is_recording():
            committed = [counts[i] / max(rounds[i], 1) for i in rows if counts[i]]
            ks = tensors.to_numpy(rr.k, "k").tolist()
            span.set_attributes({
                "spec.mode": self.mode, "spec.batch_size": len(rows), "spec.rounds": held,
                "spec.request_ids": [r.request_id for r in reqs], "spec.k": [ks[i] for i in rows],
                "spec.drafted": [drafted[i] for i in rows], "spec.accepted": [accepted[i] for i in rows],
                "spec.acceptance_length": sum(committed) / len(committed) if committed else 0.0,
                "spec.draft_ms": 0.0, "spec.verify_ms": seconds * 1e3, "spec.wait_ms": 0.0})
            link = span.get_span_context()
            for r in reqs:
                if r.span is not None:
                    r.span.add_link(link)
        span.end(end_time=rr.start_unix_nano + rr.duration_ns)

    def _fail(self, r: GatewayRequest, code: grpc.StatusCode, message: str) -> None:
        self.delivery.fail(r, code, message)
        self._end(r)

    def _end(self, r: GatewayRequest) -> None:
        self.pool.unpin(r.key)
        self.in_flight -= 1
        self.m.queue_depth.set(self.in_flight)
        self.delivery.end(r)
