"""A real OTLP/gRPC trace receiver (tests, and ``tandem bench-serve --tracing on``): processes export to it as they
would to a collector.

    with OtlpReceiver() as rx:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint, ...}
        ...
        spans = rx.wait_for(lambda spans: any(s.name == "x" for s in spans))
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span, decoded to plain Python values."""

    name: str
    trace_id: str                   # 32 hex digits
    span_id: str                    # 16 hex digits
    parent_span_id: str             # "" for a root span
    kind: str                       # "SERVER", "CLIENT", "INTERNAL", "PRODUCER", "CONSUMER", "UNSPECIFIED"
    service_name: str               # the exporting process's resource service.name
    attributes: dict[str, Any] = field(default_factory=dict)
    links: list[tuple[str, str]] = field(default_factory=list)     # (trace_id, span_id)
    status_code: str = "UNSET"      # "UNSET", "OK", "ERROR"
    status_message: str = ""
    start_ns: int = 0               # unix epoch nanoseconds
    end_ns: int = 0


def decode_any_value(value: common_pb2.AnyValue) -> Any:
    """An OTLP AnyValue as str / bool / int / float / bytes / list / dict (None when empty)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [decode_any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return decode_attributes(value.kvlist_value.values)
    return getattr(value, which)


def decode_attributes(pairs: Any) -> dict[str, Any]:
    """Repeated KeyValue -> dict."""
    return {kv.key: decode_any_value(kv.value) for kv in pairs}


def _enum_suffix(enum: Any, number: int, prefix: str) -> str:
    return enum.Name(number).removeprefix(prefix)


def decode_request(request: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    """Every span of one Export request."""
    out: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        service = str(decode_attributes(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(ReceivedSpan(
                    name=span.name,
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex(),
                    kind=_enum_suffix(trace_pb2.Span.SpanKind, span.kind, "SPAN_KIND_"),
                    service_name=service,
                    attributes=decode_attributes(span.attributes),
                    links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                    status_code=_enum_suffix(trace_pb2.Status.StatusCode, span.status.code, "STATUS_CODE_"),
                    status_message=span.status.message,
                    start_ns=span.start_time_unix_nano,
                    end_ns=span.end_time_unix_nano,
                ))
    return out


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: Callable[[list[ReceivedSpan]], None]) -> None:
        self._sink = sink

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest,
               context: grpc.ServicerContext) -> trace_service_pb2.ExportTraceServiceResponse:
        self._sink(decode_request(request))
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """An OTLP/gRPC TraceService on 127.0.0.1 (a free port) keeping every span it is sent."""

    def __init__(self) -> None:
        self._lock = threading.RLock()         # re-entrant: a wait_for predicate may read rx.spans
        self._changed = threading.Condition(self._lock)
        self._spans: list[ReceivedSpan] = []
        self._server: grpc.Server | None = None
        self.port = 0

    def start(self) -> "OtlpReceiver":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self._add), server)
        self.port = server.add_insecure_port("127.0.0.1:0")
        if self.port == 0:
            raise RuntimeError("OtlpReceiver: could not bind a port on 127.0.0.1")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def __enter__(self) -> "OtlpReceiver":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """For OTEL_EXPORTER_OTLP_ENDPOINT (the http scheme makes the exporter connect insecurely)."""
        return f"http://127.0.0.1:{self.port}"

    def _add(self, spans: list[ReceivedSpan]) -> None:
        with self._changed:
            self._spans.extend(spans)
            self._changed.notify_all()

    @property
    def spans(self) -> list[ReceivedSpan]:
        """A copy of everything received so far, in arrival order."""
        with self._lock:
            return list(self._spans)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def wait_for(self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 10.0) -> list[ReceivedSpan]:
        """Block until predicate(spans) holds and return the spans; AssertionError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                spans = list(self._spans)
                if predicate(spans):
                    return spans
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(min(left, 0.1))
        summary = "\n".join(f"  {s.service_name}: {s.kind} {s.name!r} trace={s.trace_id} span={s.span_id} "
                            f"parent={s.parent_span_id or '-'} status={s.status_code}" for s in spans)
        raise AssertionError(f"OtlpReceiver: condition not met within {timeout:g}s; "
                             f"{len(spans)} span(s) received:\n{summary or '  (none)'}")
