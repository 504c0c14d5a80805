"""Attention backends for whole padded batches (training and corpus generation), not serving.

The models see flat ``[T]`` tokens; these backends view them as ``[B, S]``:
- ``CausalAttention``: one causal pass over right-padded rows, no cache (teacher forcing).
- ``CachedAttention``: left-padded rows with a dense KV cache, for batched generation.
- ``UnrolledAttention``: the EAGLE head's training-time unroll. At unroll step j the query of
  entry p sees the step-0 keys of entries <= p - j, then the key of step i at entry p - j + i
  for i = 1..j: exactly the KV the head has when it drafts its (j+1)-th token at serving time.
"""

from __future__ import annotations

import torch

from engine.attention.sdpa import attend


def _heads(x: torch.Tensor, b: int) -> torch.Tensor:
    """[B*S, H, D] -> [B, H, S, D]."""
    return x.view(b, -1, *x.shape[1:]).transpose(1, 2)


def _flat(o: torch.Tensor) -> torch.Tensor:
    """[B, H, S, D] -> [B*S, H, D]."""
    return o.transpose(1, 2).reshape(-1, *o.shape[1:2], o.shape[-1])


class CausalAttention:
    name = "dense-causal"
    fused_rotary = False

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b = self.batch
        o = attend(_heads(q, b), _heads(k, b), _heads(v, b), is_causal=True)
        return _flat(o)


class CachedAttention:
    """Dense KV cache ``[layers, B, S_max, Hkv, D]``; row b's real tokens start at ``pad[b]``."""

    name = "dense-cached"
    fused_rotary = False

    def __init__(self, layers: int, batch: int, max_len: int, kv_heads: int, head_dim: int, pad: torch.Tensor,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.k = torch.zeros(layers, batch, max_len, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.pad = pad.to(device)  # [B]
        self.batch = batch
        self.start = 0
        self.q_len = 0
        self.mask: torch.Tensor | None = None

    def step(self, q_len: int) -> None:
        """The next forward appends q_len tokens per row at columns start .. start + q_len."""
        self.start += self.q_len
        self.q_len = q_len
        s0, n, dev = self.start, q_len, self.k.device
        col = torch.arange(s0 + n, device=dev)
        row = torch.arange(s0, s0 + n, device=dev)
        mask = (col[None, None, :] <= row[None, :, None]) & (col[None, None, :] >= self.pad[:, None, None])
        mask |= col[None, None, :] == row[None, :, None]  # padding rows see themselves: no NaN in the cache
        self.mask = mask[:, None]  # [B, 1, n, S]: built once per forward, shared by every layer

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, s0, n = self.batch, self.start, self.q_len
        self.k[layer, :, s0:s0 + n] = k.view(b, n, *k.shape[1:])
        self.v[layer, :, s0:s0 + n] = v.view(b, n, *v.shape[1:])
        keys = self.k[layer, :, : s0 + n].transpose(1, 2)       # [B, Hkv, S, D]
        values = self.v[layer, :, : s0 + n].transpose(1, 2)
        o = attend(_heads(q, b), keys, values, self.mask)
        return _flat(o)


class UnrolledAttention:
    """For unroll step j, after steps 0..j-1 ran through the same object (one layer, layer 0)."""

    name = "dense-unrolled"
    fused_rotary = False

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.keys: list[torch.Tensor] = []    # per step: [B, H, S, D] (GQA-expanded)
        self.values: list[torch.Tensor] = []

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b = self.batch
        q, k, v = _heads(q, b), _heads(k, b), _heads(v, b)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        self.keys.append(k)
        self.values.append(v)
        j = len(self.keys) - 1
        s = q.shape[2]
        scale = q.shape[-1] ** -0.5
        base = (q @ self.keys[0].transpose(-1, -2)) * scale                          # [B, H, S, S]
        col = torch.arange(s, device=q.device)
        base = base.masked_fill(col[None, :] > (col[:, None] - j), float("-inf"))
        # step i's key sits at entry p - (j - i): shift it down by j - i rows
        extra = [(q * _shift(self.keys[i], j - i)).sum(-1, keepdim=True) * scale for i in range(1, j + 1)]
        scores = torch.cat([base, *extra], dim=-1).float().softmax(dim=-1).to(q.dtype)
        out = scores[..., :s] @ self.values[0]
        for n, i in enumerate(range(1, j + 1)):
            out = out + scores[..., s + n: s + n + 1] * _shift(self.values[i], j - i)
        # rows p < j see no step-0 key, only the extras (finite); the loss masks them out
        return _flat(out)


def _shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """[B, H, S, D] -> rows moved down by n (row p holds row p - n; the first n rows are zero)."""
    if n == 0:
        return x
    return torch.cat([torch.zeros_like(x[:, :, :n]), x[:, :, :-n]], dim=2)
