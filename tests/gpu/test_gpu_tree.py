"""Rounds that verify a tree of drafts (``spec_tree``) through captured graphs on the GPU: the tree mask in the
static-attention kernel, the accepted path's KV moved, the drafter's tree steps. In float32 with the torch
attention, greedy output must equal plain greedy decoding, with rounds launched ahead and several rounds a replay;
in bfloat16 (the shipped dtype) too, against the chain's rounds on the same engine settings."""

from __future__ import annotations

import pytest
import torch

from engine.config import SamplingParams
from tests.conftest import make_decoder
from tests.gpu.test_gpu_graphs import TEXTS  # the graph tests' six chat prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

PARAMS = [SamplingParams(max_tokens=n, ignore_eos=i % 2 == 0) for i, n in enumerate((40, 64, 33, 57, 48, 20))]


@pytest.fixture(scope="module")
def prompts(f32):
    return [f32.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]


@pytest.mark.parametrize("tree,kw", [((2, 2, 1, 1), {}), ((3, 2, 1, 1), dict(spec_rounds=2, spec_rounds_min_batch=1)),
                                     ((2, 2, 1, 1), dict(pipeline_max_batch=0))])
def test_captured_tree_rounds_equal_plain_greedy(f32, prompts, tree, kw):
    plain = make_decoder(f32, "none", k=0, device="cuda", dtype="float32", attention="torch",
                         cuda_graphs=False).generate(prompts, PARAMS)
    dec = make_decoder(f32, "auto", k=4, device="cuda", dtype="float32", attention="torch", cuda_graphs=True,
                       fused_rounds=True, spec_tree=tree, **kw)
    got = dec.generate(prompts, PARAMS)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain]
    assert dec.fused.store.num_captured >= 1 and dec.fused.rounds > 0
    tokens_a_round = sum(o.accepted + o.rounds for o in got) / sum(o.rounds for o in got)
    assert tokens_a_round > 2.0, tokens_a_round
    if kw.get("pipeline_max_batch", 1):
        assert dec.fused.rounds_ahead > 0


def test_tree_rounds_in_bfloat16_with_the_kernel_commit_more_than_the_chain(smollm_path, prompts):
    from engine.models.loader import load_model

    bf16 = load_model(smollm_path, device="cuda", dtype=torch.bfloat16, progress=False)
    params = SamplingParams(max_tokens=96, ignore_eos=True)
    outs = []
    for tree in (None, (2, 2, 1, 1)):
        dec = make_decoder(bf16, "auto", k=4, device="cuda", dtype="bfloat16", attention="torch", spec_tree=tree)
        outs.append(dec.generate(prompts, params))
    per_round = [sum(o.accepted + o.rounds for o in out) / sum(o.rounds for o in out) for out in outs]
    assert per_round[1] > per_round[0], per_round
    same = sum(a.new_token_ids == b.new_token_ids for a, b in zip(*outs))
    assert same >= len(prompts) - 1  # bf16: a near-tie may fall the other way in another kernel's sums
