"""Proto <-> engine dataclass conversions shared by the services, validated with field names."""

from __future__ import annotations

from typing import Sequence

import torch

from engine.config import SamplingParams
from engine.request import FinishReason
from protos.tandem.v1 import common_pb2
from rpc import tensors

DEFAULT_MAX_TOKENS = 256

_FINISH_TO_PB = {None: common_pb2.FINISH_REASON_UNSPECIFIED, FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
                 FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH, FinishReason.ABORT: common_pb2.FINISH_REASON_ABORT}
_FINISH_FROM_PB = {v: k for k, v in _FINISH_TO_PB.items()}


def finish_to_pb(reason: FinishReason | None) -> int:
    return _FINISH_TO_PB[reason]


def finish_from_pb(value: int) -> FinishReason | None:
    return _FINISH_FROM_PB[value]


def sampling_from_pb(pb: common_pb2.SamplingParams, prefix: str = "sampling.") -> SamplingParams:
    """Proto -> SamplingParams; ValueError names the field (e.g. ``sampling.top_p: ...``)."""
    values = dict(
        temperature=pb.temperature if pb.HasField("temperature") else 0.0,
        top_p=pb.top_p if pb.HasField("top_p") else 1.0,
        top_k=pb.top_k if pb.HasField("top_k") else 0,
        seed=pb.seed if pb.HasField("seed") else None,
        max_tokens=pb.max_tokens if pb.HasField("max_tokens") else DEFAULT_MAX_TOKENS,
        stop=tuple(pb.stop),
        ignore_eos=pb.ignore_eos,
        k=pb.k if pb.HasField("k") else None,
    )
    try:
        return SamplingParams(**values)
    except ValueError as exc:
        raise ValueError(f"{prefix}{exc}") from None


def sampling_to_pb(p: SamplingParams) -> common_pb2.SamplingParams:
    pb = common_pb2.SamplingParams(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, max_tokens=p.max_tokens,
                                   stop=list(p.stop), ignore_eos=p.ignore_eos)
    if p.seed is not None:
        pb.seed = p.seed
    if p.k is not None:
        pb.k = p.k
    return pb


def draft_probs_to_pb(q: torch.Tensor, m: int) -> common_pb2.DraftDistribution:
    """q [n, V] (at most m non-zeros per row when the drafter samples top-m) -> top-m ids/probs."""
    values, ids = q.float().topk(min(m, q.shape[-1]), dim=-1)
    return common_pb2.DraftDistribution(ids=tensors.encode(ids, "int32"), probs=tensors.encode(values, "float32"))


def draft_probs_from_pb(pb: common_pb2.DraftDistribution, drafts: Sequence[int], vocab: int,
                        field: str = "draft_probs") -> torch.Tensor:
    """top-m ids/probs -> dense q [n, V]; checks the shape, the ids, and that every draft has q > 0."""
    ids = tensors.to_torch(pb.ids, f"{field}.ids", ("int32", "int64"), ndim=2).long()
    probs = tensors.to_torch(pb.probs, f"{field}.probs", ("float32",), ndim=2)
    n = len(drafts)
    if ids.shape != probs.shape or ids.shape[0] != n:
        raise ValueError(f"{field}: ids {list(ids.shape)} and probs {list(probs.shape)} must both be [{n}, m]")
    if n and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"{field}.ids: token ids must be in [0, {vocab})")
    if n and (not torch.isfinite(probs).all() or probs.min() < 0 or (probs.sum(-1) - 1).abs().max() > 1e-3):
        raise ValueError(f"{field}.probs: each row must be a distribution (non-negative, summing to 1)")
    q = torch.zeros(n, vocab).scatter_(-1, ids, probs)
    if n and (q[torch.arange(n), torch.tensor(list(drafts), dtype=torch.long)] <= 0).any():
        raise ValueError(f"{field}: a draft token has no probability under its own distribution")
    return q
