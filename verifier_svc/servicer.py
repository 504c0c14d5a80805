"""tandem.v1.Verifier: proto <-> engine types; the engine runs on one dedicated thread."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import grpc

from engine.request import RequestOutput
from engine.spec import RoundItem
from protos.tandem.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from rpc import convert, tensors
from rpc.status import code_for, message_for
from verifier_svc.service import PrefillItem, Result, VerifierEngine


def verdict(request_id: str, result: Result) -> verifier_pb2.Verdict:
    if isinstance(result, Exception):
        return verifier_pb2.Verdict(request_id=request_id, error=message_for(result),
                                    error_code=code_for(result).value[0])
    o: RequestOutput = result
    v = verifier_pb2.Verdict(request_id=request_id, accepted=o.round_accepted, drafted=o.round_drafted,
                             committed=tensors.encode(o.new_token_ids, "int32"), text=o.text_delta,
                             finish_reason=convert.finish_to_pb(o.finish_reason))
    if o.features is not None:
        v.features.CopyFrom(tensors.encode(o.features, "bfloat16"))
        v.features_start = o.features_start
    return v


def _convert(fn: Callable, *args):
    try:
        return fn(*args)
    except ValueError as exc:
        return exc


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    def __init__(self, engine: VerifierEngine, vocab_size: int) -> None:
        self.engine = engine
        self.vocab = vocab_size
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verifier-engine")

    async def run(self, fn: Callable, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def _prefill_item(self, it: verifier_pb2.PrefillItem) -> PrefillItem:
        return PrefillItem(it.request_id, tensors.token_ids(it.prompt, "prompt"),
                           tensors.token_ids(it.output, "output"), convert.sampling_from_pb(it.sampling))

    def _round_item(self, it: verifier_pb2.VerifyItem) -> RoundItem:
        drafts = tensors.token_ids(it.draft_tokens, "draft_tokens")
        if any(not 0 <= t < self.vocab for t in drafts):
            raise ValueError(f"draft_tokens: ids must be in [0, {self.vocab})")
        probs = convert.draft_probs_from_pb(it.draft_probs, drafts, self.vocab) if it.HasField("draft_probs") else None
        return RoundItem(it.request_id, drafts, probs)

    async def _engine_call(self, context, fn, *args):
        try:
            return await self.run(fn, *args)
        except ValueError as exc:  # a call-level field (feature_layers); per-item errors never get here
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def Prefill(self, request, context):
        items = [_convert(self._prefill_item, it) for it in request.items]
        results = await self._engine_call(context, self.engine.prefill, items, list(request.feature_layers),
                                          request.feature_window)
        return verifier_pb2.VerifyResponse(verdicts=[verdict(it.request_id, r) for it, r in zip(request.items, results)])

    async def Verify(self, request, context):
        items = [_convert(self._round_item, it) for it in request.items]
        results = await self._engine_call(context, self.engine.verify, items, list(request.feature_layers),
                                          request.feature_window)
        return verifier_pb2.VerifyResponse(verdicts=[verdict(it.request_id, r) for it, r in zip(request.items, results)])

    async def Step(self, request, context):
        if not self.engine.can_step:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "Step needs an embedded drafter: start the verifier with --draft (co-located mode)")
        ids = [it.request_id for it in request.items]
        results = await self.run(self.engine.step, ids, [it.k for it in request.items])
        return verifier_pb2.VerifyResponse(verdicts=[verdict(i, r) for i, r in zip(ids, results)])

    async def Release(self, request, context):
        released = await self.run(self.engine.release, list(request.request_ids))
        return common_pb2.ReleaseResponse(released=released)
