"""Run a grpc.aio server the same way for every service: health, reflection, tracing, limits, shutdown.

grpc.health.v1 reports NOT_SERVING until the caller marks the service ready (after the model
is loaded and warmed up), and NOT_SERVING again while shutting down. A port another process
already listens on is an error (``PortInUse``), not a port shared with it: gRPC would otherwise
set SO_REUSEPORT and the kernel would split the connections between the two (``reuse_port``
asks for that on purpose). How the process stops is ``rpc.lifetime``'s; the port's TLS is
``rpc.tls``'s, who may call the gateway ``rpc.auth``'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from dataclasses import dataclass
from typing import Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from engine.heap import freeze_heap
from rpc.decoding import DecodeErrorInterceptor
from rpc.interceptors import TracingServerInterceptor
from rpc.lifetime import Shutdown, watch_parent
from rpc.metrics import engine_gauges, serve_metrics
from rpc.telemetry import shutdown_tracing, tracing_on
from rpc.tls import Identity, describe, is_loopback

log = logging.getLogger("tandem.rpc")

# after the stop signal and the grace for calls in flight, this long for the rest of the stop (the gateway's
# round loop, closing channels, flushing traces) before the process exits regardless
STOP_MARGIN_S = 5.0


class PortInUse(ValueError):
    """The port is bound by another process (a ValueError: the CLI reports it as a bad setting, exit code 2)."""


@dataclass(frozen=True)
class Service:
    name: str                                  # full name, e.g. "tandem.v1.Verifier"
    add: Callable[[object, grpc.aio.Server], None]
    servicer: object


def client_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Message limits, plus a short reconnect backoff so a restarted peer is found again quickly."""
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2000)]


def _bind(server: grpc.aio.Server, host: str, port: int, credentials: grpc.ServerCredentials | None) -> int:
    """Listen on host:port (TLS with ``credentials``, else plaintext); PortInUse where another process listens."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = (server.add_secure_port(address, credentials) if credentials is not None
                 else server.add_insecure_port(address))
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise PortInUse(f"port {port} is already in use ({address}): another process listens there (another "
                        f"tandem serve or service?); stop it or choose another port")
    return bound


class Server:
    """One service's gRPC server: its services, health and reflection on one port, TLS where ``credentials`` are
    given (``rpc.tls``), behind ``interceptors`` (e.g. the gateway's API keys, ``rpc.auth``) after tracing (where
    ``setup_tracing`` turned it on before); and,
    with ``health_port``, a second, plaintext server answering grpc.health.v1 alone (for probes without TLS)."""

    def __init__(self, services: list[Service], host: str, port: int, max_message_bytes: int,
                 reuse_port: bool = False, credentials: grpc.ServerCredentials | None = None,
                 interceptors: tuple[grpc.aio.ServerInterceptor, ...] = (), health_port: int | None = None) -> None:
        options = [*client_options(max_message_bytes), ("grpc.so_reuseport", 1 if reuse_port else 0)]
        # a SERVER span per call where tracing is on (``setup_tracing`` runs first); off, no wrapper around every
        # streamed message
        traced = [TracingServerInterceptor()] if tracing_on() else []
        self.server = grpc.aio.server(interceptors=[*traced, *interceptors, DecodeErrorInterceptor()], options=options)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        for s in services:
            s.add(s.servicer, self.server)
        self.names = [s.name for s in services]
        reflection.enable_server_reflection(
            [*self.names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
            self.server)
        self.tls = credentials is not None
        self.port = _bind(self.server, host, port, credentials)
        self.health_server = self.health_port = None
        if health_port is not None:
            self.health_server = grpc.aio.server(options=[("grpc.so_reuseport", 1 if reuse_port else 0)])
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.health_server)
            self.health_port = _bind(self.health_server, host, health_port, None)

    async def start(self) -> None:
        for name in ["", *self.names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        if self.health_server is not None:
            await self.health_server.start()

    async def ready(self) -> None:
        await self.set_serving(True)

    async def set_serving(self, serving: bool) -> None:
        """grpc.health.v1's answer for every service here (a gateway with no verifier up is NOT_SERVING)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self.names]:
            await self.health.set(name, status)

    async def stop(self, grace_s: float) -> None:
        await self.health.enter_graceful_shutdown()
        if self.health_server is not None:
            await self.health_server.stop(0)
        await self.server.stop(grace_s)


async def run_until_signal(server: Server, grace_s: float, warm_up: Callable[[], Awaitable[None]] | None = None,
                           on_stop: Callable[[], Awaitable[None]] | None = None) -> None:
    """Start, warm up, report SERVING, then serve until SIGINT/SIGTERM; a signal ends every state promptly:

    - starting (``warm_up``: a model's first calls, the gateway waiting for a verifier): the warm-up is given up
      and the process stops;
    - serving: new calls are refused (health NOT_SERVING), calls in flight get ``grace_s`` to finish (the
      gateway's rounds go on meanwhile, so its streams can end normally), the rest are cancelled, then
      ``on_stop``.

    Whatever hangs, the process exits ``grace_s`` + ``STOP_MARGIN_S`` after the signal (``rpc.lifetime``).
    (Before this is called, while a model loads, SIGTERM has its default effect: the process ends at once.)
    """
    shutdown = Shutdown(grace_s + STOP_MARGIN_S)
    shutdown.install()
    await server.start()
    if warm_up is not None and not await shutdown.unless_stopped(warm_up()):
        log.info("stopped while starting")
        await server.stop(0)
        return
    # what lives as long as the process (a model, its tokenizer, graphs) kept out of Python's collections: a full
    # one would otherwise walk it all, stalling a round for 100+ ms (engine/heap.py)
    log.info("%d objects alive after starting left out of garbage collection", freeze_heap())
    await server.ready()
    log.info("serving %s on port %d (%s)%s", ", ".join(server.names), server.port, "TLS" if server.tls else "plaintext",
             f"; health alone on plaintext port {server.health_port}" if server.health_port is not None else "")
    await shutdown.wait()
    log.info("shutting down: calls in flight have %.1f s to finish", grace_s)
    await server.stop(grace_s)
    if on_stop is not None:
        await on_stop()


async def reap_forever(name: str, reap: Callable[[], Awaitable[int]], lease_s: float) -> None:
    """Every quarter lease, free what no caller renewed (``reap``: on the engine's thread, returns how many)."""
    while True:
        await asyncio.sleep(lease_s / 4)
        n = await reap()
        if n:
            log.warning("%s: %d requests freed: no call named them for %.0f s (their gateway is gone?)", name, n,
                        lease_s)


async def serve_engine_service(name: str, service: Service, port: int, settings, warm_up: Callable[[], Awaitable[None]],
                               stats: Callable[[], dict[str, int]], identity: Identity | None) -> None:
    """The verifier's and drafter's life: serve ``service`` with engine gauges until a signal, then flush traces.

    ``settings`` is a ServerSettings (host, metrics_port, max_message_bytes, grace_s, health_port); ``identity``
    its mutual-TLS identity (``rpc.tls.internal_identity``, read before the model loads; None: plaintext). Call
    ``setup_tracing`` before building the servicer.
    """
    server = Server([service], settings.host, port, settings.max_message_bytes, settings.reuse_port,
                    credentials=identity.server_credentials() if identity is not None else None,
                    health_port=settings.health_port)
    engine_gauges(name, stats)
    metrics_port = serve_metrics(settings.metrics_port, settings.host)
    log.info("%s: gRPC port %d, %s; metrics port %s", name, server.port, describe(identity), metrics_port)
    if identity is None and not is_loopback(settings.host):
        log.warning("%s: plaintext with no authentication on %s: anyone who reaches port %d can call it", name,
                    settings.host, server.port)
    try:
        await run_until_signal(server, settings.grace_s, warm_up)
    finally:
        shutdown_tracing()


def run(serve: Callable[[object], Awaitable[None]], settings) -> None:
    """Entry point of a service process: its lifeline to the process that started it (if any), logging, then the
    asyncio loop. Once ``serve`` returns the process is done: it exits without waiting for an engine thread that
    may still be busy with a warm-up or a round nobody will read."""
    watch_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(settings))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
