"""Run the gateway: ``tandem gateway`` (flags override TANDEM_* settings)."""

from __future__ import annotations

import asyncio
import logging

from gateway.clients import DrafterClient, VerifierClient, channel, is_serving
from gateway.metrics import GatewayMetrics
from gateway.requests import RequestBuilder
from gateway.rounds import ColocatedDriver, SplitDriver
from gateway.scheduler import Scheduler
from gateway.servicer import GatewayServicer
from gateway.settings import GatewaySettings
from protos.tandem.v1 import gateway_pb2, gateway_pb2_grpc
from rpc.metrics import serve_metrics
from rpc.server import Server, Service, run, run_until_signal
from rpc.telemetry import setup_tracing, shutdown_tracing

log = logging.getLogger("tandem.gateway")


async def wait_serving(ch, name: str, address: str) -> None:
    waited = 0.0
    while not await is_serving(ch):
        if waited % 10 == 0:
            log.info("waiting for the %s at %s", name, address)
        await asyncio.sleep(0.5)
        waited += 0.5


async def serve(settings: GatewaySettings) -> None:
    from engine.assets import default_model_path
    from engine.models.loader import load_model

    setup_tracing("tandem-gateway")
    target = load_model(settings.model or default_model_path(), load_weights=False)
    max_context = target.config.max_position
    vch = channel(settings.verifier_address, settings.verify_timeout_s, settings.max_message_bytes)
    verifier = VerifierClient(vch, settings.verify_timeout_s)
    if settings.colocated:
        driver = ColocatedDriver(verifier, settings)
    else:
        dch = channel(settings.drafter_address, settings.draft_timeout_s, settings.max_message_bytes)
        driver = SplitDriver(verifier, DrafterClient(dch, settings.draft_timeout_s), settings,
                             target.config.num_layers)
    metrics = GatewayMetrics()
    scheduler = Scheduler(driver, settings, metrics)
    builder = RequestBuilder(target.tokenizer, target.config.vocab_size, max_context, settings)
    server = Server([Service(gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name,
                             gateway_pb2_grpc.add_GatewayServicer_to_server, GatewayServicer(builder, scheduler))],
                    settings.host, settings.gateway_port, settings.max_message_bytes)
    metrics_port = serve_metrics(settings.metrics_port, settings.host)

    async def ready() -> None:
        await wait_serving(vch, "verifier", settings.verifier_address)
        if isinstance(driver, SplitDriver):
            if not await is_serving(driver.drafter.channel):
                driver.mark_down(f"not serving at {settings.drafter_address} at startup")
            else:
                await driver.connect()
        scheduler.start()
        log.info("gateway (%s mode) ready on port %d, metrics port %s", driver.mode, server.port, metrics_port)

    try:
        await run_until_signal(server, settings.grace_s, ready, scheduler.stop)
    finally:
        shutdown_tracing()


def main(settings: GatewaySettings) -> None:
    run(serve, settings)
