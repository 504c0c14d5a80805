"""The EAGLE head's part of a fused round (engine/drafters/graph_program.py holds the loop).

Layout (as ``EagleDrafter`` keeps it, base 1): head entry p (token x_p, feature f_{p-1}) lives at
KV index p - 1, which is also its rotary position. The catch-up's entries L + 1 .. L + k + 1 read the
features f_L .. f_{L+k} of the round's verify (the target's aux layers, fused by the head); a draft
step reads the head's own previous output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.attention.static import StaticAttention
from engine.drafters.graph_program import GraphDraftProgram

if TYPE_CHECKING:
    from engine.drafters.eagle import EagleDrafter


class EagleProgram(GraphDraftProgram):
    first_position = 1

    def __init__(self, drafter: "EagleDrafter", rows: int, k: int, max_blocks: int, sampled: bool = False,
                 tree=None) -> None:
        super().__init__(drafter.runner, drafter.sampler, rows, k, max_blocks, sampled, tree)
        self.head = drafter.head

    def catch_up_extra(self, aux: torch.Tensor | None) -> torch.Tensor:
        return self.head.fuse_features(aux)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attn: StaticAttention,
                extra: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(tokens, positions, attn, extra, keep)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head.lm_logits(hidden)
