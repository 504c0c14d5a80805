"""Sampling inside fused rounds on the GPU (engine/rounds/fused.py): captured graphs, float32.

1. Seeded sampled requests (with and without top-k / top-p) beside a greedy one decode on the
   captured fast path what the eager engine decodes: the graph draws on the same per-request
   streams and computes the same rejection sampling (the eager one is tested for losslessness on
   the CPU, tests/engine/test_rejection_sampler.py).
2. The output keeps the target's distribution: many seeds of one prompt through fused speculative
   rounds against plain eager sampling, a two-sample chi-square test on the tokens the fused
   rounds produced.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from engine.config import SamplingParams
from engine.rounds.graph_sampling import Mode
from tests.conftest import make_decoder

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

TEXTS = ["Hi!", "List the first ten prime numbers, separated by commas.",
         "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
         "Summarize the plot of Romeo and Juliet in five bullet points."]


@pytest.fixture(scope="module")
def prompts(f32):
    return [f32.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]


def _decoder(model, draft, k, fused, **kw):
    return make_decoder(model, draft, k=k, device="cuda", dtype="float32", attention="torch", cuda_graphs=fused,
                        fused_rounds=fused, **kw)


@pytest.mark.parametrize("draft,k", [("none", 0), ("auto", 4), ("ngram", 4)])
@pytest.mark.parametrize("filters", [{}, {"top_k": 40, "top_p": 0.9}])
def test_captured_sampled_rounds_equal_the_eager_engine(f32, prompts, draft, k, filters):
    params = [SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.8, seed=11, **filters),
              SamplingParams(max_tokens=40, ignore_eos=True),
              SamplingParams(max_tokens=40, ignore_eos=True, temperature=1.1, seed=5, **filters),
              SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.7, seed=3, **filters)]
    want = _decoder(f32, draft, k, False).generate(prompts, params)
    dec = _decoder(f32, draft, k, True)
    got = dec.generate(prompts, params)
    assert dec.fused.store.num_captured >= 1
    assert {key[2] for key in dec.fused.store.graphs} >= {Mode.FILTERED if filters else Mode.SAMPLED}
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in want]
    assert dec.fused.rounds_ahead > 0  # sampled rounds launched ahead (pipeline_max_batch, 64 by default on cuda)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_captured_plain_rounds_of_several_steps_equal_the_eager_engine(f32, prompts, temperature):
    """Plain rounds of 4 forwards (``plain_steps``; rounds of one row take one: ``plain_steps_min_batch`` 2),
    captured, launched ahead, rows finishing at different rounds and the chain moving between graphs of 4 steps and
    of 1: greedy and seeded sampled output equal the eager engine's, token for token."""
    params = [SamplingParams(max_tokens=20 + 7 * i, ignore_eos=True, temperature=temperature, seed=3 + i,
                             **({"top_k": 40} if i == 2 and temperature else {})) for i in range(len(prompts))]
    want = _decoder(f32, "none", 0, False).generate(prompts, params)
    dec = _decoder(f32, "none", 0, True, plain_steps=4, plain_steps_min_batch=2)
    dec.capture_rounds(max_batch=8, modes=tuple(Mode))  # every bucket's graph: finished rows move the chain down
    got = dec.generate(prompts, params)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in want]
    assert dec.fused.store.steps_for(4) == 4 and dec.fused.store.steps_for(1) == 1 and dec.fused.rounds_ahead > 0
    assert dec.fused.compacted >= 1  # into smaller buckets' graphs, the last of them one row's: one step


def _chi_square_p(a: Counter, b: Counter) -> float:
    """Two-sample chi-square test of equal distributions (categories with < 10 counts pooled): p-value by the
    Wilson-Hilferty approximation of the chi-square tail."""
    na, nb = sum(a.values()), sum(b.values())
    keys = [t for t in set(a) | set(b) if a[t] + b[t] >= 10]
    cells = [(a[t], b[t]) for t in keys]
    cells.append((na - sum(x for x, _ in cells), nb - sum(y for _, y in cells)))
    cells = [c for c in cells if sum(c) > 0]
    stat = 0.0
    for x, y in cells:
        n = x + y
        ea, eb = n * na / (na + nb), n * nb / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    df = max(len(cells) - 1, 1)
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_fused_speculative_sampling_keeps_the_target_distribution(f32, prompts):
    n, length = 1536, 8
    prompt = prompts[1]
    fused = _decoder(f32, "auto", 4, True, max_batch_size=64, spec_max_batch=None, kv_cache_tokens=1 << 16)
    plain = _decoder(f32, "none", 0, False, max_batch_size=64, kv_cache_tokens=1 << 16)
    params = [SamplingParams(max_tokens=length, ignore_eos=True, temperature=1.0, seed=i) for i in range(n)]
    got, want = [], []
    for i in range(0, n, 64):
        got += fused.generate([prompt] * 64, params[i:i + 64])
        want += plain.generate([prompt] * 64, [SamplingParams(**{**p.__dict__, "seed": p.seed + n})
                                               for p in params[i:i + 64]])
    assert fused.fused.store.num_captured >= 1 and sum(o.accepted for o in got) > 0
    # the last tokens come from fused rounds (prefill and the first drafts are eager)
    for pos in (length - 2, length - 1):
        a = Counter(o.new_token_ids[pos] for o in got)
        b = Counter(o.new_token_ids[pos] for o in want)
        assert _chi_square_p(a, b) > 1e-4, (pos, a.most_common(8), b.most_common(8))
