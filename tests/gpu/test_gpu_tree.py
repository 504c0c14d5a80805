"""Rounds that verify a tree of drafts (``spec_tree``) through captured graphs on the GPU: the tree mask in the
static-attention kernel, the accepted path's KV moved, the drafter's tree steps. In float32 with the torch
attention, greedy output must equal plain greedy decoding, with rounds launched ahead and several rounds a replay;
in bfloat16 (the shipped dtype) it may leave plain greedy decoding only where the float32 target's two tokens are
a near-tie."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.config import SamplingParams
from tests.conftest import make_decoder
from tests.gpu.test_gpu_engine import NEAR_TIE, _gap_fp32
from tests.gpu.test_gpu_graphs import TEXTS  # the graph tests' six chat prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

PARAMS = [SamplingParams(max_tokens=n, ignore_eos=i % 2 == 0) for i, n in enumerate((40, 64, 33, 57, 48, 20))]


@pytest.fixture(scope="module")
def prompts(f32):
    return [f32.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]


@pytest.mark.parametrize("tree,kw", [((2, 2, 1, 1), {}), ((3, 2, 1, 1), dict(spec_rounds=2, spec_rounds_min_batch=1)),
                                     ((2, 2, 1, 1), dict(pipeline_max_batch=0)), ((3, 1), {}), ((2, 1, 1), {})])
def test_captured_tree_rounds_equal_plain_greedy(f32, prompts, tree, kw):
    plain = make_decoder(f32, "none", k=0, device="cuda", dtype="float32", attention="torch",
                         cuda_graphs=False).generate(prompts, PARAMS)
    dec = make_decoder(f32, "auto", k=len(tree), device="cuda", dtype="float32", attention="torch", cuda_graphs=True,
                       fused_rounds=True, spec_tree=tree, **kw)
    got = dec.generate(prompts, PARAMS)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain]
    assert dec.fused.store.num_captured >= 1 and dec.fused.rounds > 0
    tokens_a_round = sum(o.accepted + o.rounds for o in got) / sum(o.rounds for o in got)
    assert tokens_a_round > (2.0 if len(tree) == 4 else 1.5), tokens_a_round  # a shallow tree drafts fewer
    if kw.get("pipeline_max_batch", 1):
        assert dec.fused.rounds_ahead > 0


@pytest.mark.parametrize("tree", [(2, 2, 1, 1), (3, 1)])
def test_captured_sampled_tree_rounds_walk_the_tree(f32, prompts, tree):
    """Sampled rows through captured tree rounds (``tree_rejection_sample``: one kernel on the GPU): near temperature 0
    they commit what greedy rows commit, round for round; at T 0.7 a seeded request decodes the same tokens twice."""
    def run(params):
        dec = make_decoder(f32, "auto", k=len(tree), device="cuda", dtype="float32", attention="torch",
                           cuda_graphs=True, fused_rounds=True, spec_tree=tree)
        return dec.generate(prompts, params)

    greedy = run(PARAMS)
    cold = run([dataclasses.replace(p, temperature=1e-3, seed=i) for i, p in enumerate(PARAMS)])
    assert [o.new_token_ids for o in cold] == [o.new_token_ids for o in greedy]
    assert [(o.accepted, o.rounds) for o in cold] == [(o.accepted, o.rounds) for o in greedy]
    warm = [dataclasses.replace(p, temperature=0.7, seed=i) for i, p in enumerate(PARAMS)]
    assert [o.new_token_ids for o in run(warm)] == [o.new_token_ids for o in run(warm)]


def test_tree_rounds_in_bfloat16_commit_more_than_the_chain_and_leave_greedy_only_at_near_ties(
        smollm_path, f32, prompts):
    """bf16 sums a tree's verify over other positions than plain decoding's: a near-tie may fall the other way and
    the rest of that output follow it. So each output's first token unlike plain greedy decoding's (bf16, same
    engine settings) must be one where the float32 target's two tokens are within ``NEAR_TIE`` logits; a wrong
    token committed by the tree path (its mask, its KV move, its acceptance) would not be."""
    from engine.models.loader import load_model

    bf16 = load_model(smollm_path, device="cuda", dtype=torch.bfloat16, progress=False)
    params = SamplingParams(max_tokens=96, ignore_eos=True)
    outs = {}
    cases = (("plain", "none", 0, None), ("chain", "auto", 4, None), ("tree", "auto", 4, (2, 2, 1, 1)))
    for name, draft, k, tree in cases:
        dec = make_decoder(bf16, draft, k=k, device="cuda", dtype="bfloat16", attention="torch", spec_tree=tree)
        outs[name] = dec.generate(prompts, params)
    per_round = [sum(o.accepted + o.rounds for o in outs[n]) / sum(o.rounds for o in outs[n])
                 for n in ("chain", "tree")]
    assert per_round[1] > per_round[0], per_round
    report = {}
    for name in ("chain", "tree"):
        gaps = []
        for i, (p, s) in enumerate(zip(outs["plain"], outs[name])):
            p, s = p.new_token_ids, s.new_token_ids
            j = next((j for j, (x, y) in enumerate(zip(p, s)) if x != y), None)
            if j is not None:
                gaps.append((i, j, round(_gap_fp32(f32, prompts[i], p[:j], p[j], s[j]), 4)))
        report[name] = {"tokens_a_round": round(per_round[name == "tree"], 3), "diverged": gaps}
    print(report)
    assert all(gap < NEAR_TIE for name in report for _, _, gap in report[name]["diverged"]), report
