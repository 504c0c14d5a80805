"""``tandem.v1.Tensor`` <-> numpy / torch, validated: a malformed tensor is a ValueError naming its field."""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING

import numpy as np

from protos.tandem.v1 import common_pb2

if TYPE_CHECKING:
    import torch

# torch is imported where a torch tensor is made, not here: a gRPC client that sends token lists (bench-serve's load
# processes) never loads it (seconds of CPU on a GPU machine, inside the load's timed region when it came lazily)
_NUMPY = {"int32": np.int32, "int64": np.int64, "float32": np.float32, "float16": np.float16, "uint8": np.uint8}
_TORCH_NAMES = ("int32", "int64", "float32", "float16", "bfloat16", "uint8")  # each the name of a torch dtype
_ITEMSIZE = {"int32": 4, "int64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1}


def encode(value, dtype: str | None = None) -> common_pb2.Tensor:
    """A list, numpy array or torch tensor -> Tensor (bfloat16 only from torch)."""
    torch = sys.modules.get("torch")  # not imported: value cannot be a torch tensor
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        if dtype is not None:
            t = t.to(getattr(torch, dtype))
        name = str(t.dtype).removeprefix("torch.")
        if name not in _TORCH_NAMES:
            raise ValueError(f"tensor dtype {name} cannot cross the wire")
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return common_pb2.Tensor(dtype=name, shape=list(t.shape), data=data)
    arr = np.ascontiguousarray(np.asarray(value, dtype=_NUMPY[dtype] if dtype else None))
    name = arr.dtype.name
    if name not in _NUMPY:
        raise ValueError(f"tensor dtype {name} cannot cross the wire")
    return common_pb2.Tensor(dtype=name, shape=list(arr.shape), data=arr.astype(arr.dtype.newbyteorder("<")).tobytes())


def _check(t: common_pb2.Tensor, field: str, allowed: tuple[str, ...], ndim: int | None) -> int:
    if t.dtype not in allowed:
        raise ValueError(f"{field}: dtype {t.dtype!r} is not one of {', '.join(allowed)}")
    if ndim is not None and len(t.shape) != ndim:
        raise ValueError(f"{field}: expected {ndim} dimensions, got shape {list(t.shape)}")
    if any(d < 0 for d in t.shape):
        raise ValueError(f"{field}: negative dimension in shape {list(t.shape)}")
    n = math.prod(int(d) for d in t.shape)  # Python ints: a shape like [2**32, 2**32] cannot overflow
    if len(t.data) != n * _ITEMSIZE[t.dtype]:
        raise ValueError(f"{field}: {len(t.data)} bytes do not hold shape {list(t.shape)} of {t.dtype}")
    return n


def to_numpy(t: common_pb2.Tensor, field: str, allowed: tuple[str, ...] = tuple(_NUMPY),
             ndim: int | None = None) -> np.ndarray:
    _check(t, field, tuple(a for a in allowed if a in _NUMPY), ndim)
    return np.frombuffer(t.data, dtype=np.dtype(_NUMPY[t.dtype]).newbyteorder("<")).reshape(tuple(t.shape))


def to_torch(t: common_pb2.Tensor, field: str, allowed: tuple[str, ...] = _TORCH_NAMES,
             ndim: int | None = None, device: str | torch.device = "cpu") -> torch.Tensor:
    import torch

    _check(t, field, allowed, ndim)
    raw = torch.frombuffer(bytearray(t.data), dtype=torch.uint8) if t.data else torch.empty(0, dtype=torch.uint8)
    return raw.view(getattr(torch, t.dtype)).reshape(tuple(t.shape)).to(device)


def token_ids(t: common_pb2.Tensor, field: str) -> list[int]:
    """A 1-D int32/int64 tensor of token ids -> list (an unset Tensor is empty)."""
    if not t.dtype and not t.shape and not t.data:
        return []
    return to_numpy(t, field, ("int32", "int64"), ndim=1).tolist()
