"""``scaled_dot_product_attention`` for the torch paths, with cuDNN kept out.

torch on an H100 sends an SDPA call with an explicit mask to cuDNN first, and cuDNN builds a new
execution plan (tens to hundreds of ms) for every shape it has not seen. A serving engine sees a
new (query, key) length on almost every eager forward (a prompt, a drafter catching up), so that
made a one-sequence prefill take 73 ms instead of 40 and an EAGLE catch-up 14 times slower on the
H100. Flash, memory-efficient and math kernels need no plan. Grouped-query heads are expanded
here, so the memory-efficient kernel (which takes a mask but not ``enable_gqa``) stays eligible.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attend(q: torch.Tensor,            # [B, Hq, Q, D]
           k: torch.Tensor,            # [B, Hkv, S, D], Hkv divides Hq
           v: torch.Tensor,            # [B, Hkv, S, D]
           mask: torch.Tensor | None = None,  # [B or 1, 1, Q, S] bool: True where a query sees a key
           is_causal: bool = False) -> torch.Tensor:  # [B, Hq, Q, D]
    rep = q.shape[-3] // k.shape[-3]
    if rep > 1 and q.device.type == "cpu":  # the CPU kernel takes grouped heads as they are: copying them cost more
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True)
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    with sdpa_kernel(BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
