"""Run the verifier service: ``tandem verifier`` (flags override TANDEM_* settings)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os

from engine.config import SamplingParams
from engine.spec import RoundItem
from protos.tandem.v1 import verifier_pb2, verifier_pb2_grpc
from rpc.metrics import engine_counter
from rpc.server import Service, reap_forever, run, serve_engine_service
from rpc.telemetry import setup_tracing
from rpc.tls import internal_identity
from verifier_svc.core import EngineHandle, EngineProcess, LocalEngine
from verifier_svc.service import PrefillItem, VerifierEngine
from verifier_svc.servicer import VerifierServicer
from verifier_svc.settings import VerifierSettings

log = logging.getLogger("tandem.verifier")


def warm_up(engine: VerifierEngine) -> None:
    """Tiny requests through prefill, verify and (co-located) steps, the later ones fused rounds: kernels compiled (and
    the round graphs, and the prefill graph of every prompt length, captured) before SERVING. A sampled request
    joins the running greedy one, as a later arrival does, then one with top-k and top-p filters: their eager first
    rounds and the sampled and filtering kernels (new Triton specializations) compile here, not in the first such
    request a user sends."""
    engine.decoder.capture_prefills()
    if engine.can_step:  # co-located: the round graphs of every batch size and sampling mode a Serve stream's rounds
        engine.decoder.capture_rounds()  # will take
    greedy = SamplingParams(max_tokens=32, ignore_eos=True, seed=0)
    sampled = dataclasses.replace(greedy, temperature=0.7)
    filtered = dataclasses.replace(sampled, top_k=20, top_p=0.9)
    ids: list[str] = []
    for rid, params in (("warmup", greedy), ("warmup-sampled", sampled), ("warmup-filtered", filtered)):
        engine.prefill([PrefillItem(rid, [1, 2, 3, 4], [], params)])
        engine.verify([RoundItem(rid, [5])])
        ids.append(rid)
        if engine.can_step:
            engine.step(ids, [None] * len(ids))
            engine.step(ids, [None] * len(ids))
    engine.release(ids)


async def serve(settings: VerifierSettings) -> None:
    from prometheus_client import Gauge

    identity = internal_identity(settings)  # before the model loads: no TLS files (nor insecure) ends it here
    setup_tracing("tandem-verifier")
    engine: EngineHandle
    if settings.engine_process:
        engine = EngineProcess(settings)
        await engine.start()  # the model loads there
        vocab_size = engine.vocab_size
    else:
        built = build_verifier(settings, identity)
        describe(built, settings)
        engine = LocalEngine(VerifierEngine(built.decoder, settings.lease_s), settings.engine_config().device)
        vocab_size = built.target.config.vocab_size
    servicer = VerifierServicer(engine, vocab_size)
    read = lambda key: lambda: engine.snapshot()[key]  # noqa: E731
    Gauge("tandem_verifier_prefill_chunks", "verifier: engine calls that ran a part of a Prefill's prompts so far "
          "(--max-round-tokens: a long prompt is prefilled in chunks, other calls run between them)").set_function(
        read("prefill_chunks"))
    first = engine.snapshot()
    if "spec_k" in first:
        Gauge("tandem_verifier_spec_k", "verifier: the draft length the batch policy chose for the last round "
              "(0: plain decoding; engine/policy.py)").set_function(read("spec_k"))
    if "draft_calls" in first:
        engine_counter("tandem_verifier_draft_calls", "verifier: Draft calls to its drafter service "
                       "(--direct-drafter-address): sent, of them failed (plain decoding for --drafter-retry-s), and "
                       "rows resynced (the drafter had lost them: sent again whole)", "outcome", read("draft_calls"))
        Gauge("tandem_verifier_draft_call_seconds", "verifier: wall time spent in Draft calls to its drafter service "
              "so far (a running total: serialization, the wire and the drafter's work)").set_function(
            read("draft_call_s"))
    engine_counter("tandem_fast_path_exits", "verifier: rows of co-located rounds run eagerly although the fused "
                   "fast path exists, by reason (engine/rounds/base.py Reason)", "reason", read("fast_path_exits"))
    engine_counter("tandem_verifier_rows", "verifier: rows of every round, by why they ran where they ran "
                   "(engine/rounds/base.py Reason: on_graph, demoted, prefill, ...)", "reason", read("rows"))
    engine_counter("tandem_verifier_fused_rounds", "verifier: fused (graph) rounds run, of them launched ahead of "
                   "the round before, rounds launched ahead but dropped unread, and rounds launched ahead without the rows "
                   "that had finished (compacted)", "outcome", read("fused_rounds"))
    serve_seconds = Gauge("tandem_verifier_serve_seconds", "verifier: the engine thread's time while serving Serve "
                          "streams so far, by phase: running rounds, between one round and the next (other engine "
                          "calls, waiting for the GIL) and idle (no request to run)", ["phase"])
    engine_counter("tandem_verifier_serve_rounds", "verifier: rounds run for Serve streams (rows per round: "
                   "tandem_verifier_rows_total over this)", "kind", lambda: {"run": engine.snapshot()["serve_rounds"]})
    for phase in ("round", "between", "idle"):
        serve_seconds.labels(phase).set_function(lambda phase=phase: engine.snapshot()["serve_seconds"][phase])
    Gauge("tandem_verifier_serve_row_seconds", "verifier: requests x seconds of the Serve rounds so far (over "
          "tandem_verifier_serve_seconds{phase=\"round\"}: the mean batch a round ran)").set_function(
        read("serve_row_s"))
    engine_counter("tandem_verifier_serve_requests", "verifier: Serve requests that ran to their end", "outcome",
                   lambda: {"finished": engine.snapshot()["serve_lives"]["requests"]})
    lives = Gauge("tandem_verifier_serve_request_seconds", "verifier: the Serve requests' time in the engine so far, "
                  "summed over those finished or started, by phase: queued (arrived, not yet added to the batch), "
                  "first (added, to its first tokens), life (added, to its end)", ["phase"])
    for phase in ("queued", "first", "life"):
        lives.labels(phase).set_function(lambda phase=phase: engine.snapshot()["serve_lives"][phase])
    await serve_engine_service("verifier", Service(verifier_pb2.DESCRIPTOR.services_by_name["Verifier"].full_name,
                                                   verifier_pb2_grpc.add_VerifierServicer_to_server, servicer),
                               settings.verifier_port, settings, lambda: _start(engine, settings),
                               read("stats"), identity)


def build_verifier(settings: VerifierSettings, identity=None):
    """The verifier's engine: its target, and its embedded drafter or, with ``direct_drafter_address``, the drafter
    service it calls (over ``identity``'s TLS, read from ``settings`` when not given) beside its own ``local_draft``
    drafter (engine/factory.py ``build_engine``)."""
    from engine.factory import build_engine

    drafter = None
    if settings.direct_drafter_address:
        drafter = remote_drafter(settings, identity or internal_identity(settings))
    return build_engine(settings.model, settings.draft, settings.engine_config(), drafter=drafter,
                        local=settings.local_draft)


def describe(built, settings: VerifierSettings) -> None:
    direct = settings.direct_drafter_address
    log.info("verifier: model %s, %s; engine in %s", built.target.source,
             f"drafting through {built.decoder.drafter.name} at {direct}, where its rounds do not pay "
             + (f"with its own {settings.local_draft} drafter" if built.decoder.fast.local else "plainly") if direct
             else f"embedded drafter {settings.draft}",
             f"process {os.getpid()} of its own" if settings.engine_process else "this process")


def remote_drafter(settings: VerifierSettings, identity):
    """The drafter service at ``direct_drafter_address`` as this verifier's drafter, once it answers."""
    from verifier_svc.remote_drafter import RemoteDrafter, open_channel

    def make(target):
        ch = open_channel(settings.direct_drafter_address, settings.max_message_bytes, identity)
        return RemoteDrafter(settings.direct_drafter_address, target.config.vocab_size, channel=ch,
                             timeout_s=settings.draft_timeout_s, retry_s=settings.drafter_retry_s,
                             feature_window=settings.feature_window, connect_timeout_s=settings.drafter_connect_s)
    return make


async def _start(engine: EngineHandle, settings: VerifierSettings) -> None:
    await engine.call("warm_up")
    engine.reaper = asyncio.create_task(reap_forever("verifier", lambda: engine.call("reap"), settings.lease_s))


def main(settings: VerifierSettings) -> None:
    run(serve, settings)
