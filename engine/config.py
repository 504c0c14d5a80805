"""Frozen configuration objects, built and validated once at the edge.

Nothing in the engine mutates these after startup. Validation errors are ``ValueError``s
that name the offending field, so the CLI and the services can report them verbatim.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal


def _require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{field_name}: {message}")


K_LIMIT = 32  # the largest draft length any setting or request may name
MAX_TEMPERATURE = 100.0  # past this a distribution is uniform noise (and inf or NaN would poison the sampler)


def default_max_k(k: int) -> int:
    """The largest k a request may ask for when no max_k is set: 8, or the default k where that is larger."""
    return max(8, k)


def check_k(k: int, max_k: int, field_name: str = "k") -> None:
    """The one rule for a draft length: 0 <= k <= max_k <= K_LIMIT (ValueError naming the field)."""
    _require(0 <= max_k <= K_LIMIT, "max_k", f"must be in [0, {K_LIMIT}], got {max_k}")
    _require(0 <= k <= max_k, field_name, f"must be in [0, max_k={max_k}], got {k}")


MAX_TREE_NODES = 62  # a draft tree's nodes and root as the bits of one int64 (engine/rounds/tree.py)


def tree_nodes(branching: tuple[int, ...]) -> int:
    """Nodes of a draft tree with these children per depth (2, 2, 1, 1: 2 + 4 + 4 + 4 = 14)."""
    total, width = 0, 1
    for b in branching:
        width *= b
        total += width
    return total


def check_tree(branching: object, k: int, field_name: str = "spec_tree") -> None:
    """A draft tree: k integers >= 1 (children per depth), at most MAX_TREE_NODES nodes (ValueError naming the
    field)."""
    _require(isinstance(branching, tuple) and all(isinstance(b, int) and b >= 1 for b in branching), field_name,
             f"must be children per depth, integers >= 1 (e.g. 2,2,1,1), got {branching!r}")
    _require(len(branching) == k and k > 0, field_name, f"must have k = {k} depths (k > 0), got {len(branching)}"
             + (f"; for this tree set k to {len(branching)} (--k {len(branching)})" if branching and k > 0 else ""))
    _require(tree_nodes(branching) <= MAX_TREE_NODES, field_name,
             f"{branching} has {tree_nodes(branching)} nodes; at most {MAX_TREE_NODES}")


@dataclass(frozen=True)
class RopeScaling:
    """Rotary scaling. ``kind`` "none", "linear" (position / factor) or "llama3"."""

    kind: Literal["none", "linear", "llama3"] = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one Llama-family decoder (Llama 2/3, SmolLM2, Qwen2, Mistral)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position: int = 8192
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has biases on q, k and v
    name: str = "llama"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position"):
            _require(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")
        _require(self.num_heads % self.num_kv_heads == 0, "num_kv_heads",
                 f"{self.num_kv_heads} does not divide num_heads={self.num_heads}")

    def truncated(self, num_layers: int) -> "ModelConfig":
        """The same model with only its first ``num_layers`` decoder layers (layer-skip draft)."""
        _require(0 < num_layers <= self.num_layers, "num_layers",
                 f"must be in [1, {self.num_layers}], got {num_layers}")
        return dataclasses.replace(self, num_layers=num_layers)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. ``temperature == 0`` is greedy decoding.

    ``top_k == 0`` and ``top_p == 1`` switch those filters off. ``k`` overrides the server's
    draft length for this request (0 = plain decoding); on the fused fast path a k above the
    server's is capped at it (the output is the same, only the speed differs). ``seed`` makes
    sampled output reproducible; None draws a fresh seed.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    k: int | None = None

    def __post_init__(self) -> None:
        _require(0 <= self.temperature <= MAX_TEMPERATURE, "temperature",
                 f"must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}")
        _require(self.top_k >= 0, "top_k", f"must be >= 0, got {self.top_k}")
        _require(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        _require(self.max_tokens > 0, "max_tokens", f"must be > 0, got {self.max_tokens}")
        _require(self.k is None or self.k >= 0, "k", f"must be >= 0, got {self.k}")
        _require(all(isinstance(s, str) and s for s in self.stop), "stop",
                 "stop strings must be non-empty strings")
        if self.seed is not None:
            _require(0 <= self.seed < 2**63, "seed", f"must be in [0, 2**63), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def filters(self) -> bool:
        """Whether top-k or top-p cut its distribution (the sorting path of ``probs_from_logits``)."""
        return self.top_k > 0 or self.top_p < 1.0


@dataclass(frozen=True)
class EngineConfig:
    """How one process runs a model: device, dtype, KV capacity, draft length."""

    device: str = "cpu"
    dtype: str = "float32"
    attention: Literal["auto", "torch", "flashinfer"] = "auto"
    kv_block_size: int = 16
    kv_cache_tokens: int | None = None  # None: sized from a memory budget when the engine is built
    max_batch_size: int = 64
    max_k: int = 8
    k: int = 4
    max_context: int | None = None  # None: the model's max_position
    draft_top_m: int = 0  # sampled drafts: draw from (and send) only the top m tokens; 0 = the full distribution
    max_round_tokens: int | None = None  # tokens per target forward; prompts beyond it are prefilled in chunks
    cuda_graphs: bool | None = None  # plain decode steps through captured graphs; None: on for cuda, off for cpu
    fused_rounds: bool | None = None  # rounds as one graph each (engine/rounds/fused.py); None: with cuda_graphs
    # fused rounds speculate only while the running requests weigh at most this (a greedy one 1, a sampled one 2,
    # each times the drafter's batch_weight: engine/policy.py's spec_load): a request running while more do decodes
    # plainly (a verify of k + 1 tokens per row costs more there than the drafts save), to its end with a feature-fed
    # drafter, until the load is within the limit again (room for one more greedy request) with one that catches up
    # from tokens; None: always
    spec_max_batch: int | None = None  # the serving edges (CLI, settings) default to 16
    # with a batch policy (spec_max_batch set): "max-batch", the rule above; "cost", per round by the measured cost
    # of a round at this batch size and the requests' acceptance (engine/policy.py; experimental: it misjudged
    # some batch sizes on the H200, bench/RESULTS.md issue 23), spec_max_batch where sizes were not timed
    spec_policy: Literal["max-batch", "cost"] = "max-batch"
    # while at most this many requests run a fused round, the next round is launched before this one is read, its
    # inputs chained on the device (engine/rounds/ahead.py: the host's work overlaps the GPU's); 0: never; None: 64
    # where rounds are captured (cuda), 0 where they run eagerly
    pipeline_max_batch: int | None = None
    # a plain graph's round of plain_steps_min_batch rows or more decodes this many tokens a row, one forward each
    # (the host's work of a round, per row, then comes once per this many tokens; a smaller round's GPU work is
    # what it waits for, and a request arriving would wait for the longer round: one step); None: 4 where rounds
    # are captured (cuda), 1 where they run eagerly
    plain_steps: int | None = None
    plain_steps_min_batch: int = 16
    # a greedy speculative graph of spec_rounds_min_batch rows or more runs this many whole rounds a replay, each on
    # the drafts the one before made (the host's work then comes once per spec_rounds rounds); None: 2 where rounds
    # are captured (cuda), 1 where they run eagerly
    spec_rounds: int | None = None
    spec_rounds_min_batch: int = 16
    # while at least admit_group_min_batch requests run, queued requests are admitted admit_group at a time, or once
    # the queue's head has been held admit_group - 1 rounds: one prefill round (and one round of first drafts) then
    # serves several arrivals instead of each arrival costing the running batch an eager round; 1: as they come
    admit_group: int = 1
    admit_group_min_batch: int = 16
    # rounds of the co-located graph verify a tree of drafts, this many children under each node by depth
    # (engine/rounds/tree.py; depth k, at most MAX_TREE_NODES nodes): greedy rows by matching, sampled rows walking
    # it by rejection sampling; None: a chain of k
    spec_tree: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _require(self.dtype in ("float32", "bfloat16", "float16"), "dtype",
                 f"must be float32, bfloat16 or float16, got {self.dtype!r}")
        _require(self.device == "cpu" or self.device.startswith("cuda"), "device",
                 f"must be cpu or cuda[:N], got {self.device!r}")
        _require(self.attention != "flashinfer" or self.device.startswith("cuda"), "attention",
                 "flashinfer needs a CUDA device")
        _require(self.kv_block_size > 0, "kv_block_size", "must be > 0")
        _require(self.kv_cache_tokens is None or self.kv_cache_tokens >= self.kv_block_size, "kv_cache_tokens",
                 f"must be >= kv_block_size ({self.kv_block_size})")
        _require(self.max_batch_size > 0, "max_batch_size", "must be > 0")
        check_k(self.k, self.max_k)
        _require(self.draft_top_m >= 0, "draft_top_m", f"must be >= 0, got {self.draft_top_m}")
        _require(self.spec_max_batch is None or self.spec_max_batch >= 0, "spec_max_batch",
                 f"must be >= 0 or None, got {self.spec_max_batch}")
        _require(self.spec_policy in ("max-batch", "cost"), "spec_policy",
                 f"must be max-batch or cost, got {self.spec_policy!r}")
        _require(self.pipeline_max_batch is None or self.pipeline_max_batch >= 0, "pipeline_max_batch",
                 f"must be >= 0 or None, got {self.pipeline_max_batch}")
        _require(self.plain_steps is None or self.plain_steps >= 1, "plain_steps",
                 f"must be >= 1 or None, got {self.plain_steps}")
        _require(self.plain_steps_min_batch >= 1, "plain_steps_min_batch",
                 f"must be >= 1, got {self.plain_steps_min_batch}")
        _require(self.spec_rounds is None or self.spec_rounds >= 1, "spec_rounds",
                 f"must be >= 1 or None, got {self.spec_rounds}")
        _require(self.spec_rounds_min_batch >= 1, "spec_rounds_min_batch",
                 f"must be >= 1, got {self.spec_rounds_min_batch}")
        _require(self.admit_group >= 1, "admit_group", f"must be >= 1, got {self.admit_group}")
        _require(self.admit_group_min_batch >= 1, "admit_group_min_batch",
                 f"must be >= 1, got {self.admit_group_min_batch}")
        _require(self.max_round_tokens is None or self.max_round_tokens >= self.kv_block_size, "max_round_tokens",
                 f"must be >= kv_block_size ({self.kv_block_size}), got {self.max_round_tokens}")
        if self.spec_tree is not None:
            check_tree(self.spec_tree, self.k)
            _require(self.use_fused_rounds, "spec_tree", "needs fused rounds (a CUDA device, fused rounds on; a tree "
                     "of drafts is verified only inside the round's graph)")

    def for_draft(self, draft: str, **changes) -> "EngineConfig":
        """This config for a decoder with ``draft`` (``"none"``: plain decoding, no k and no tree of drafts), with
        ``changes``; what a benchmark's plain case and its speculative cases share."""
        plain = draft == "none"
        return dataclasses.replace(self, k=0 if plain else self.k, spec_tree=None if plain else self.spec_tree,
                                   **changes)

    @property
    def torch_dtype(self):
        import torch

        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[self.dtype]

    @property
    def use_cuda_graphs(self) -> bool:
        """Whether decode steps take the static, graph-shaped path (captured on cuda, eager on cpu)."""
        return self.device.startswith("cuda") if self.cuda_graphs is None else self.cuda_graphs

    @property
    def use_fused_rounds(self) -> bool:
        """Whether greedy rounds (verify, accept, drafting) run as one graph each (eagerly on cpu)."""
        return self.use_cuda_graphs if self.fused_rounds is None else self.fused_rounds

    @property
    def pipeline_rows(self) -> int:
        """Fused rounds of at most this many rows launch the next round ahead (0: none)."""
        if self.pipeline_max_batch is not None:
            return self.pipeline_max_batch
        return 64 if self.use_fused_rounds and self.device.startswith("cuda") else 0

    @property
    def plain_round_steps(self) -> int:
        """Tokens a plain graph's round decodes a row (``plain_steps``)."""
        if self.plain_steps is not None:
            return self.plain_steps
        return 4 if self.use_fused_rounds and self.device.startswith("cuda") else 1

    @property
    def spec_round_count(self) -> int:
        """Whole rounds a greedy speculative graph of ``spec_rounds_min_batch`` rows or more runs a replay."""
        if self.spec_rounds is not None:
            return self.spec_rounds
        return 2 if self.use_fused_rounds and self.device.startswith("cuda") else 1

    @property
    def attention_backend(self) -> str:
        if self.attention != "auto":
            return self.attention
        return "flashinfer" if self.device.startswith("cuda") else "torch"
