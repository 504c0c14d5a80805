"""Typed async clients for the verifier and the drafter (proto conversion lives here, not in the round logic)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engine.request import FinishReason
from gateway.requests import GatewayRequest
from protos.tandem.v1 import common_pb2, drafter_pb2, drafter_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from rpc import convert, tensors
from rpc.interceptors import DeadlineClientInterceptor, TracingClientInterceptor, channel_interceptors
from rpc.server import client_options
from rpc.tls import Identity


@dataclass(frozen=True)
class Verdict:
    request_id: str  # the gateway's key of the request (GatewayRequest.key), never a client's id
    committed: list[int]
    text: str
    accepted: int
    drafted: int
    finish_reason: FinishReason | None
    error: str = ""
    error_code: grpc.StatusCode | None = None
    features: torch.Tensor | None = None  # [n, F] target features of positions features_start .. (split + EAGLE)
    features_start: int = 0
    rounds: int = 1  # rounds it took (a co-located Step's replay may run several: --spec-rounds)


@dataclass(frozen=True)
class DrafterInfo:
    name: str
    deterministic: bool
    feature_layers: tuple[int, ...]  # target layers the drafter drafts from (empty: tokens only)
    feature_size: int                # values per position of those features


@dataclass(frozen=True)
class DraftResult:
    request_id: str
    tokens: list[int]
    probs: common_pb2.DraftDistribution | None  # passed through to the verifier untouched
    resync: bool = False
    error: str = ""


def channel(address: str, timeout_s: float, max_message_bytes: int, identity: Identity | None = None,
            server_name: str | None = None) -> grpc.aio.Channel:
    """A channel to a verifier or drafter replica: mutual TLS with the gateway's ``identity`` (``rpc.tls``; None:
    plaintext), the replica's certificate checked against ``server_name`` (the DNS name its address came from)
    where given, else against the address dialled."""
    options = client_options(max_message_bytes)
    interceptors = channel_interceptors(DeadlineClientInterceptor(timeout_s), TracingClientInterceptor())
    if identity is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.aio.secure_channel(address, identity.channel_credentials(), options=options,
                                   interceptors=interceptors)


async def is_serving(ch: grpc.aio.Channel, timeout_s: float = 1.0) -> bool:
    try:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
    except grpc.aio.AioRpcError:
        return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def _verdicts(resp: verifier_pb2.VerifyResponse) -> list[Verdict]:
    out = []
    for v in resp.verdicts:
        code = _CODES.get(v.error_code) if v.error else None
        feats = tensors.to_torch(v.features, "features", ndim=2) if v.HasField("features") else None
        out.append(Verdict(v.request_id, tensors.token_ids(v.committed, "committed") if not v.error else [],
                           v.text, v.accepted, v.drafted, convert.finish_from_pb(v.finish_reason), v.error, code,
                           feats, v.features_start, v.rounds or 1))
    return out


class VerifierClient:
    def __init__(self, ch: grpc.aio.Channel, timeout_s: float, prefill_timeout_s: float | None = None) -> None:
        self.channel = ch
        self.stub = verifier_pb2_grpc.VerifierStub(ch)
        self.timeout = timeout_s
        self.prefill_timeout = prefill_timeout_s or timeout_s  # a prompt's prefill has a deadline of its own

    async def prefill(self, reqs: Sequence[GatewayRequest], feature_layers: Sequence[int] = (),
                      feature_window: int = 0) -> list[Verdict]:
        items = [verifier_pb2.PrefillItem(request_id=r.key, prompt=tensors.encode(r.prompt_ids, "int32"),
                                          output=tensors.encode(r.output_ids, "int32"),
                                          sampling=convert.sampling_to_pb(r.params)) for r in reqs]
        req = verifier_pb2.PrefillRequest(items=items, feature_layers=list(feature_layers),
                                          feature_window=feature_window)
        return _verdicts(await self.stub.Prefill(req, timeout=self.prefill_timeout))

    async def verify(self, reqs: Sequence[GatewayRequest], drafts: Sequence[list[int]],
                     probs: Sequence[common_pb2.DraftDistribution | None], feature_layers: Sequence[int] = (),
                     feature_window: int = 0) -> list[Verdict]:
        items = []
        for r, d, p in zip(reqs, drafts, probs):
            item = verifier_pb2.VerifyItem(request_id=r.key, draft_tokens=tensors.encode(d, "int32"))
            if p is not None and d:
                item.draft_probs.CopyFrom(p)
            items.append(item)
        req = verifier_pb2.VerifyRequest(items=items, feature_layers=list(feature_layers),
                                         feature_window=feature_window)
        return _verdicts(await self.stub.Verify(req, timeout=self.timeout))

    async def step(self, reqs: Sequence[GatewayRequest], ks: Sequence[int]) -> list[Verdict]:
        items = [verifier_pb2.StepItem(request_id=r.key, k=k) for r, k in zip(reqs, ks)]
        return _verdicts(await self.stub.Step(verifier_pb2.StepRequest(items=items), timeout=self.timeout))

    async def release(self, ids: Sequence[str]) -> None:
        await self.stub.Release(common_pb2.ReleaseRequest(request_ids=list(ids)), timeout=self.timeout)


class DrafterClient:
    def __init__(self, ch: grpc.aio.Channel, timeout_s: float) -> None:
        self.channel = ch
        self.stub = drafter_pb2_grpc.DrafterStub(ch)
        self.timeout = timeout_s

    async def describe(self) -> DrafterInfo:
        d = await self.stub.Describe(drafter_pb2.DescribeRequest(), timeout=self.timeout)
        return DrafterInfo(d.name, d.deterministic, tuple(d.feature_layers), d.feature_size)

    async def draft(self, reqs: Sequence[GatewayRequest], starts: Sequence[int], tokens: Sequence[list[int]],
                    ks: Sequence[int], features: Sequence[tuple[int, torch.Tensor | None]] | None = None
                    ) -> list[DraftResult]:
        items = []
        for i, (r, s, t, k) in enumerate(zip(reqs, starts, tokens, ks)):
            item = drafter_pb2.DraftItem(request_id=r.key, start=s, tokens=tensors.encode(t, "int32"), k=k,
                                         sampling=convert.sampling_to_pb(r.params))
            if features is not None and features[i][1] is not None:
                item.features.CopyFrom(tensors.encode(features[i][1]))
                item.features_start = features[i][0]
            items.append(item)
        resp = await self.stub.Draft(drafter_pb2.DraftRequest(items=items), timeout=self.timeout)
        out = []
        for res in resp.results:
            ok = res.status == drafter_pb2.DRAFT_STATUS_OK
            out.append(DraftResult(res.request_id, tensors.token_ids(res.tokens, "tokens") if ok else [],
                                   res.probs if ok and res.HasField("probs") else None,
                                   resync=res.status == drafter_pb2.DRAFT_STATUS_RESYNC, error=res.error))
        return out

    async def release(self, ids: Sequence[str]) -> None:
        await self.stub.Release(common_pb2.ReleaseRequest(request_ids=list(ids)), timeout=self.timeout)


def slice_probs(p: common_pb2.DraftDistribution | None, start: int, n: int) -> common_pb2.DraftDistribution | None:
    """Rows [start, start + n) of a top-m draft distribution (the early draft's guess is row 0)."""
    if p is None:
        return None
    ids = tensors.to_torch(p.ids, "ids", ndim=2)[start:start + n]
    probs = tensors.to_torch(p.probs, "probs", ndim=2)[start:start + n]
    return common_pb2.DraftDistribution(ids=tensors.encode(ids), probs=tensors.encode(probs.to(torch.float32)))
