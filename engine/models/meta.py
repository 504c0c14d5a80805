"""A module built without its weights: shapes on the meta device, then memory for them on the real one.

``torch.nn.Module.to_empty`` (and ``.to`` on meta tensors) goes through torch's Python reference ops, whose first
use imports ``torch._dynamo`` and sympy: about 4 s of CPU in every process that loads a model. Here each parameter
and buffer is replaced by a plain ``torch.empty`` of its shape instead; a parameter shared by two modules stays
shared.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


def on_meta() -> bool:
    """Whether modules are being built under ``torch.device("meta")`` (``build_empty``): a value they would compute
    or initialise then needs none, and computing it there would import ``torch._dynamo``."""
    return torch.empty(0).device.type == "meta"


def build_empty(make: Callable[[], M], device: torch.device | str, dtype: torch.dtype) -> M:
    """``make()`` on the meta device, then every parameter and buffer allocated (unset) on ``device``: floating
    ones in ``dtype``, others (token ids, counters) in their own dtype."""
    with torch.device("meta"):
        module = make()
    made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(meta tensor) -> (it, kept alive; its memory)

    def empty(t: torch.Tensor) -> torch.Tensor:
        return torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype, device=device)

    for m in module.modules():
        for name, p in m._parameters.items():
            if p is not None:
                if id(p) not in made:
                    made[id(p)] = p, nn.Parameter(empty(p), requires_grad=p.requires_grad)
                m._parameters[name] = made[id(p)][1]
        for name, b in m._buffers.items():
            if b is not None:
                if id(b) not in made:
                    made[id(b)] = b, empty(b)
                m._buffers[name] = made[id(b)][1]
    return module
