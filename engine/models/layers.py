"""Building blocks shared by the model files: norm, rotary embedding, fused projections.

Token-major layout throughout: activations are ``[T, ...]`` with the tokens of every
sequence in the batch packed one after another (no padding).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from engine.config import RopeScaling
from engine.models import ops
from engine.models.meta import on_meta


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, dim]
        return ops.rms_norm(x, self.weight, self.eps)

    def add(self, x: torch.Tensor, delta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x, delta: [T, dim] -> (x + delta, its norm), one fused step; delta None: (x, norm of x)."""
        if delta is None:
            return x, self(x)
        return ops.add_rms_norm(x, delta, self.weight, self.eps)


def inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """The rotary frequencies [head_dim / 2] in float32, scaled as ``scaling`` says."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling.kind == "linear":
        return inv / scaling.factor
    if scaling.kind == "llama3":
        low_wavelen = scaling.original_max_position / scaling.low_freq_factor
        high_wavelen = scaling.original_max_position / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / scaling.factor, inv)
        smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor)
        smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv


class RotaryEmbedding(nn.Module):
    """Rotary position embedding in Hugging Face's rotate-half layout, cos/sin in float32."""

    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: RopeScaling) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_position = max_position
        self.theta = theta
        self.scaling = scaling
        self.freq_factors: torch.Tensor | None = None  # a llama3 GGUF's rope_freqs (float32, cpu), when loaded
        # built on meta (engine/models/meta.py) the table is rebuilt once the model has memory: none to compute here
        table = torch.empty(max_position, head_dim) if on_meta() else self._table(None)
        self.register_buffer("cos_sin", table, persistent=False)

    def rebuild(self, freq_factors: torch.Tensor | None = None) -> None:
        """Recompute the float32 cos/sin table (after moving the model; ``freq_factors``: llama3 GGUFs)."""
        self.freq_factors = None if freq_factors is None else freq_factors.float().cpu()
        self.cos_sin = self._table(self.freq_factors).to(self.cos_sin.device)

    def _table(self, freq_factors: torch.Tensor | None) -> torch.Tensor:
        inv = inv_freq(self.head_dim, self.theta, self.scaling)
        if freq_factors is not None:  # llama3 GGUFs carry the scaling as per-frequency factors
            inv = inv / freq_factors
        freqs = torch.outer(torch.arange(self.max_position, dtype=torch.float32), inv)
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1)  # [max_position, head_dim]

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] -> (cos, sin), each [T, 1, D/2] float32: looked up once per forward, shared by every layer."""
        cos, sin = self.cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)
        return cos, sin


def apply_rotary(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x: [T, H, D] (queries and keys side by side: one pass for both) rotated by ``rope`` from ``lookup``."""
    return _rotate(x, *rope)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ops.silu_mul(self.gate_up_proj(x)))
