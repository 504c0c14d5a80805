"""A sequence's long chunk (a prompt's prefill) through a captured graph, padded to a bucket.

Eagerly, a prefill is ~900 launches from Python: on an H100 a 64- to 1,024-token prompt of
SmolLM2-135M took ~30 ms of host time for 2-5 ms of kernels, and that is the time to first token.
Here a chunk of n tokens appended at position ``start`` runs in the bucket of the smallest
``PREFILL_BUCKETS`` size Q >= n: the n tokens and Q - n padding tokens after them, through the
static attention's torch path (gathered keys, a causal mask: every real query sees exactly what
it sees eagerly; the padding queries come after all of them, so none sees a padding key). Padding
keys land past the sequence's length, in its own last block or in the scratch block that pads
its table, where the next tokens overwrite them. Only the last ``num_logits`` real rows go through
the LM head (row indices are an input buffer), so the logits buffer stays small.

A feature-fed model (an EAGLE head catching up over a prompt) reads a feature row per token from
a buffer of the bucket (padding rows keep whatever rows they held, as the padding tokens' outputs
are never read). Buckets are (Q, context, aux layers, feature
size), captured into one pool: every whole prompt's up front
(``capture_prompts``, from the decoder's warm-up), a later chunk's on first use. The runner sends up to
``MAX_GRAPH_PREFILLS`` prompts of a round here, one replay each. On a CPU they run eagerly
(``capture=False``), which is how they are tested.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from engine.attention.static import StaticAttention
from engine.graphs import CONTEXT_BUCKETS, capture, feature_buffer, forward, keep_outputs

if TYPE_CHECKING:
    from engine.runner import ModelRunner

PREFILL_BUCKETS = (32, 64, 128, 256, 512, 1024, 2048)  # padded chunk lengths; longer chunks run eagerly


@dataclass
class _PrefillBucket:
    attn: StaticAttention     # rows 1, q_len Q, the torch path
    aux_layers: tuple[int, ...]
    input_ids: torch.Tensor   # [Q] long
    start: torch.Tensor       # [1] long: the chunk's first position (the rest follow in the graph)
    logit_rows: torch.Tensor  # [max_logits] long: which rows go through the LM head
    logits: torch.Tensor | None = None  # [max_logits, vocab] float32
    hidden: torch.Tensor | None = None  # [max_logits, hidden]
    aux: torch.Tensor | None = None     # [Q, len(aux_layers) * hidden]
    features: torch.Tensor | None = None  # [Q, F] the inputs of a feature-fed model
    graph: "torch.cuda.CUDAGraph | None" = None


class PrefillGraphs:
    def __init__(self, runner: "ModelRunner", max_context: int, max_logits: int, min_tokens: int,
                 scratch_block: int, capture: bool) -> None:
        """min_tokens: shorter chunks are not prefills (the step graphs take them); max_logits: the most
        logits a chunk may want (1 + the longest draft)."""
        self.runner = runner
        self.max_context = min(max_context, runner.model.config.max_position)
        self.max_logits, self.min_tokens = max_logits, min_tokens
        self.scratch_block = scratch_block
        self.capture = capture
        self.context_buckets = tuple(c for c in CONTEXT_BUCKETS if c < self.max_context) + (self.max_context,)
        self._buckets: dict[tuple[int, int, tuple[int, ...], int], _PrefillBucket] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._arange = torch.arange(PREFILL_BUCKETS[-1], device=runner.device)  # positions past a chunk's start

    def bucket_for(self, start: int, n: int, num_logits: int, aux_layers: tuple[int, ...], features: int = 0
                   ) -> tuple[int, int, tuple[int, ...], int] | None:
        """(Q, context, aux layers, features) of the bucket for n tokens at ``start``, or None (eager): too
        short or too long, more logits than the bucket keeps, or padding that would pass the context."""
        if n < self.min_tokens or not 0 <= num_logits <= self.max_logits:
            return None
        q = next((b for b in PREFILL_BUCKETS if b >= n), None)
        if q is None or start + q > self.max_context:
            return None
        ctx = next(c for c in self.context_buckets if c >= start + q)
        return q, ctx, aux_layers, features

    def run(self, key: tuple[int, int, tuple[int, ...], int], seq_id: str, tokens: Sequence[int], start: int,
            num_logits: int, features: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The chunk (in the allocator up to start + n; ``features`` [n, F] for a feature-fed model) ->
        (logits [num_logits, vocab] float32, hidden [num_logits, hidden], aux [n, aux] or None): views of
        the bucket's buffers."""
        b = self._buckets.get(key) or self._build(*key)
        q, n = key[0], len(tokens)
        alloc = self.runner.allocator
        b.attn.set_rows([alloc.block_table(seq_id)], [start + q])
        ids = torch.zeros(q, dtype=torch.long)  # padding tokens: id 0
        ids[:n] = torch.as_tensor(tokens, dtype=torch.long)
        b.input_ids.copy_(ids, non_blocking=True)
        if b.features is not None:  # padding rows keep earlier rows: they only write past the sequence
            b.features[:n].copy_(features)
        b.start.fill_(start)
        # the last num_logits real rows (none wanted, a chunk of a prompt: one, unread), padded with the last
        first = n - max(num_logits, 1)
        b.logit_rows.copy_(torch.arange(first, first + self.max_logits).clamp(max=n - 1), non_blocking=True)
        if b.graph is not None:
            b.graph.replay()
        else:
            with torch.inference_mode():
                self._forward(b)
        return b.logits[:num_logits], b.hidden[:num_logits], None if b.aux is None else b.aux[:n]

    def _compute(self, b: _PrefillBucket) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        model = self.runner.model
        b.attn.prepare()
        positions = b.start + self._arange[: b.input_ids.shape[0]]
        hidden, aux = forward(model, b.input_ids, positions, b.attn, b.aux_layers, b.features)
        hidden = hidden[b.logit_rows]
        return model.compute_logits(hidden), hidden, aux

    def _forward(self, b: _PrefillBucket) -> None:
        keep_outputs(b, *self._compute(b))

    def _build(self, q: int, ctx: int, aux_layers: tuple[int, ...], features: int) -> _PrefillBucket:
        r = self.runner
        dev = r.device
        attn = StaticAttention(r.cache, r.model.config.num_heads, 1, q, -(-ctx // r.cache.block_size),
                               self.scratch_block, use_kernel=False)
        b = _PrefillBucket(attn, aux_layers, torch.zeros(q, dtype=torch.long, device=dev),
                           torch.zeros(1, dtype=torch.long, device=dev),
                           torch.zeros(self.max_logits, dtype=torch.long, device=dev),
                           features=feature_buffer(r.model, q, features, dev))
        with torch.inference_mode():
            self._forward(b)  # allocates the outputs (the padding row set writes only the scratch block)
        if self.capture:
            def record() -> None:
                b.logits, b.hidden, b.aux = self._compute(b)

            b.graph = capture(record, lambda: self._forward(b), self._pool, dev)
        self._buckets[(q, ctx, aux_layers, features)] = b
        return b

    def capture_prompts(self, aux_layers: tuple[int, ...] = (), features: int = 0) -> int:
        """Build now the bucket of every whole prompt (a chunk at position 0; ``features``: of a feature-fed
        model) of up to the largest length, so that no request waits for a capture (~0.1 s each on an
        H100); returns how many buckets there are. Chunks of a longer prompt (a round budget) start
        further in and are still captured on first use."""
        for q in reversed(PREFILL_BUCKETS):  # the largest first: the pool is sized once
            key = self.bucket_for(0, q, 1, aux_layers, features)
            if key is not None and key not in self._buckets:
                self._build(*key)
        return len(self._buckets)

    @property
    def num_captured(self) -> int:
        return sum(b.graph is not None for b in self._buckets.values())
