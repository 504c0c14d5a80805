"""Host values onto the device without waiting for the device.

``torch.tensor(values, device="cuda")`` copies synchronously: the copy waits for every launch queued on the
stream before it, a round launched ahead among them, so the host stops where it meant to queue more work and the
GPU then idles while the host catches up. ``upload`` builds the tensor in host memory and queues its copy
(``non_blocking``; the driver stages pageable memory before the call returns): the host goes on, the device reads
the values in stream order.
"""

from __future__ import annotations

from typing import Any

import torch


def upload(values: Any, device: torch.device | str, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype, device=device)`` without a stream sync."""
    t = torch.tensor(values, dtype=dtype)
    return t.to(device, non_blocking=True) if torch.device(device).type != "cpu" else t
