"""tandem.v1.Drafter: proto <-> engine types; drafting runs on one dedicated thread."""

from __future__ import annotations

import asyncio

from drafter_svc.service import Draft, DrafterEngine, DraftItem, ResyncNeeded
from engine.factory import engine_thread
from protos.tandem.v1 import common_pb2, drafter_pb2, drafter_pb2_grpc
from rpc import convert, tensors


def _item(it: drafter_pb2.DraftItem) -> DraftItem | Exception:
    try:
        features = (tensors.to_torch(it.features, "features", ("bfloat16", "float16", "float32"), ndim=2)
                    if it.HasField("features") else None)
        return DraftItem(it.request_id, it.start, tensors.token_ids(it.tokens, "tokens"), it.k,
                         convert.sampling_from_pb(it.sampling), features, it.features_start)
    except ValueError as exc:
        return exc


def _result(request_id: str, r: Draft | Exception, top_m: int) -> drafter_pb2.DraftResult:
    if isinstance(r, ResyncNeeded):
        return drafter_pb2.DraftResult(request_id=request_id, status=drafter_pb2.DRAFT_STATUS_RESYNC, error=str(r))
    if isinstance(r, Exception):
        return drafter_pb2.DraftResult(request_id=request_id, status=drafter_pb2.DRAFT_STATUS_INVALID, error=str(r))
    out = drafter_pb2.DraftResult(request_id=request_id, tokens=tensors.encode(r.tokens, "int32"))
    if r.probs is not None:
        out.probs.CopyFrom(convert.draft_probs_to_pb(r.probs, top_m))
    return out


class DrafterServicer(drafter_pb2_grpc.DrafterServicer):
    def __init__(self, engine: DrafterEngine, top_m: int, device: str) -> None:
        self.engine = engine
        self.top_m = top_m
        self.pool = engine_thread("drafter-engine", device)

    async def run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def Draft(self, request, context):
        results = await self.run(self.engine.draft, [_item(it) for it in request.items])
        return drafter_pb2.DraftResponse(
            results=[_result(it.request_id, r, self.top_m) for it, r in zip(request.items, results)])

    async def DraftStream(self, request_iterator, context):
        async for request in request_iterator:
            yield await self.Draft(request, context)

    async def Describe(self, request, context):
        d = self.engine.drafter
        return drafter_pb2.DrafterInfo(name=d.name, deterministic=d.deterministic,
                                       feature_layers=list(self.engine.feature_layers),
                                       feature_size=self.engine.feature_size)

    async def Release(self, request, context):
        return common_pb2.ReleaseResponse(released=await self.run(self.engine.release, list(request.request_ids)))
