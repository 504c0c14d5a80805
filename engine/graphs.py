"""Plain decode through CUDA graphs: one captured forward per (batch, context) bucket.

A decode step (every sequence appends one token and wants its logits) is the same kernels
every time; only the inputs change. Each bucket owns persistent input buffers (token ids,
positions, the ``StaticAttention`` layout) and output buffers (final hidden states, float32
logits). A step copies its inputs into the smallest bucket that holds the batch, replays the
graph and reads the first rows of the outputs: one launch instead of hundreds, no Python per
layer. Buckets are captured lazily on first use, or all at once by ``capture_all``; they share
one memory pool.

On a CPU the same buckets run eagerly (``capture=False``): the static path is then testable
where no GPU is, against the paged backends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.attention.base import AttentionMetadata
from engine.attention.static import StaticAttention

if TYPE_CHECKING:
    from engine.runner import ModelRunner

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTEXT_BUCKETS = (512, 2048, 8192, 32768)  # tokens a row may hold; capped by the engine's max context
PAD_SEQ = "__tandem_graph_pad__"  # the allocator sequence owning the scratch block padding rows write to


@dataclass
class _Bucket:
    attn: StaticAttention
    input_ids: torch.Tensor   # [B] long
    positions: torch.Tensor   # [B] long
    hidden: torch.Tensor | None = None  # [B, hidden] after the final norm
    logits: torch.Tensor | None = None  # [B, vocab] float32
    graph: "torch.cuda.CUDAGraph | None" = None


class DecodeGraphs:
    def __init__(self, runner: "ModelRunner", max_batch: int, max_context: int, capture: bool) -> None:
        self.runner = runner
        self.capture = capture
        self.batch_buckets = tuple(b for b in BATCH_BUCKETS if b < max_batch) + (max_batch,)
        self.context_buckets = tuple(c for c in CONTEXT_BUCKETS if c < max_context) + (max_context,)
        alloc = runner.allocator
        alloc.extend(PAD_SEQ, 1)
        self.scratch_block = alloc.block_table(PAD_SEQ)[0]
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None

    def bucket_for(self, meta: AttentionMetadata) -> tuple[int, int] | None:
        """(rows, context) of the smallest bucket holding this decode step, or None."""
        if not meta.is_decode:
            return None
        n, longest = len(meta.q_lens), max(meta.kv_lens)
        rows = next((b for b in self.batch_buckets if b >= n), None)
        ctx = next((c for c in self.context_buckets if c >= longest), None)
        return None if rows is None or ctx is None else (rows, ctx)

    def run(self, meta: AttentionMetadata, input_ids: torch.Tensor, positions: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step: input_ids, positions [n] -> (logits [n, vocab] float32, hidden [n, hidden])."""
        key = self.bucket_for(meta)
        if key is None:
            raise ValueError("decode graphs: this step fits no bucket (bucket_for returned None)")
        bucket = self._buckets.get(key) or self._build(*key)
        n = len(meta.q_lens)
        bucket.attn.load(meta)
        bucket.input_ids[:n].copy_(input_ids)
        bucket.input_ids[n:].zero_()
        bucket.positions[:n].copy_(positions)
        bucket.positions[n:].zero_()
        if bucket.graph is not None:
            bucket.graph.replay()
        else:
            self._forward(bucket)
        return bucket.logits[:n], bucket.hidden[:n]

    def capture_all(self) -> int:
        """Build every bucket now (largest first, so the pool is sized once); returns how many."""
        for rows in reversed(self.batch_buckets):
            for ctx in reversed(self.context_buckets):
                if (rows, ctx) not in self._buckets:
                    self._build(rows, ctx)
        return len(self._buckets)

    def _forward(self, bucket: _Bucket) -> None:
        model = self.runner.model
        bucket.attn.prepare()
        hidden = model(bucket.input_ids, bucket.positions, bucket.attn)
        logits = model.compute_logits(hidden)
        if bucket.hidden is None:
            bucket.hidden, bucket.logits = hidden, logits
        else:
            bucket.hidden.copy_(hidden)
            bucket.logits.copy_(logits)

    def _build(self, rows: int, ctx: int) -> _Bucket:
        r = self.runner
        dev = r.device
        blocks = -(-ctx // r.cache.block_size)
        attn = StaticAttention(r.cache, r.model.config.num_heads, rows, 1, blocks, self.scratch_block)
        bucket = _Bucket(attn, torch.zeros(rows, dtype=torch.long, device=dev),
                         torch.zeros(rows, dtype=torch.long, device=dev))
        with torch.inference_mode():
            if not self.capture:
                self._forward(bucket)  # allocates the output buffers
            else:
                stream = torch.cuda.Stream(dev)
                stream.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(stream):
                    for _ in range(2):  # warm up kernels and the allocator outside the capture
                        self._forward(bucket)
                torch.cuda.current_stream(dev).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool):
                    model = r.model
                    attn.prepare()
                    bucket.hidden = model(bucket.input_ids, bucket.positions, attn)
                    bucket.logits = model.compute_logits(bucket.hidden)
                bucket.graph = graph
        self._buckets[(rows, ctx)] = bucket
        return bucket

    @property
    def num_captured(self) -> int:
        return sum(b.graph is not None for b in self._buckets.values())
