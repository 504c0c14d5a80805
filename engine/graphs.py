"""Uniform forward steps through CUDA graphs: one captured forward per bucket.

A *uniform step* is a forward in which every sequence appends the same number of tokens
``q_len`` and wants the logits of all of them: a plain decode step (q_len 1) or the target's
verify of k drafts (q_len k + 1), optionally with the target's aux features (EAGLE), or a
draft step of a feature-fed model (an EAGLE head: each token comes with a feature row). It is
the same kernels every time; only the inputs change. A bucket is (rows, q_len, context,
aux layers, feature size); it owns persistent input buffers (token ids, positions, features,
the ``StaticAttention`` layout) and output buffers (final hidden states, float32 logits, aux
features). A step copies
its inputs into the smallest bucket that holds it, replays the graph and reads the first rows
of the outputs: one launch instead of hundreds, no Python per layer. Buckets are captured
lazily on first use, or by ``capture_all``; they share one memory pool. Multi-token buckets
stop at ``MAX_GRAPH_TOKENS`` rows * q_len (their logits buffers grow with it; larger verify
batches are less launch-bound and run eagerly).

On a CPU the same buckets run eagerly (``capture=False``): the static path is then testable
where no GPU is, against the paged backends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from engine.attention.base import AttentionMetadata
from engine.attention.static import StaticAttention

if TYPE_CHECKING:
    from engine.runner import ModelRunner

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTEXT_BUCKETS = (512, 2048, 8192, 32768)  # tokens a row may hold; capped by the engine's max context
MAX_GRAPH_TOKENS = 512  # rows * q_len of the largest multi-token (verify) bucket
PAD_SEQ = "__tandem_graph_pad__"  # the allocator sequence owning the scratch block padding rows write to
_captured = [0]  # CUDA graphs this process has captured (``captured``)


@dataclass
class _Bucket:
    attn: StaticAttention
    aux_layers: tuple[int, ...]
    input_ids: torch.Tensor   # [B*Q] long
    positions: torch.Tensor   # [B*Q] long
    hidden: torch.Tensor | None = None  # [B*Q, hidden] after the final norm
    logits: torch.Tensor | None = None  # [B*Q, vocab] float32
    aux: torch.Tensor | None = None     # [B*Q, len(aux_layers) * hidden] when aux_layers
    features: torch.Tensor | None = None  # [B*Q, F] the inputs of a feature-fed model
    graph: "torch.cuda.CUDAGraph | None" = None


def forward(model, input_ids: torch.Tensor, positions: torch.Tensor, attn, aux_layers: tuple[int, ...],
            features: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward -> (hidden [T, hidden], aux or None): a feature-fed model (an EAGLE head) takes a feature row
    per token and returns no aux; any other model returns the aux layers asked for."""
    if features is not None:
        return model(input_ids, positions, attn, features), None
    if aux_layers:
        return model.forward_aux(input_ids, positions, attn, aux_layers)
    return model(input_ids, positions, attn), None


def feature_buffer(model, tokens: int, features: int, device: torch.device) -> torch.Tensor | None:
    """A bucket's persistent feature input [tokens, features] in the model's dtype, or None (features 0)."""
    if not features:
        return None
    return torch.zeros(tokens, features, dtype=next(model.parameters()).dtype, device=device)


def capture(record: Callable[[], None], warm_up: Callable[[], None], pool, device: torch.device
            ) -> "torch.cuda.CUDAGraph":
    """One CUDA graph of what ``record`` launches (it assigns its outputs to persistent places),
    after ``warm_up`` ran twice on a side stream (kernels compiled, allocator warm), into ``pool``."""
    with torch.inference_mode():
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                warm_up()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            record()
    _captured[0] += 1
    return graph


def captured() -> int:
    """How many CUDA graphs this process has captured so far, by every store (a bench counts those of its timed
    passes: a graph captured there is a warm-up that missed a shape)."""
    return _captured[0]


def keep_outputs(bucket, logits: torch.Tensor, hidden: torch.Tensor, aux: torch.Tensor | None) -> None:
    """An uncaptured run of a bucket: its first outputs become its buffers, later ones are copied into them."""
    if bucket.hidden is None:
        bucket.logits, bucket.hidden, bucket.aux = logits, hidden, aux
    else:
        bucket.logits.copy_(logits)
        bucket.hidden.copy_(hidden)
        if aux is not None:
            bucket.aux.copy_(aux)


class StepGraphs:
    def __init__(self, runner: "ModelRunner", max_batch: int, max_context: int, max_q_len: int,
                 capture: bool) -> None:
        self.runner = runner
        self.capture = capture
        self.max_q_len = max_q_len
        self.batch_buckets = tuple(b for b in BATCH_BUCKETS if b < max_batch) + (max_batch,)
        self.context_buckets = tuple(c for c in CONTEXT_BUCKETS if c < max_context) + (max_context,)
        alloc = runner.allocator
        alloc.extend(PAD_SEQ, 1)
        self.scratch_block = alloc.block_table(PAD_SEQ)[0]
        self._buckets: dict[tuple[int, int, int, tuple[int, ...], int], _Bucket] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None

    def bucket_for(self, meta: AttentionMetadata, aux_layers: tuple[int, ...] = (), features: int = 0
                   ) -> tuple[int, int, int, tuple[int, ...], int] | None:
        """(rows, q_len, context, aux_layers, features) of the smallest bucket holding this uniform step, or None
        (``features``: the width of the feature rows a feature-fed model reads, 0 for none)."""
        q_len = meta.q_lens[0]
        if any(q != q_len for q in meta.q_lens) or q_len > self.max_q_len:
            return None
        n, longest = len(meta.q_lens), max(meta.kv_lens)
        rows = next((b for b in self.batch_buckets if b >= n), None)
        ctx = next((c for c in self.context_buckets if c >= longest), None)
        if rows is None or ctx is None or (q_len > 1 and rows * q_len > MAX_GRAPH_TOKENS):
            return None
        return rows, q_len, ctx, tuple(aux_layers), features

    def run(self, key: tuple[int, int, int, tuple[int, ...], int], meta: AttentionMetadata,
            input_ids: torch.Tensor, positions: torch.Tensor, features: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One uniform step of T = n * q_len tokens in bucket ``key`` (from ``bucket_for``): input_ids,
        positions [T] (features [T, F] for a feature-fed model) -> (logits [T, vocab] float32, hidden
        [T, hidden], aux [T, aux] or None): views of the bucket's buffers."""
        bucket = self._buckets.get(key) or self._build(*key)
        t = input_ids.shape[0]
        bucket.attn.load(meta)
        bucket.input_ids[:t].copy_(input_ids)
        bucket.input_ids[t:].zero_()
        bucket.positions[:t].copy_(positions)
        bucket.positions[t:].zero_()
        if bucket.features is not None:  # padding rows keep whatever rows they held: they only write scratch
            bucket.features[:t].copy_(features)
        if bucket.graph is not None:
            bucket.graph.replay()
        else:
            self._forward(bucket)
        return bucket.logits[:t], bucket.hidden[:t], None if bucket.aux is None else bucket.aux[:t]

    def capture_all(self, q_lens: tuple[int, ...] = (1,), aux_layers: tuple[int, ...] = (), features: int = 0,
                    max_rows: int | None = None) -> int:
        """Build the buckets of these q_lens now (largest first, so the pool is sized once), those returning
        ``aux_layers`` / reading ``features`` wide feature rows, of at most ``max_rows`` rows (the bucket holding
        that many; None: every bucket); returns how many it built (buckets already there are kept)."""
        top = next((b for b in self.batch_buckets if max_rows is not None and b >= max_rows), self.batch_buckets[-1])
        before = len(self._buckets)
        for q_len in q_lens:
            for rows in reversed([b for b in self.batch_buckets if b <= top]):
                if q_len > 1 and rows * q_len > MAX_GRAPH_TOKENS:
                    continue
                for ctx in reversed(self.context_buckets):
                    if (rows, q_len, ctx, aux_layers, features) not in self._buckets:
                        self._build(rows, q_len, ctx, aux_layers, features)
        return len(self._buckets) - before

    def _compute(self, bucket: _Bucket) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        model = self.runner.model
        bucket.attn.prepare()
        hidden, aux = forward(model, bucket.input_ids, bucket.positions, bucket.attn, bucket.aux_layers,
                              bucket.features)
        return model.compute_logits(hidden), hidden, aux

    def _forward(self, bucket: _Bucket) -> None:
        keep_outputs(bucket, *self._compute(bucket))

    def _build(self, rows: int, q_len: int, ctx: int, aux_layers: tuple[int, ...], features: int) -> _Bucket:
        r = self.runner
        dev = r.device
        blocks = -(-ctx // r.cache.block_size)
        attn = StaticAttention(r.cache, r.model.config.num_heads, rows, q_len, blocks, self.scratch_block)
        t = rows * q_len
        bucket = _Bucket(attn, aux_layers, torch.zeros(t, dtype=torch.long, device=dev),
                         torch.zeros(t, dtype=torch.long, device=dev),
                         features=feature_buffer(r.model, t, features, dev))
        if self.capture:  # uncaptured, the bucket's first real run allocates its outputs (keep_outputs)
            def record() -> None:
                bucket.logits, bucket.hidden, bucket.aux = self._compute(bucket)

            bucket.graph = capture(record, lambda: self._forward(bucket), self._pool, dev)
        self._buckets[(rows, q_len, ctx, aux_layers, features)] = bucket
        return bucket

    @property
    def num_captured(self) -> int:
        return sum(b.graph is not None for b in self._buckets.values())
