"""Run the gateway: ``tandem gateway`` (flags override TANDEM_* settings)."""

from __future__ import annotations

import asyncio
import logging

from gateway.clients import DrafterClient, VerifierClient, channel
from gateway.discovery import Discovery, Target
from gateway.metrics import GatewayMetrics
from gateway.replicas import ReplicaPool
from gateway.requests import RequestBuilder
from gateway.rounds import SplitDriver
from gateway.scheduler import Scheduler
from gateway.servicer import GatewayServicer
from gateway.settings import GatewaySettings
from gateway.streamed import StreamedScheduler
from gateway.tasks import cancel_and_wait
from protos.tandem.v1 import gateway_pb2, gateway_pb2_grpc
from rpc.auth import ApiKeyInterceptor, check_open
from rpc.metrics import serve_metrics
from rpc.server import Server, Service, run, run_until_signal
from rpc.telemetry import setup_tracing, shutdown_tracing
from rpc.tls import Identity, api_server_credentials, describe, internal_identity, is_loopback

log = logging.getLogger("tandem.gateway")


def replica_pool(service: str, targets: list[Target], client_cls, timeout_s: float, probe_s: float,
                 settings: GatewaySettings, identity: Identity | None) -> ReplicaPool:
    """One channel and client per replica of a service, found through its address setting; mutual TLS with the
    gateway's ``identity`` (None: plaintext), each replica's certificate checked against the name it was found by."""
    discovery = Discovery(targets)

    def make(address: str):
        ch = channel(address, timeout_s, settings.max_message_bytes, identity, discovery.name_of(address))
        if client_cls is VerifierClient:
            return ch, VerifierClient(ch, timeout_s, settings.prefill_timeout_s)
        return ch, client_cls(ch, timeout_s)

    return ReplicaPool(service, discovery, make, probe_s=probe_s, discovery_s=settings.discovery_interval_s)


async def serve(settings: GatewaySettings) -> None:
    from engine.assets import default_model_path
    from engine.models.loader import load_model

    # what protects each side, read before anything starts: a missing file (or none, without insecure) ends it here
    identity = internal_identity(settings)
    api_credentials = api_server_credentials(settings)
    api_keys = check_open(settings)
    setup_tracing("tandem-gateway")
    target = load_model(settings.model or default_model_path(), load_weights=False)
    max_context = target.config.max_position
    verifiers = replica_pool("verifier", settings.verifier_targets(), VerifierClient, settings.verify_timeout_s,
                             settings.verifier_probe_s, settings, identity)
    metrics = GatewayMetrics()
    if settings.colocated:  # the verifier runs the rounds, over one Serve stream per verifier
        driver = scheduler = StreamedScheduler(verifiers, settings, metrics)
    else:
        drafters = replica_pool("drafter", settings.drafter_targets(), DrafterClient, settings.draft_timeout_s,
                                settings.drafter_probe_s, settings, identity)
        driver = SplitDriver(verifiers, drafters, settings, target.config.num_layers)
        scheduler = Scheduler(driver, settings, metrics)
    metrics.watch(driver.pools)
    builder = RequestBuilder(target.tokenizer, target.config.vocab_size, max_context, settings)
    server = Server([Service(gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name,
                             gateway_pb2_grpc.add_GatewayServicer_to_server, GatewayServicer(builder, scheduler))],
                    settings.host, settings.gateway_port, settings.max_message_bytes, settings.reuse_port,
                    credentials=api_credentials, health_port=settings.health_port,
                    interceptors=(ApiKeyInterceptor(api_keys),) if api_keys is not None else ())
    metrics_port = serve_metrics(settings.metrics_port, settings.host)
    log.info("gateway: clients %s over %s; verifiers and drafters: %s",
             f"need one of {len(api_keys)} API keys" if api_keys is not None else "need no API key",
             "TLS" if api_credentials is not None else "plaintext", describe(identity))
    if api_keys is not None and api_credentials is None and not is_loopback(settings.host):
        log.warning("gateway: API keys over plaintext on %s: anyone on the path can read them; give "
                    "api_tls_cert_file and api_tls_key_file (or terminate TLS in front of the gateway)", settings.host)

    async def ready() -> None:
        await verifiers.wait_up("a verifier")  # SERVING only once some verifier is
        if isinstance(driver, SplitDriver):
            await driver.drafters.refresh()
            if not driver.drafter_up:
                log.warning("no drafter answers at %s: plain decoding until one does", settings.drafter_address)
        for pool in driver.pools:
            pool.start()
        scheduler.start()
        tasks.append(asyncio.create_task(_report_health(server, verifiers, settings.verifier_probe_s)))
        log.info("gateway (%s mode) ready on port %d, metrics port %s; replicas: %s", driver.mode, server.port,
                 metrics_port, "; ".join(f"{p.service} {', '.join(p.replicas) or 'none'}" for p in driver.pools))

    tasks: list[asyncio.Task] = []

    async def stop() -> None:
        for task in tasks:
            await cancel_and_wait(task)
        await scheduler.stop()
        for pool in driver.pools:
            await pool.close()

    try:
        await run_until_signal(server, settings.grace_s, ready, stop)
    finally:
        shutdown_tracing()


async def _report_health(server: Server, verifiers: ReplicaPool, probe_s: float) -> None:
    """NOT_SERVING on grpc.health.v1 while no verifier is up (requests then wait for one), SERVING again after."""
    serving = True
    while True:
        await asyncio.sleep(probe_s)
        if verifiers.any_up != serving:
            serving = verifiers.any_up
            await server.set_serving(serving)
            log.warning("no verifier is up: NOT_SERVING; requests wait for one" if not serving else
                        "a verifier is up again: SERVING")


def main(settings: GatewaySettings) -> None:
    run(serve, settings)
