"""Map engine exceptions to gRPC status codes (the one place that knows both)."""

from __future__ import annotations

import grpc

from engine.kv_cache import KVCacheFull
from engine.spec import CapacityError


def code_for(exc: BaseException) -> grpc.StatusCode:
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, KeyError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, (CapacityError, KVCacheFull)):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.INTERNAL


def message_for(exc: BaseException) -> str:
    # KeyError's str() adds quotes around the message
    return exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
