"""A decoder layer's projection weights pulled into L2 while the layer before it runs.

At decode sizes every projection reads its weights once per forward, from DRAM: a model's layers do not fit in
L2 together (SmolLM2-135M: ~213 MB of bf16 layer weights against the H100's 50 MB), but one layer's do (~7 MB).
``LayerPrefetch`` is called as a forward enters each layer: on a stream of its own it queues
``kernels.l2_prefetch`` of the next layer's four projection weights (layer 0's too when the forward starts),
after the work already queued on the forward's stream, which never waits on it; ``join`` (the forward's end)
makes the forward's stream wait for it, so a captured graph forks and joins inside its own capture. It
changes no value anywhere: a forward computes the same with or without it. CUDA inference only.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

PROGRAMS = 8  # programs per weight tensor: bench/prefetch_probe.py (H100) found 8 and 32 alike, 8 leaves more SMs


class LayerPrefetch:
    def __init__(self, layers: Sequence[nn.Module], device: torch.device) -> None:
        self.weights = [(layer.self_attn.qkv_proj.weight, layer.self_attn.o_proj.weight,
                         layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight) for layer in layers]
        self.stream = torch.cuda.Stream(device)

    def enter(self, layer: int) -> None:
        """The forward is about to run ``layer``: fetch the next one's weights beside it."""
        from kernels.l2_prefetch import l2_prefetch

        fetch = [layer + 1] if layer else [0, 1]
        fetch = [i for i in fetch if i < len(self.weights)]
        if not fetch:
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            for i in fetch:
                l2_prefetch(self.weights[i], PROGRAMS)

    def join(self) -> None:
        torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
