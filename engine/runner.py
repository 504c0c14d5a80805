"""ModelRunner: one model, its paged KV cache and an attention backend.

The unit of work is a batch of ``Chunk``s: for each sequence, tokens appended after
everything already in its KV. The runner allocates KV slots, plans attention once, runs the
model and returns the logits of the last ``num_logits`` tokens of each chunk. Rolling back
rejected drafts is the caller's ``truncate()``. The target verifier and every model-based
drafter use this same class.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import torch

from engine.attention.base import AttentionMetadata, create_backend
from engine.config import EngineConfig
from engine.graphs import StepGraphs, forward
from engine.kv_cache import PagedKVCache, default_kv_tokens
from engine.models.llama import LlamaForCausalLM
from engine.prefill_graphs import PrefillGraphs, PrefillRow
from engine.upload import upload

# A round whose prompt chunks pack into at most this many prefill-graph replays (each up to 8 chunks,
# engine/prefill_graphs.py; ~4 ms a replay on an H100, mostly GPU) runs them there and the rest of the batch
# beside them; with more, one eager forward over all of them (~30 ms, mostly host, whatever the count) is cheaper.
MAX_GRAPH_PREFILLS = 8


@dataclass(frozen=True)
class Chunk:
    seq_id: str
    token_ids: Sequence[int]  # appended at positions [len(kv), len(kv) + len(token_ids))
    num_logits: int = 1       # logits wanted for the last num_logits of these tokens (0: KV only, a prefill chunk)


@dataclass(frozen=True)
class RunOutput:
    logits: torch.Tensor         # [sum(num_logits), vocab] float32, chunk order
    hidden: torch.Tensor         # [sum(num_logits), hidden] what the model returned for those rows
    aux: torch.Tensor | None     # [sum(len(tokens)), aux] every token's aux features, when asked for


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, config: EngineConfig) -> None:
        cfg = model.config
        self.model = model
        self.config = config
        self.device = torch.device(config.device)
        tokens = config.kv_cache_tokens or default_kv_tokens(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                                             config.torch_dtype, config.device)
        self.cache = PagedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, tokens, config.kv_block_size,
                                  config.torch_dtype, self.device)
        self.attention = create_backend(config.attention_backend, self.cache, cfg.num_heads, self.device)
        self.vocab_size = cfg.vocab_size
        self.graphs: StepGraphs | None = None
        self.prefill_graphs: PrefillGraphs | None = None  # long chunks (prompts), packed and padded to a bucket
        if config.use_cuda_graphs:
            capture = self.device.type == "cuda"
            max_context = config.max_context or cfg.max_position
            self.graphs = StepGraphs(self, config.max_batch_size, max_context, max_q_len=config.max_k + 1,
                                     capture=capture)
            self.prefill_graphs = PrefillGraphs(self, max_context, max_logits=config.max_k + 1, min_tokens=2,
                                                scratch_block=self.graphs.scratch_block, capture=capture)

    @property
    def allocator(self):
        return self.cache.allocator

    @property
    def capacity_tokens(self) -> int:
        return self.allocator.num_blocks * self.allocator.block_size

    def length(self, seq_id: str) -> int:
        return self.allocator.length(seq_id)

    def truncate(self, seq_id: str, length: int) -> None:
        self.allocator.truncate(seq_id, length)

    def free(self, seq_id: str) -> None:
        self.allocator.free(seq_id)

    def capture_prefills(self, aux_layers: tuple[int, ...] = (), features: int = 0) -> int:
        """On a GPU: capture the prefill graph of every whole-prompt length now (``PrefillGraphs.capture_prompts``),
        before requests arrive; returns the prefill graphs captured (0 where nothing is captured)."""
        pg = self.prefill_graphs
        if pg is None or not pg.capture:
            return 0
        pg.capture_prompts(tuple(aux_layers), features)
        return pg.num_captured

    def _prefill_groups(self, chunks: Sequence[Chunk], aux_layers: tuple[int, ...], features: int
                        ) -> list[tuple[tuple, list[int]]]:
        """The round's chunks that are not uniform steps (prompts) packed into prefill-graph replays
        (``PrefillGraphs.pack``) -> [(bucket key, chunk indices)]."""
        pg, steps = self.prefill_graphs, self.graphs
        if pg is None:
            return []
        index = [i for i, c in enumerate(chunks)
                 if not (len(c.token_ids) <= steps.max_q_len and c.num_logits == len(c.token_ids))]
        rows = [(self.allocator.length(chunks[i].seq_id), len(chunks[i].token_ids), chunks[i].num_logits)
                for i in index]
        return [(key, [index[m] for m in members]) for key, members in pg.pack(rows, aux_layers, features)]

    def _prefill(self, key, chunks: Sequence[Chunk], features: Sequence[torch.Tensor | None]
                 ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """Prompt chunks through one prefill-graph replay -> each one's (logits, hidden, aux): views of the
        bucket's buffers (the next replay of the bucket overwrites them: copy out before that)."""
        rows = []
        for c, f in zip(chunks, features):
            start = self.allocator.length(c.seq_id)
            self.allocator.extend(c.seq_id, start + len(c.token_ids))
            rows.append(PrefillRow(c.seq_id, c.token_ids, start, c.num_logits, f))
        return self.prefill_graphs.run(key, rows)

    def _with_prefill_graphs(self, chunks: Sequence[Chunk], aux_layers: tuple[int, ...],
                             features: torch.Tensor | None) -> RunOutput | None:
        """A round whose prompt chunks pack into 1 .. MAX_GRAPH_PREFILLS prefill-graph replays: those, and the
        other chunks (decode rows, a prompt no bucket takes) as one batch beside them; None when no chunk is
        taken. The outputs are copied into the round's output in chunk order (every sequence attends only to
        its own KV, so how the chunks are grouped into forwards changes nothing). ``features``: the rows of a
        feature-fed model, chunk after chunk, split the same way."""
        width = 0 if features is None else features.shape[1]
        groups = self._prefill_groups(chunks, aux_layers, width)
        if not groups or len(groups) > MAX_GRAPH_PREFILLS:
            return None
        rows = list(itertools.accumulate((c.num_logits for c in chunks), initial=0))
        tokens = list(itertools.accumulate((len(c.token_ids) for c in chunks), initial=0))
        feats = [None if features is None else features[tokens[i]:tokens[i + 1]] for i in range(len(chunks))]
        out: RunOutput | None = None

        def place(i: int, logits: torch.Tensor, hidden: torch.Tensor, aux: torch.Tensor | None) -> None:
            nonlocal out
            if out is None:
                out = RunOutput(logits.new_empty(rows[-1], logits.shape[1]),
                                hidden.new_empty(rows[-1], hidden.shape[1]),
                                None if aux is None else aux.new_empty(tokens[-1], *aux.shape[1:]))
            out.logits[rows[i]:rows[i + 1]].copy_(logits)
            out.hidden[rows[i]:rows[i + 1]].copy_(hidden)
            if aux is not None:
                out.aux[tokens[i]:tokens[i + 1]].copy_(aux)

        packed = {i for _, members in groups for i in members}
        rest = [i for i in range(len(chunks)) if i not in packed]
        if rest:
            rest_chunks = [chunks[i] for i in rest]
            rest_feats = None if features is None else torch.cat([feats[i] for i in rest])
            for i, res in zip(rest, _split(self._run_batch(rest_chunks, rest_feats, aux_layers), rest_chunks)):
                place(i, *res)
        for key, members in groups:
            for i, res in zip(members, self._prefill(key, [chunks[i] for i in members], [feats[i] for i in members])):
                place(i, *res)
        return out

    def forward(self, chunks: Sequence[Chunk]) -> torch.Tensor:
        """Run the chunks as one batch -> logits [sum(num_logits), vocab] float32, chunk order."""
        return self.run(chunks).logits

    @torch.inference_mode()
    def run(self, chunks: Sequence[Chunk], *, features: torch.Tensor | None = None,
            aux_layers: Sequence[int] = (), input_ids: torch.Tensor | None = None) -> RunOutput:
        """Run the chunks as one batch.

        features: [sum(len(tokens)), hidden] per-token inputs of a feature-fed model (an EAGLE head).
        aux_layers: target layers whose outputs to return for every token (the EAGLE head's inputs).
        input_ids: [sum(len(tokens))] the chunks' tokens already on the device (a drafter's step fed the token its
        last step picked, never read on the host); the chunks' ``token_ids`` then only count them.
        """
        for c in chunks:
            if not c.token_ids or not 0 <= c.num_logits <= len(c.token_ids):
                raise ValueError(f"chunk {c.seq_id}: {len(c.token_ids)} tokens, {c.num_logits} logits")
        if input_ids is None:
            out = self._with_prefill_graphs(chunks, tuple(aux_layers), features)
            if out is not None:
                return out
        return self._run_batch(chunks, features, tuple(aux_layers), input_ids)

    def _run_batch(self, chunks: Sequence[Chunk], features: torch.Tensor | None, aux_layers: tuple[int, ...],
                   device_ids: torch.Tensor | None = None) -> RunOutput:
        """The chunks as one forward: through the step graphs when they make a uniform step, else eagerly."""
        alloc = self.allocator
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        q_lens, kv_lens, tables, logit_rows = [], [], [], []
        for c in chunks:
            n = len(c.token_ids)
            start = alloc.length(c.seq_id)
            alloc.extend(c.seq_id, start + n)
            ids.extend(c.token_ids)
            positions.extend(range(start, start + n))
            slots.extend(alloc.slots(c.seq_id, start, start + n))
            logit_rows.extend(range(len(ids) - c.num_logits, len(ids)))
            q_lens.append(n)
            kv_lens.append(start + n)
            tables.append(tuple(alloc.block_table(c.seq_id)))
        dev = self.device
        meta = AttentionMetadata(q_lens=tuple(q_lens), kv_lens=tuple(kv_lens), block_tables=tuple(tables),
                                 slot_mapping=upload(slots, dev))
        input_ids = upload(ids, dev) if device_ids is None else device_ids
        pos = upload(positions, dev)
        key = None
        if self.graphs is not None and len(logit_rows) == len(ids):
            key = self.graphs.bucket_for(meta, tuple(aux_layers), 0 if features is None else features.shape[1])
        if key is not None:
            logits, hidden, aux = self.graphs.run(key, meta, input_ids, pos, features)
            # views of the bucket's buffers, which the next step overwrites: copy out
            return RunOutput(logits.clone(), hidden.clone(), None if aux is None else aux.clone())
        self.attention.plan(meta)
        hidden, aux = forward(self.model, input_ids, pos, self.attention, aux_layers, features)
        if len(logit_rows) < len(ids):
            hidden = hidden[upload(logit_rows, dev)]
        return RunOutput(self.model.compute_logits(hidden), hidden, aux)


def _split(out: RunOutput, chunks: Sequence[Chunk]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """A batch's output -> (logits, hidden, aux) rows of each chunk, in order."""
    rows = [c.num_logits for c in chunks]
    tokens = [len(c.token_ids) for c in chunks]
    logits, hidden = out.logits.split(rows), out.hidden.split(rows)
    aux = out.aux.split(tokens) if out.aux is not None else [None] * len(chunks)
    return list(zip(logits, hidden, aux))
