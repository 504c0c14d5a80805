"""Run the verifier service: ``tandem verifier`` (flags override TANDEM_* settings)."""

from __future__ import annotations

import asyncio
import logging

from engine.config import SamplingParams
from engine.spec import RoundItem
from protos.tandem.v1 import verifier_pb2, verifier_pb2_grpc
from rpc.metrics import engine_gauges, serve_metrics
from rpc.server import Server, Service, run_until_signal
from rpc.telemetry import setup_tracing, shutdown_tracing
from verifier_svc.settings import VerifierSettings
from verifier_svc.service import PrefillItem, VerifierEngine
from verifier_svc.servicer import VerifierServicer

log = logging.getLogger("tandem.verifier")


def warm_up(engine: VerifierEngine) -> None:
    """One tiny request through prefill, verify and (co-located) step: kernels compiled before SERVING."""
    ids = ["warmup"]
    engine.prefill([PrefillItem("warmup", [1, 2, 3, 4], [], SamplingParams(max_tokens=8, ignore_eos=True, seed=0))])
    engine.verify([RoundItem("warmup", [5])])
    if engine.can_step:
        engine.step(ids, [2])
    engine.release(ids)


async def serve(settings: VerifierSettings) -> None:
    from engine.factory import build_engine

    setup_tracing("tandem-verifier")
    built = build_engine(settings.model, settings.draft, settings.engine_config())
    engine = VerifierEngine(built.decoder)
    servicer = VerifierServicer(engine, built.target.config.vocab_size)
    server = Server([Service(verifier_pb2.DESCRIPTOR.services_by_name["Verifier"].full_name,
                             verifier_pb2_grpc.add_VerifierServicer_to_server, servicer)],
                    settings.host, settings.verifier_port, settings.max_message_bytes)
    engine_gauges("verifier", engine.stats)
    metrics_port = serve_metrics(settings.metrics_port, settings.host)
    log.info("verifier: model %s, embedded drafter %s, metrics port %s", built.target.source, settings.draft,
             metrics_port)

    try:
        await run_until_signal(server, settings.grace_s, lambda: servicer.run(warm_up, engine))
    finally:
        shutdown_tracing()


def main(settings: VerifierSettings) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(settings))
