"""Shared by the kernel wrappers: argument checks, the launch guard, a device-side helper."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# Padding of draft rows past a row's drafts. The engine uses the same value
# (engine.sampling.rejection.PLACEHOLDER_TOKEN_ID; tests/kernels checks they agree): kernels
# import nothing from engine, which depends on them, not the other way round.
PLACEHOLDER_TOKEN_ID = -1


def check_tensor(name: str, tensor: object, dtype: torch.dtype, shape: Sequence[int | None],
                 device: torch.device | None = None) -> torch.Tensor:
    """Raise ValueError naming ``name`` unless ``tensor`` has this dtype, shape and device.

    ``shape``: the expected sizes, None where any size is fine. Returns the tensor.
    """
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {tensor.dtype}")
    if tensor.dim() != len(shape) or any(want is not None and want != got for want, got in zip(shape, tensor.shape)):
        want = ", ".join("*" if s is None else str(s) for s in shape)
        raise ValueError(f"{name} must have shape [{want}], got {list(tensor.shape)}")
    if device is not None and tensor.device != device:
        raise ValueError(f"{name} must be on {device} like the other inputs, got {tensor.device}")
    return tensor


def check_int(name: str, value: object, minimum: int) -> int:
    """Raise ValueError naming ``name`` unless ``value`` is an int >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_launchable(kernel: object, device: torch.device) -> None:
    """Triton kernels run on CUDA, or anywhere under the interpreter; never fall back silently."""
    if device.type != "cuda" and not isinstance(kernel, InterpretedFunction):
        raise RuntimeError(
            f"Triton kernels need CUDA tensors, got tensors on {device}; to run them on the CPU set "
            "TRITON_INTERPRET=1 before kernels is imported (the torch references need neither)")


def pow2_at_least(n: int) -> int:
    """Smallest power of two >= max(n, 1): a block wide enough for n elements."""
    return triton.next_power_of_2(max(n, 1))


@triton.jit
def accepted_prefix(ok, cols, BLOCK: tl.constexpr):
    # ok: [BLOCK] bool per draft position, False past the drafts -> length of the all-True prefix
    return tl.min(tl.where(ok, BLOCK, cols), axis=0).to(tl.int64)
