"""Run a grpc.aio server the same way for every service: health, reflection, tracing, limits, shutdown.

grpc.health.v1 reports NOT_SERVING until the caller marks the service ready (after the model
is loaded and warmed up), and NOT_SERVING again while shutting down.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from typing import Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rpc.interceptors import TracingServerInterceptor
from rpc.metrics import engine_gauges, serve_metrics
from rpc.telemetry import shutdown_tracing

log = logging.getLogger("tandem.rpc")


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


class Server:
    def __init__(self, services: list[Service], host: str, port: int, max_message_bytes: int) -> None:
        self.server = grpc.aio.server(interceptors=[TracingServerInterceptor()],
                                      options=client_options(max_message_bytes))
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        for s in services:
            s.add(s.servicer, self.server)
        self.names = [s.name for s in services]
        reflection.enable_server_reflection(
            [*self.names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
            self.server)
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise RuntimeError(f"could not bind {host}:{port}")

    async def start(self) -> None:
        for name in ["", *self.names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()

    async def ready(self) -> None:
        for name in ["", *self.names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)


async def run_until_signal(server: Server, grace_s: float, warm_up: Callable[[], Awaitable[None]] | None = None,
                           on_stop: Callable[[], Awaitable[None]] | None = None) -> None:
    """Start, warm up, report SERVING, then serve until SIGINT/SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    if warm_up is not None:
        await warm_up()
    await server.ready()
    log.info("serving %s on port %d", ", ".join(server.names), server.port)
    await stop.wait()
    log.info("shutting down")
    if on_stop is not None:
        await on_stop()
    await server.stop(grace_s)


async def serve_engine_service(name: str, service: Service, port: int, settings, warm_up: Callable[[], Awaitable[None]],
                               stats: Callable[[], dict[str, int]]) -> None:
    """The verifier's and drafter's life: serve ``service`` with engine gauges until a signal, then flush traces.

    ``settings`` is a ServerSettings (host, metrics_port, max_message_bytes, grace_s). Call
    ``setup_tracing`` before building the servicer.
    """
    server = Server([service], settings.host, port, settings.max_message_bytes)
    engine_gauges(name, stats)
    metrics_port = serve_metrics(settings.metrics_port, settings.host)
    log.info("%s: gRPC port %d, metrics port %s", name, server.port, metrics_port)
    try:
        await run_until_signal(server, settings.grace_s, warm_up)
    finally:
        shutdown_tracing()


def run(serve: Callable[[object], Awaitable[None]], settings) -> None:
    """Entry point of a service process: logging, then the asyncio loop."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(settings))
