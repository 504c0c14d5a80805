"""tandem.v1.Verifier: proto <-> engine types; the engine runs behind an ``EngineHandle`` (verifier_svc/core.py: a
process of its own, or a thread of this one)."""

from __future__ import annotations

import asyncio
from typing import Callable

import grpc

from engine.request import RequestOutput
from engine.spec import RoundItem
from protos.tandem.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from rpc import convert, tensors
from rpc.status import code_for, message_for
from verifier_svc.core import EngineHandle
from verifier_svc.service import PrefillItem, Result
from verifier_svc.serving import Admit, Outcome

_END = object()  # the caller closed its side of a Serve stream
MAX_ROUNDS_PER_UPDATE = 64  # rounds a slow reader gets in one ServeUpdate


def verdict(request_id: str, result: Result) -> verifier_pb2.Verdict:
    if isinstance(result, Exception):
        return verifier_pb2.Verdict(request_id=request_id, error=message_for(result),
                                    error_code=code_for(result).value[0])
    o: RequestOutput = result
    v = verifier_pb2.Verdict(request_id=request_id, accepted=o.round_accepted, drafted=o.round_drafted,
                             rounds=o.round_count,
                             committed=tensors.encode(o.new_token_ids, "int32"), text=o.text_delta,
                             finish_reason=convert.finish_to_pb(o.finish_reason))
    if o.features is not None:
        v.features.CopyFrom(tensors.encode(o.features, "bfloat16"))
        v.features_start = o.features_start
    return v


def round_report(o: Outcome) -> verifier_pb2.RoundReport:
    return verifier_pb2.RoundReport(
        slots=tensors.encode(o.slots), counts=tensors.encode(o.counts), tokens=tensors.encode(o.tokens),
        accepted=tensors.encode(o.accepted), drafted=tensors.encode(o.drafted), k=tensors.encode(o.k),
        finish=tensors.encode([convert.finish_to_pb(f) for f in o.finish], "int32"), text=o.text,
        text_offsets=tensors.encode(o.text_offsets), start_unix_nano=o.start_unix_nano, duration_ns=o.duration_ns,
        rounds=tensors.encode(o.rounds if o.rounds is not None else [1] * len(o.slots), "int32"))


def _update(items: list) -> verifier_pb2.ServeUpdate:
    update = verifier_pb2.ServeUpdate()
    for item in items:
        if isinstance(item, Outcome):
            update.rounds.append(round_report(item))
        else:
            slot, exc = item
            update.errors.append(verifier_pb2.SlotError(slot=slot, code=code_for(exc).value[0],
                                                        message=message_for(exc)))
    return update


def _convert(fn: Callable, *args):
    try:
        return fn(*args)
    except ValueError as exc:
        return exc


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    def __init__(self, engine: EngineHandle, vocab_size: int) -> None:
        self.engine = engine  # VerifierEngine's methods by name, between rounds; the RoundLoop's sessions
        self.vocab = vocab_size

    def _prefill_item(self, it: verifier_pb2.PrefillItem) -> PrefillItem:
        return PrefillItem(it.request_id, tensors.token_ids(it.prompt, "prompt"),
                           tensors.token_ids(it.output, "output"), convert.sampling_from_pb(it.sampling))

    def _round_item(self, it: verifier_pb2.VerifyItem) -> RoundItem:
        drafts = tensors.token_ids(it.draft_tokens, "draft_tokens")
        if any(not 0 <= t < self.vocab for t in drafts):
            raise ValueError(f"draft_tokens: ids must be in [0, {self.vocab})")
        probs = convert.draft_probs_from_pb(it.draft_probs, drafts, self.vocab) if it.HasField("draft_probs") else None
        return RoundItem(it.request_id, drafts, probs)

    async def _engine_call(self, context, name: str, *args):
        try:
            return await self.engine.call(name, *args)
        except ValueError as exc:  # a call-level field (feature_layers); per-item errors never get here
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def Prefill(self, request, context):
        items = [_convert(self._prefill_item, it) for it in request.items]
        layers = list(request.feature_layers)
        if not self.engine.chunk_tokens:
            results = await self._engine_call(context, "prefill", items, layers, request.feature_window)
        else:  # the prompts in chunks, each its own engine call: other calls (Verify, Step) run between them
            started, errors = await self._engine_call(context, "start", items, layers)
            ids = [items[i].request_id for i in started]
            while await self.engine.call("prefill_chunk", ids, layers):
                pass
            results = await self._engine_call(context, "finish_prefill", items, started, errors, layers,
                                              request.feature_window)
        return verifier_pb2.VerifyResponse(verdicts=[verdict(it.request_id, r) for it, r in zip(request.items, results)])

    async def Verify(self, request, context):
        items = [_convert(self._round_item, it) for it in request.items]
        results = await self._engine_call(context, "verify", items, list(request.feature_layers),
                                          request.feature_window)
        return verifier_pb2.VerifyResponse(verdicts=[verdict(it.request_id, r) for it, r in zip(request.items, results)])

    async def Step(self, request, context):
        if not self.engine.can_step:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "Step needs an embedded drafter: start the verifier with --draft (co-located mode)")
        ids = [it.request_id for it in request.items]
        results = await self.engine.call("step", ids, [it.k for it in request.items])
        return verifier_pb2.VerifyResponse(verdicts=[verdict(i, r) for i, r in zip(ids, results)])

    async def Release(self, request, context):
        released = await self.engine.call("release", list(request.request_ids))
        return common_pb2.ReleaseResponse(released=released)

    def _admit(self, it: verifier_pb2.ServeAdmit) -> Admit:
        return Admit(it.slot, tensors.token_ids(it.prompt, "admit.prompt"),
                     tensors.token_ids(it.output, "admit.output"),
                     convert.sampling_from_pb(it.sampling, prefix="admit.sampling."))

    async def _controls(self, requests, session, out: asyncio.Queue) -> None:
        """The caller's side of a Serve stream into the round loop; a malformed admission is refused alone."""
        try:
            async for ctl in requests:
                admits = []
                for it in ctl.admit:
                    try:
                        admits.append(self._admit(it))
                    except ValueError as exc:
                        out.put_nowait((it.slot, exc))
                cancels = tensors.token_ids(ctl.cancel, "cancel") if ctl.HasField("cancel") else []
                self.engine.control(session, admits, cancels)
        finally:
            out.put_nowait(_END)

    async def Serve(self, request_iterator, context):
        if not self.engine.can_step:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "Serve needs an embedded drafter: start the verifier with --draft (co-located mode)")
        out: asyncio.Queue = asyncio.Queue()
        session = self.engine.open(out.put_nowait)
        reader = asyncio.create_task(self._controls(request_iterator, session, out))
        try:
            while True:
                items = [await out.get()]
                while not out.empty() and len(items) < MAX_ROUNDS_PER_UPDATE:  # a slow reader gets rounds together
                    items.append(out.get_nowait())
                end = _END in items
                lost = next((i for i in items if isinstance(i, Exception)), None)
                if lost is not None:  # the engine is gone (its process ended): the caller resumes elsewhere
                    await context.abort(grpc.StatusCode.UNAVAILABLE, str(lost))
                items = [i for i in items if i is not _END]
                if items:
                    yield _update(items)
                if end:
                    if reader.done() and reader.exception() is not None:
                        exc = reader.exception()
                        await context.abort(code_for(exc), message_for(exc))
                    return
        finally:
            reader.cancel()
            self.engine.control(session, close=True)  # every request of the stream goes, its KV freed
