"""grpc.aio interceptors: W3C trace propagation with OpenTelemetry spans, and a default deadline.

Server side, `TracingServerInterceptor` opens a SERVER span per unary-unary and unary-stream RPC whose
parent comes from the caller's `traceparent`/`tracestate` metadata, and keeps it current while the
servicer runs, so the servicer's own spans become its children. Client side,
`TracingClientInterceptor` opens a CLIENT span per call and sends its context along; the span ends
when the call completes (a stream: when its status arrives). `DeadlineClientInterceptor` gives every
call without a timeout a default one.

grpc.aio registers an interceptor object for the FIRST call kind it implements only (an if/elif chain
in grpc.aio.Channel, grpc/grpc#31442, still so in grpcio 1.84): passed as is, the two client
interceptors here would see unary-unary calls but never a stream. Hand them to the channel through
`channel_interceptors(...)`, which gives grpc one single-kind adapter per kind:

    grpc.aio.insecure_channel(target, interceptors=channel_interceptors(
        DeadlineClientInterceptor(30.0), TracingClientInterceptor()))

Span names are the full gRPC method without the leading slash ("tandem.v1.Verifier/Verify"), with the
rpc.system / rpc.service / rpc.method / rpc.grpc.status_code attributes of the OpenTelemetry RPC
conventions. Any status other than OK marks the span ERROR.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import aclosing, contextmanager
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

_TRACER_NAME = "tandem.rpc"


def _method_parts(full_method: str | bytes) -> tuple[str, str, str]:
    """"/pkg.Service/Method" -> ("pkg.Service/Method", "pkg.Service", "Method")."""
    if isinstance(full_method, bytes):
        full_method = full_method.decode()
    name = full_method.lstrip("/")
    service, _, method = name.rpartition("/")
    return name, service, method


def _span_attributes(full_method: str | bytes) -> tuple[str, dict[str, str]]:
    name, service, method = _method_parts(full_method)
    return name, {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}


def _finish_span(span: Span, code: grpc.StatusCode, details: str | None = None,
                 end_time: int | None = None) -> None:
    """Record the gRPC status on `span` and end it."""
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code is not grpc.StatusCode.OK:
        span.set_status(Status(StatusCode.ERROR, f"{code.name}: {details}" if details else code.name))
    span.end(end_time=end_time)


def _finished_status(call: grpc.aio.Call) -> tuple[grpc.StatusCode, str | None]:
    """The status of a call that is done, read without awaiting.

    grpc.aio exposes the status only through coroutines (code(), details()); once the call is done
    they return without suspending, so one step runs them to the end. Reading it here, in the done
    callback, rather than in a task, means the span still ends with its status when the event loop
    stops right after the call.
    """
    def ready(coro: Any) -> Any:
        try:
            coro.send(None)
        except StopIteration as stop:
            return stop.value
        coro.close()
        raise RuntimeError("the call is not finished")

    try:
        return ready(call.code()), ready(call.details())
    except Exception as exc:
        return grpc.StatusCode.UNKNOWN, f"status unavailable ({type(exc).__name__}: {exc})"


def _metadata_carrier(metadata: Iterable[tuple[str, Any]] | None) -> dict[str, str]:
    """Text metadata as a dict for the propagators (binary "-bin" entries skipped)."""
    return {key.lower(): value for key, value in (metadata or ()) if isinstance(value, str)}


# ---------------------------------------------------------------------------------------------- server


class TracingServerInterceptor(grpc.aio.ServerInterceptor):
    """A SERVER span around every unary-unary and unary-stream handler, parented by the caller's context.

    Only async handlers (coroutines, async generators) are traced; the others pass through unchanged,
    as do client-streaming methods.
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer(_TRACER_NAME, tracer_provider=tracer_provider)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        parent = propagate.extract(_metadata_carrier(handler_call_details.invocation_metadata))
        if handler.unary_unary is not None and inspect.iscoroutinefunction(handler.unary_unary):
            return grpc.unary_unary_rpc_method_handler(
                self._traced_unary(handler.unary_unary, method, parent),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            behavior = handler.unary_stream
            if inspect.isasyncgenfunction(behavior):
                traced = self._traced_stream(behavior, method, parent)
            elif inspect.iscoroutinefunction(behavior):       # writes with context.write()
                traced = self._traced_unary(behavior, method, parent)
            else:
                return handler
            return grpc.unary_stream_rpc_method_handler(
                traced, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        return handler

    @contextmanager
    def _server_span(self, method: str, parent: otel_context.Context,
                     context: grpc.aio.ServicerContext, current: bool = True) -> Iterator[Span]:
        """The handler's SERVER span, current inside the block (``current``); its status comes from how the block
        ends."""
        name, attributes = _span_attributes(method)
        span = self._tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        code, details = grpc.StatusCode.OK, None
        try:
            if current:
                with trace.use_span(span, record_exception=False, set_status_on_exception=False):
                    yield span
            else:
                yield span
            code = context.code() or grpc.StatusCode.OK
            details = context.details()
        except grpc.aio.AbortError:
            code = context.code() or grpc.StatusCode.UNKNOWN
            details = context.details()
            raise
        except (asyncio.CancelledError, GeneratorExit):
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:        # the servicer failed: the client sees UNKNOWN
            code, details = grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}"
            span.record_exception(exc)
            raise
        finally:
            _finish_span(span, code, details)

    def _traced_unary(self, behavior: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
                      method: str, parent: otel_context.Context
                      ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
        async def traced(request: Any, context: grpc.aio.ServicerContext) -> Any:
            with self._server_span(method, parent, context):
                return await behavior(request, context)
        return traced

    def _traced_stream(self, behavior: Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]],
                       method: str, parent: otel_context.Context
                       ) -> Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]:
        async def traced(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            # the span is current only while the handler computes its next response, never across a yield: a
            # stream the client cancels is closed from another context, where a context attached before the
            # yield could not be detached ("Failed to detach context")
            with self._server_span(method, parent, context, current=False) as span:
                async with aclosing(behavior(request, context)) as responses:
                    while True:
                        token = otel_context.attach(trace.set_span_in_context(span))
                        try:
                            response = await anext(responses)
                        except StopAsyncIteration:
                            break
                        finally:
                            otel_context.detach(token)
                        yield response
        return traced


# ---------------------------------------------------------------------------------------------- client


class TracingClientInterceptor(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    """A CLIENT span per call, child of the current span, its context sent in the call's metadata."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer(_TRACER_NAME, tracer_provider=tracer_provider)

    def _start(self, details: grpc.aio.ClientCallDetails) -> tuple[Span, grpc.aio.ClientCallDetails]:
        name, attributes = _span_attributes(details.method)
        span = self._tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        if not carrier:
            return span, details
        carrier = {key.lower(): value for key, value in carrier.items()}
        kept = [(key, value) for key, value in (details.metadata or ()) if key not in carrier]
        metadata = grpc.aio.Metadata(*kept, *carrier.items())
        return span, grpc.aio.ClientCallDetails(details.method, details.timeout, metadata,
                                                details.credentials, details.wait_for_ready)

    def _end_when_done(self, span: Span, call: grpc.aio.Call) -> None:
        def on_done(done_call: grpc.aio.Call) -> None:
            end_time = time.time_ns()
            code, details = _finished_status(done_call)
            _finish_span(span, code, details, end_time)

        if call.done():
            on_done(call)
        else:
            call.add_done_callback(on_done)

    async def _intercept(self, continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
                         details: grpc.aio.ClientCallDetails, request: Any) -> Any:
        span, details = self._start(details)
        try:
            call = await continuation(details, request)
        except grpc.aio.AioRpcError as err:
            _finish_span(span, err.code(), err.details())
            raise
        except BaseException as exc:
            span.record_exception(exc)
            _finish_span(span, grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")
            raise
        self._end_when_done(span, call)
        return call

    async def intercept_unary_unary(
        self, continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[grpc.aio.UnaryUnaryCall]],
        client_call_details: grpc.aio.ClientCallDetails, request: Any,
    ) -> grpc.aio.UnaryUnaryCall:
        return await self._intercept(continuation, client_call_details, request)

    async def intercept_unary_stream(
        self, continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[grpc.aio.UnaryStreamCall]],
        client_call_details: grpc.aio.ClientCallDetails, request: Any,
    ) -> grpc.aio.UnaryStreamCall:
        return await self._intercept(continuation, client_call_details, request)


class DeadlineClientInterceptor(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    """Give every call that has no timeout `default_timeout_s`, so no RPC can wait forever."""

    def __init__(self, default_timeout_s: float) -> None:
        if not default_timeout_s > 0:
            raise ValueError(f"default_timeout_s must be positive, got {default_timeout_s}")
        self.default_timeout_s = default_timeout_s

    def _with_deadline(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        if details.timeout is not None:
            return details
        return grpc.aio.ClientCallDetails(details.method, self.default_timeout_s, details.metadata,
                                          details.credentials, details.wait_for_ready)

    async def intercept_unary_unary(
        self, continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[grpc.aio.UnaryUnaryCall]],
        client_call_details: grpc.aio.ClientCallDetails, request: Any,
    ) -> grpc.aio.UnaryUnaryCall:
        return await continuation(self._with_deadline(client_call_details), request)

    async def intercept_unary_stream(
        self, continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[grpc.aio.UnaryStreamCall]],
        client_call_details: grpc.aio.ClientCallDetails, request: Any,
    ) -> grpc.aio.UnaryStreamCall:
        return await continuation(self._with_deadline(client_call_details), request)


class _UnaryUnaryOnly(grpc.aio.UnaryUnaryClientInterceptor):
    """Shows grpc.aio only the unary-unary side of a multi-kind interceptor."""

    def __init__(self, inner: grpc.aio.UnaryUnaryClientInterceptor) -> None:
        self.inner = inner

    async def intercept_unary_unary(self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails,
                                    request: Any) -> Any:
        return await self.inner.intercept_unary_unary(continuation, client_call_details, request)


class _UnaryStreamOnly(grpc.aio.UnaryStreamClientInterceptor):
    """Shows grpc.aio only the unary-stream side of a multi-kind interceptor."""

    def __init__(self, inner: grpc.aio.UnaryStreamClientInterceptor) -> None:
        self.inner = inner

    async def intercept_unary_stream(self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails,
                                     request: Any) -> Any:
        return await self.inner.intercept_unary_stream(continuation, client_call_details, request)


def channel_interceptors(*interceptors: grpc.aio.ClientInterceptor) -> list[grpc.aio.ClientInterceptor]:
    """The `interceptors=` list for a grpc.aio channel, each interceptor registered for every kind it handles.

    Interceptors implementing one of unary-unary / unary-stream and nothing else pass through as they
    are; one implementing both is split into two adapters. Within each kind the order is kept (the
    first runs outermost). Client-streaming interceptors are refused: none is needed yet.
    """
    kinds = (grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor,
             grpc.aio.StreamUnaryClientInterceptor, grpc.aio.StreamStreamClientInterceptor)
    out: list[grpc.aio.ClientInterceptor] = []
    for interceptor in interceptors:
        implemented = [kind for kind in kinds if isinstance(interceptor, kind)]
        if len(implemented) <= 1:
            out.append(interceptor)     # grpc.aio handles a single-kind one (and rejects a no-kind one)
            continue
        if any(kind in implemented for kind in kinds[2:]):
            raise ValueError(f"{type(interceptor).__name__}: multi-kind client-streaming interceptors "
                             "are not supported by channel_interceptors")
        out += [_UnaryUnaryOnly(interceptor), _UnaryStreamOnly(interceptor)]
    return out
