"""Prompt chunks (prefills) through captured graphs: up to 8 sequences' chunks packed into one replay.

Eagerly, a prefill is ~900 launches from Python: on an H100 a 64- to 1,024-token prompt of
SmolLM2-135M took ~30 ms of host time for 2-5 ms of kernels, and that is the time to first token.
Here the chunks of a bucket's ``rows`` sequences run side by side, each padded to the bucket's length:
a chunk of n tokens appended at position ``start`` takes a row of Q tokens, the smallest
``PREFILL_BUCKETS`` size >= the group's longest chunk (the n tokens and Q - n padding tokens after
them), through the static attention's torch path (gathered keys of its own row, a causal mask:
every real query sees exactly what it sees eagerly; the padding queries come after all of them, so
none sees a padding key; where every row is a whole prompt, from position 0, the bucket's context is
``OWN_KEYS``: each row attends causally to the keys it writes, with no gather and no mask, a third
less of a lone prompt's GPU time on an H200). Padding keys land past the sequence's length, in its
own last block or in the scratch block that pads its table, where the next tokens overwrite them; unused rows run wholly
in the scratch block. One replay costs about what a lone prompt's does (the kernels are small), so
a round of new prompts (a wave of arrivals at a served batch) pays once, not once per prompt (``pack`` cuts a round's
prompts into the replays that cost least: a long prompt does not pad many short ones to its length). Only
each row's last ``num_logits`` real tokens go through the LM head (row indices are an input buffer),
so the logits buffer stays small.

A feature-fed model (an EAGLE head catching up over a prompt) reads a feature row per token from
a buffer of the bucket (padding rows keep whatever rows they held, as the padding tokens' outputs
are never read). Buckets are (rows, Q, context, aux layers, feature size), rows x Q at most
``PREFILL_MAX_TOKENS``, captured into one pool: every whole prompt's up front
(``capture_prompts``, from the decoder's warm-up), a later chunk's on first use. The runner packs a
round's prompt chunks into groups (engine/runner.py). On a CPU they run eagerly (``capture=False``),
which is how they are tested.
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
PREFILL_ROWS = (1, 2, 4, 8)   # sequences one replay takes
PREFILL_MAX_TOKENS = 2048     # rows x padded length of a bucket (8 rows up to 256 tokens, 1 up to 2,048)
# What ``pack`` weighs a replay at, in padded tokens: a replay's fixed cost (its ~900 kernels' latency) over what one
# more padded token costs it (bench/prefill_buckets.py measures both)
REPLAY_TOKENS = 4096
OWN_KEYS = 0                  # a bucket's context when every row is a whole prompt: it attends to its own keys alone


@dataclass(frozen=True)
class PrefillRow:
    """One sequence's chunk in a replay."""

    seq_id: str
    tokens: Sequence[int]
    start: int                # its first position (the allocator already holds start + len(tokens))
    num_logits: int
    features: torch.Tensor | None = None  # [len(tokens), F] of a feature-fed model


@dataclass
class _PrefillBucket:
    attn: StaticAttention     # rows R, q_len Q, the torch path
    aux_layers: tuple[int, ...]
    input_ids: torch.Tensor   # [R*Q] long
    start: torch.Tensor       # [R] long: each chunk's first position (the rest follow in the graph)
    logit_rows: torch.Tensor  # [R*max_logits] long: which of the R*Q tokens go through the LM head
    logits: torch.Tensor | None = None  # [R*max_logits, vocab] float32
    hidden: torch.Tensor | None = None  # [R*max_logits, hidden]
    aux: torch.Tensor | None = None     # [R*Q, len(aux_layers) * hidden]
    features: torch.Tensor | None = None  # [R*Q, F] the inputs of a feature-fed model
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

    def group_for(self, rows: Sequence[tuple[int, int, int]], aux_layers: tuple[int, ...], features: int = 0
                  ) -> tuple[int, int, int, tuple[int, ...], int] | None:
        """(rows, Q, context, aux layers, features) of the bucket that takes these chunks together, each given as
        (start, n tokens, num_logits), or None (eager): a chunk too short or too long, more logits than the
        bucket keeps, more rows or tokens than a bucket holds, or padding that would pass the context."""
        if not rows or any(n < self.min_tokens or not 0 <= m <= self.max_logits for _, n, m in rows):
            return None
        return self._key(len(rows), max(n for _, n, _ in rows), max(start for start, _, _ in rows), aux_layers,
                         features)

    def _key(self, count: int, longest: int, last_start: int, aux_layers: tuple[int, ...], features: int
             ) -> tuple[int, int, int, tuple[int, ...], int] | None:
        """``group_for``'s bucket of ``count`` chunks (each valid alone), the longest of ``longest`` tokens, the last
        to start at ``last_start``."""
        q = next((b for b in PREFILL_BUCKETS if b >= longest), None)
        r = next((b for b in PREFILL_ROWS if b >= count), None)
        if q is None or r is None or r * q > PREFILL_MAX_TOKENS:
            return None
        last = last_start + q
        if last > self.max_context:
            return None
        if last == q:  # whole prompts: no key before their own
            return r, q, OWN_KEYS, aux_layers, features
        return r, q, next(c for c in self.context_buckets if c >= last), aux_layers, features

    def pack(self, rows: Sequence[tuple[int, int, int]], aux_layers: tuple[int, ...], features: int = 0
             ) -> list[tuple[tuple[int, int, int, tuple[int, ...], int], list[int]]]:
        """Chunks, each (start, n tokens, num_logits), packed into replays -> [(bucket key, the chunks' indices)];
        a chunk no bucket takes alone is in none. The chunks, by length, are cut into runs that one bucket each takes,
        the runs chosen to cost least: ``REPLAY_TOKENS`` a replay plus its bucket's rows x padded length (so a long
        prompt does not pad many short ones to its length, and short prompts share one replay)."""
        order = sorted((i for i, row in enumerate(rows) if self.group_for([row], aux_layers, features) is not None),
                       key=lambda i: rows[i][1])
        starts = [rows[i][0] for i in order]
        rows_bucket = [0] + [next((b for b in PREFILL_ROWS if b >= c), 0) for c in range(1, PREFILL_ROWS[-1] + 1)]
        best = [0]   # [j]: the least cost of the first j chunks (by length) packed
        cut = [0]    # [j]: where the last run of that packing starts
        for j in range(1, len(order) + 1):  # the last run is order[i:j]; its longest chunk is order[j - 1]
            q = next(b for b in PREFILL_BUCKETS if b >= rows[order[j - 1]][1])
            most = PREFILL_MAX_TOKENS // q  # rows a bucket of this length holds
            cost, at, last_start = -1, j - 1, 0
            for i in range(j - 1, -1, -1):  # a longer run (more rows, a later start) fits no better: break
                count = j - i
                last_start = max(last_start, starts[i])
                if count > PREFILL_ROWS[-1] or rows_bucket[count] > most or last_start + q > self.max_context:
                    break
                c = best[i] + REPLAY_TOKENS + rows_bucket[count] * q
                if cost < 0 or c < cost:
                    cost, at = c, i
            best.append(cost)
            cut.append(at)
        groups, j = [], len(order)
        while j > 0:
            i = cut[j]
            groups.append((self.group_for([rows[m] for m in order[i:j]], aux_layers, features), order[i:j]))
            j = i
        return groups[::-1]

    def bucket_for(self, start: int, n: int, num_logits: int, aux_layers: tuple[int, ...], features: int = 0
                   ) -> tuple[int, int, int, tuple[int, ...], int] | None:
        """The bucket of a lone chunk of n tokens at ``start`` (``group_for``)."""
        return self.group_for([(start, n, num_logits)], aux_layers, features)

    def run(self, key: tuple[int, int, int, tuple[int, ...], int], rows: Sequence[PrefillRow]
            ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """The chunks (``group_for``'s bucket ``key``) in one replay -> each row's (logits [num_logits, vocab]
        float32, hidden [num_logits, hidden], aux [n, aux] or None): views of the bucket's buffers (the next
        replay of the bucket overwrites them: copy out before that)."""
        b = self._buckets.get(key) or self._build(*key)
        r, q, m = key[0], key[1], self.max_logits
        alloc = self.runner.allocator
        b.attn.set_rows([alloc.block_table(row.seq_id) for row in rows], [row.start + q for row in rows])
        ids = torch.zeros(r, q, dtype=torch.long)  # padding tokens: id 0
        starts = torch.zeros(r, dtype=torch.long)
        picks = torch.arange(r)[:, None] * q + torch.zeros(r, m, dtype=torch.long)  # a padding row: its first
        for i, row in enumerate(rows):
            n = len(row.tokens)
            ids[i, :n] = torch.as_tensor(row.tokens, dtype=torch.long)
            starts[i] = row.start
            # the last num_logits real tokens (none wanted, a chunk of a prompt: one, unread), padded with the last
            first = n - max(row.num_logits, 1)
            picks[i] = i * q + torch.arange(first, first + m).clamp(max=n - 1)
            if b.features is not None:  # padding rows keep earlier rows: they only write past the sequence
                b.features[i * q:i * q + n].copy_(row.features)
        b.input_ids.copy_(ids.view(-1), non_blocking=True)
        b.start.copy_(starts, non_blocking=True)
        b.logit_rows.copy_(picks.view(-1), non_blocking=True)
        if b.graph is not None:
            b.graph.replay()
        else:
            with torch.inference_mode():
                self._forward(b)
        return [(b.logits[i * m:i * m + row.num_logits], b.hidden[i * m:i * m + row.num_logits],
                 None if b.aux is None else b.aux[i * q:i * q + len(row.tokens)]) for i, row in enumerate(rows)]

    def _compute(self, b: _PrefillBucket) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        model = self.runner.model
        b.attn.prepare()
        q = b.attn.q_len
        positions = (b.start[:, None] + self._arange[None, :q]).reshape(-1)
        hidden, aux = forward(model, b.input_ids, positions, b.attn, b.aux_layers, b.features)
        hidden = hidden[b.logit_rows]
        return model.compute_logits(hidden), hidden, aux

    def _forward(self, b: _PrefillBucket) -> None:
        keep_outputs(b, *self._compute(b))

    def _build(self, rows: int, q: int, ctx: int, aux_layers: tuple[int, ...], features: int) -> _PrefillBucket:
        r = self.runner
        dev = r.device
        own = ctx == OWN_KEYS  # its rows' tables need only the blocks their q tokens take
        blocks = -(-(q if own else ctx) // r.cache.block_size)
        attn = StaticAttention(r.cache, r.model.config.num_heads, rows, q, blocks, self.scratch_block,
                               use_kernel=False, own_keys=own)
        b = _PrefillBucket(attn, aux_layers, torch.zeros(rows * q, dtype=torch.long, device=dev),
                           torch.zeros(rows, dtype=torch.long, device=dev),
                           torch.zeros(rows * self.max_logits, dtype=torch.long, device=dev),
                           features=feature_buffer(r.model, rows * q, features, dev))
        if self.capture:  # uncaptured, the bucket's first real run allocates its outputs (keep_outputs)
            with torch.inference_mode():
                self._forward(b)  # allocates the outputs (the padding row set writes only the scratch block)
            def record() -> None:
                b.logits, b.hidden, b.aux = self._compute(b)

            b.graph = capture(record, lambda: self._forward(b), self._pool, dev)
        self._buckets[(rows, q, ctx, aux_layers, features)] = b
        return b

    def capture_prompts(self, aux_layers: tuple[int, ...] = (), features: int = 0) -> int:
        """Build now the bucket of every whole prompt (chunks at position 0; ``features``: of a feature-fed
        model), every length and every number of rows, so that no request waits for a capture (~0.1 s each
        on an H100); returns how many buckets there are. Chunks of a longer prompt (a round budget) start
        further in and are still captured on first use."""
        for q in reversed(PREFILL_BUCKETS):  # the largest first: the pool is sized once
            for rows in reversed(PREFILL_ROWS):
                key = self.group_for([(0, q, 1)] * rows, aux_layers, features)
                if key is not None and key not in self._buckets:
                    self._build(*key)
        return len(self._buckets)

    def capture_chunks(self, max_rows: int, contexts: int = 2, aux_layers: tuple[int, ...] = (), features: int = 0
                       ) -> int:
        """Build now the buckets of short chunks further into a sequence, for 1 .. ``max_rows`` rows within the
        first ``contexts`` context buckets: what a drafter's catch-up over a round's committed tokens (2 .. k + 1
        of them, one logit; a single token is a uniform step) takes, round after round, so that no round waits for
        a capture. Returns how many it built."""
        q, built = PREFILL_BUCKETS[0], 0
        for ctx in self.context_buckets[:contexts]:
            for rows in (r for r in PREFILL_ROWS if r <= max_rows):
                key = self.group_for([(ctx - q, self.min_tokens, 1)] * rows, aux_layers, features)
                if key is not None and key not in self._buckets:
                    self._build(*key)
                    built += 1
        return built

    @property
    def num_captured(self) -> int:
        return sum(b.graph is not None for b in self._buckets.values())
