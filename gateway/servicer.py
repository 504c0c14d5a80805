"""tandem.v1.Gateway: validate, queue, stream. Everything else happens in the scheduler."""

from __future__ import annotations

import asyncio
import time

import grpc

from gateway.requests import Event, GatewayRequest, RequestBuilder
from gateway.scheduler import Overloaded, Scheduler
from protos.tandem.v1 import gateway_pb2, gateway_pb2_grpc
from rpc import convert, tensors


def _response(r: GatewayRequest, e: Event) -> gateway_pb2.GenerateResponse:
    resp = gateway_pb2.GenerateResponse(request_id=r.request_id, text=e.text,
                                        token_ids=tensors.encode(e.token_ids, "int32"),
                                        finish_reason=convert.finish_to_pb(e.finish_reason))
    if e.finish_reason is not None:
        resp.usage.CopyFrom(r.usage())
    return resp


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, builder: RequestBuilder, scheduler: Scheduler) -> None:
        self.builder = builder
        self.scheduler = scheduler

    async def _start(self, request, context) -> GatewayRequest:
        try:
            # off the event loop: tokenizing a long prompt (a chat template, a MiB of text) takes seconds that
            # every other stream would otherwise wait through
            r = await asyncio.to_thread(self.builder.build, request)
            left = context.time_remaining()
            r.deadline = time.perf_counter() + (left if left is not None else self.scheduler.s.wait_s)
            self.scheduler.submit(r)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Overloaded as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        return r

    async def _events(self, r: GatewayRequest, context):
        """The request's events; those that queued while the client's last message was sent go out as one (a
        busy gateway sends fewer, larger messages instead of falling behind)."""
        held: Event | None = None  # an error that came behind tokens: they go out first
        try:
            while True:
                e: Event = held or await r.events.get()
                held = None
                while e.error is None and e.finish_reason is None and not r.events.empty():
                    nxt = r.events.get_nowait()
                    if nxt.error is not None:
                        held = nxt
                        break
                    e = Event(e.token_ids + nxt.token_ids, e.text + nxt.text, nxt.finish_reason)
                if e.error is not None:
                    await context.abort(*e.error)
                yield e
                if e.finish_reason is not None:
                    return
        finally:
            self.scheduler.cancel(r)  # no-op once finished; frees KV when the client went away

    async def Generate(self, request, context):
        r = await self._start(request, context)
        async for e in self._events(r, context):
            yield _response(r, e)

    async def GenerateUnary(self, request, context):
        r = await self._start(request, context)
        ids, text, last = [], [], None
        async for e in self._events(r, context):
            ids += e.token_ids
            text.append(e.text)
            last = e
        return _response(r, Event(ids, "".join(text), last.finish_reason))
