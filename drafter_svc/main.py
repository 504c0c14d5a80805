"""Run the drafter service: ``tandem drafter`` (flags override TANDEM_* settings)."""

from __future__ import annotations

import asyncio
import logging

from drafter_svc.service import DrafterEngine, DraftItem
from drafter_svc.servicer import DrafterServicer
from engine.config import EngineConfig, SamplingParams
from protos.tandem.v1 import drafter_pb2, drafter_pb2_grpc
from rpc.metrics import engine_gauges, serve_metrics
from rpc.server import Server, Service, run_until_signal
from rpc.telemetry import setup_tracing, shutdown_tracing
from drafter_svc.settings import DrafterSettings

log = logging.getLogger("tandem.drafter")


def build(settings: DrafterSettings, config: EngineConfig) -> DrafterEngine:
    """Load only what the drafter needs: the tokenizer for n-gram and draft LMs, N layers for layerskip:N."""
    from engine.assets import default_model_path
    from engine.drafters import DraftSpec, build_drafter
    from engine.models.loader import load_model

    spec = DraftSpec.parse(settings.draft)
    if spec.kind == "none":
        raise ValueError("draft: the drafter service needs a drafter (ngram[:N], layerskip:N or PATH)")
    path = settings.model or default_model_path()
    target = load_model(path, device=config.device, dtype=config.torch_dtype,
                        max_layers=spec.size if spec.kind == "layerskip" else None,
                        load_weights=spec.kind == "layerskip")
    drafter = build_drafter(spec, target, config)
    return DrafterEngine(drafter, target.config.vocab_size, config.max_k)


def warm_up(engine: DrafterEngine) -> None:
    params = SamplingParams(temperature=0.7, seed=0)
    engine.draft([DraftItem("warmup", 0, [1, 2, 3, 1, 2], 2, params)])
    engine.draft([DraftItem("warmup", 5, [3], 3, SamplingParams())])
    engine.release(["warmup"])


async def serve(settings: DrafterSettings) -> None:
    setup_tracing("tandem-drafter")
    config = settings.engine_config()
    engine = build(settings, config)
    servicer = DrafterServicer(engine, config.draft_top_m or engine.vocab)
    server = Server([Service(drafter_pb2.DESCRIPTOR.services_by_name["Drafter"].full_name,
                             drafter_pb2_grpc.add_DrafterServicer_to_server, servicer)],
                    settings.host, settings.drafter_port, settings.max_message_bytes)
    engine_gauges("drafter", engine.stats)
    metrics_port = serve_metrics(settings.metrics_port, settings.host)
    log.info("drafter: %s, metrics port %s", settings.draft, metrics_port)
    try:
        await run_until_signal(server, settings.grace_s, lambda: servicer.run(warm_up, engine))
    finally:
        shutdown_tracing()


def main(settings: DrafterSettings) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(settings))
