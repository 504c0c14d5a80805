"""OpenTelemetry tracing set up from the standard OTEL_* environment variables.

Every Tandem process calls `setup_tracing(<its name>)` once at start and `shutdown_tracing()` at exit.
With no exporter configured (no OTLP endpoint, no OTEL_TRACES_EXPORTER) tracing stays on the no-op
provider: spans cost next to nothing and nothing tries to reach a collector.

Variables read here (the OTLP exporter reads its own: OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, _INSECURE,
_HEADERS, _TIMEOUT, ...; the SDK reads OTEL_TRACES_SAMPLER[_ARG] and OTEL_BSP_*):

- OTEL_SDK_DISABLED=true: tracing off whatever else is set.
- OTEL_TRACES_EXPORTER: comma-separated `otlp` (OTLP over gRPC), `console` or `none`. Unset: `otlp`
  when an OTLP endpoint variable is set, else `none`.
- OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL: only `grpc` is installed; anything else is refused.
- OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES: the resource; OTEL_SERVICE_NAME wins over the
  `service_name` argument, which wins over a service.name given in OTEL_RESOURCE_ATTRIBUTES.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

log = logging.getLogger("tandem.telemetry")

EXPORTERS = ("otlp", "console", "none")
_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROTOCOL_VARS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")

_lock = threading.Lock()
_provider: TracerProvider | None = None


def exporters_from_env(env: Mapping[str, str]) -> list[str]:
    """The span exporters `env` asks for, without duplicates or "none"; [] means tracing off.

    Raises ValueError for a name other than otlp/console/none, or an OTLP protocol other than grpc.
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not raw:
        raw = "otlp" if any(env.get(v, "").strip() for v in _ENDPOINT_VARS) else "none"
    names: list[str] = []
    for name in (n.strip() for n in raw.split(",")):
        if name not in EXPORTERS:
            raise ValueError(f"OTEL_TRACES_EXPORTER={raw!r}: unknown exporter {name!r} "
                             f"(expected a comma-separated list of {', '.join(EXPORTERS)})")
        if name != "none" and name not in names:
            names.append(name)
    if "otlp" in names:
        for var in _PROTOCOL_VARS:
            protocol = env.get(var, "").strip().lower()
            if protocol:
                if protocol != "grpc":
                    raise ValueError(f"{var}={protocol!r}: only the OTLP/gRPC exporter is installed "
                                     "(use grpc, usually port 4317)")
                break
    return names


def resource_from_env(service_name: str) -> Resource:
    """The process's resource: OTEL_RESOURCE_ATTRIBUTES plus service.name (see the module docstring)."""
    resource = Resource.create()    # default SDK attributes + OTEL_RESOURCE_ATTRIBUTES + OTEL_SERVICE_NAME
    if not os.environ.get("OTEL_SERVICE_NAME", "").strip():
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    return resource


def _make_exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    # Imported here: grpc-based, and not needed by processes that never export.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def setup_tracing(service_name: str) -> TracerProvider | None:
    """Install the global TracerProvider described by the environment; None when tracing is off.

    A second call in the same process returns the provider installed by the first.
    """
    global _provider
    with _lock:
        if _provider is not None:
            return _provider
        names = exporters_from_env(os.environ)
        if not names:
            return None
        provider = TracerProvider(resource=resource_from_env(service_name))
        for name in names:
            provider.add_span_processor(BatchSpanProcessor(_make_exporter(name)))
        trace.set_tracer_provider(provider)
        _provider = provider
        log.info("tracing %s with %s", provider.resource.attributes.get(SERVICE_NAME), ", ".join(names))
        return provider


def tracing_on() -> bool:
    """Whether ``setup_tracing`` installed a provider in this process (else every span is a no-op)."""
    with _lock:
        return _provider is not None


def shutdown_tracing() -> None:
    """Export the spans still queued and stop the exporters; safe to call when tracing is off, or twice."""
    with _lock:
        provider = _provider
    if provider is not None:
        provider.shutdown()     # idempotent; the batch processors export what is queued before stopping


def tracer(name: str) -> trace.Tracer:
    """A tracer from the global provider (a no-op one until, or unless, setup_tracing installs one)."""
    return trace.get_tracer(name)
