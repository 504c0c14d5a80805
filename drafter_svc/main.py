"""Run the drafter service: ``tandem drafter`` (flags override TANDEM_* settings)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from drafter_svc.service import DrafterEngine, DraftItem
from drafter_svc.servicer import DrafterServicer
from drafter_svc.settings import DrafterSettings
from engine.config import EngineConfig, SamplingParams
from protos.tandem.v1 import drafter_pb2, drafter_pb2_grpc
from rpc.server import Service, reap_forever, run, serve_engine_service
from rpc.telemetry import setup_tracing
from rpc.tls import internal_identity

log = logging.getLogger("tandem.drafter")


# what a drafter needs of the target's weights: N layers for layerskip:N; the embedding and LM head
# (loaded with one layer) for an EAGLE head; nothing but the tokenizer and config otherwise
_TARGET_LAYERS = {"layerskip": lambda spec: spec.size, "eagle": lambda spec: 1}


def build(settings: DrafterSettings, config: EngineConfig) -> DrafterEngine:
    """Load only the part of the target the drafter needs."""
    from engine.assets import default_model_path
    from engine.drafters import DraftSpec, build_drafter, resolve_draft
    from engine.factory import use_device
    from engine.models.loader import load_model

    use_device(config.device)
    spec = DraftSpec.parse(settings.draft)
    if spec.kind == "none":
        raise ValueError("draft: the drafter service needs a drafter (auto, ngram[:N], layerskip:N or PATH)")
    path = settings.model or default_model_path()
    spec = resolve_draft(spec, load_model(path, load_weights=False, progress=False).config)
    layers = _TARGET_LAYERS.get(spec.kind)
    target = load_model(path, device=config.device, dtype=config.torch_dtype,
                        max_layers=layers(spec) if layers else None, load_weights=layers is not None)
    drafter = build_drafter(spec, target, dataclasses.replace(config, fused_rounds=False))  # it runs no rounds
    return DrafterEngine(drafter, target.config.vocab_size, config.max_k, settings.lease_s)


def warm_up(engine: DrafterEngine) -> None:
    import torch

    engine.capture_prefills()
    params = SamplingParams(temperature=0.7, seed=0)
    feats = torch.zeros(4, engine.feature_size) if engine.feature_size else None  # a feature-fed head drafts too
    engine.draft([DraftItem("warmup", 0, [1, 2, 3, 1, 2], 2, params, feats, 0)])
    engine.draft([DraftItem("warmup", 5, [3], 3, SamplingParams())])
    # two rows in one call, a greedy one and a sampled one, as the verifier's rounds send them
    pair = (("warmup-greedy", SamplingParams()), ("warmup-sampled", params))
    engine.draft([DraftItem(rid, 0, [1, 2, 3, 1, 2], 3, p, feats, 0) for rid, p in pair])
    engine.draft([DraftItem(rid, 5, [3], 3, p) for rid, p in pair])
    engine.release(["warmup"] + [rid for rid, _ in pair])


async def serve(settings: DrafterSettings) -> None:
    from prometheus_client import Gauge

    identity = internal_identity(settings)  # before the drafter loads: no TLS files (nor insecure) ends it here
    setup_tracing("tandem-drafter")
    config = settings.engine_config(wire=True)  # sampled drafts cross the wire as their top m
    engine = build(settings, config)
    servicer = DrafterServicer(engine, config.draft_top_m or engine.vocab, config.device)
    log.info("drafter: %s", settings.draft)
    Gauge("tandem_drafter_draft_seconds", "drafter: time spent drafting so far (a running total: the drafter's "
          "own work, without gRPC)").set_function(lambda: engine.draft_s)
    await serve_engine_service("drafter", Service(drafter_pb2.DESCRIPTOR.services_by_name["Drafter"].full_name,
                                                  drafter_pb2_grpc.add_DrafterServicer_to_server, servicer),
                               settings.drafter_port, settings, lambda: _start(servicer, engine, settings),
                               engine.stats, identity)


async def _start(servicer: DrafterServicer, engine: DrafterEngine, settings: DrafterSettings) -> None:
    await servicer.run(warm_up, engine)
    servicer.reaper = asyncio.create_task(reap_forever("drafter", lambda: servicer.run(engine.reap), settings.lease_s))


def main(settings: DrafterSettings) -> None:
    run(serve, settings)
