"""bench/occupancy.py: how full the fused replays' rows are under continuous admission, on the real model (CPU:
the graphs built, not captured)."""

from __future__ import annotations

import pytest

from bench.datasets import held_out_prompts
from bench.occupancy import occupancy
from engine.config import EngineConfig


@pytest.mark.parametrize("draft", ["ngram", "none"])
def test_replays_rows_split_into_steady_and_drain_and_every_round_is_accounted(smollm, draft):
    prompts = held_out_prompts("humaneval", smollm.tokenizer, 5)
    config = EngineConfig(kv_cache_tokens=8192, k=0 if draft == "none" else 4, cuda_graphs=True, fused_rounds=True,
                          spec_max_batch=16, pipeline_max_batch=8, spec_rounds=2, spec_rounds_min_batch=1)
    got = occupancy(smollm, config, draft, prompts, batch_size=2, max_tokens=12)
    steady, drain = got["steady"], got["drain"]
    assert steady["replays"] >= 1 and drain["replays"] >= 1  # the last arrival came while rows were running
    assert 0 < steady["rows_mean"] <= 2 and 0 < drain["rows_mean"] <= 2 and drain["full"] <= 1
    # 12 tokens a request: a round each plain, at most k + 1 = 5 a round speculating
    assert got["request_rounds"] == 60 if draft == "none" else got["request_rounds"] >= 12
    # every request's rounds: one or two outside a replay (its prefill; a drafter's eager first drafts), the rest in one
    assert 5 <= got["eager_rounds"] <= 2 * 5
    if draft == "none":  # plain requests of one length arrive and finish together: every steady replay is full
        assert steady["full"] == 1.0


def test_a_plain_round_of_several_steps_is_one_round_of_its_requests(smollm):
    """A plain graph's round of 4 steps commits 4 tokens a row in one request round: the replays carry all but each
    request's prefill (its row_rounds count the steps)."""
    prompts = held_out_prompts("humaneval", smollm.tokenizer, 5)
    config = EngineConfig(kv_cache_tokens=8192, k=0, cuda_graphs=True, fused_rounds=True, pipeline_max_batch=8,
                          plain_steps=4, plain_steps_min_batch=1)
    got = occupancy(smollm, config, "none", prompts, batch_size=2, max_tokens=13)
    assert got["request_rounds"] == 5 * (1 + 3)  # the prefill's token, then 12 in three rounds of 4
    assert got["eager_rounds"] == 5
    assert got["row_rounds"] == 5 * 12
