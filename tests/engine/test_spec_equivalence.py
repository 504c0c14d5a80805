"""Lossless, greedy: speculative output equals plain greedy decoding of the target, token for token.

Real SmolLM2 on the CPU in float32; 8 chat prompts of mixed lengths batched together, 64 new
tokens each, for the n-gram and layer-skip drafters at k = 1 and k = 4. The plain reference
is itself checked against transformers' greedy ``generate`` on the same weights.
"""

from __future__ import annotations

import pytest
import torch

from bench.datasets import sharegpt
from engine.config import SamplingParams
from tests.conftest import make_decoder

NEW_TOKENS = 64
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)

SHORT_PROMPTS = [
    "Hi!",
    "List the first ten prime numbers, separated by commas.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Repeat after me exactly: the quick brown fox jumps over the lazy dog. The quick brown fox",
    "Translate to French: 'Good morning, how are you today?'",
]


@pytest.fixture(scope="module")
def prompts(smollm) -> list[list[int]]:
    texts = list(SHORT_PROMPTS)
    for conv in sharegpt(split="train", limit=40):  # longer, real prompts
        text = conv.first_user_text
        if text and 300 < len(text) < 1500:
            texts.append(text)
        if len(texts) == 8:
            break
    ids = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]
    assert len(ids) == 8 and len({len(i) for i in ids}) >= 6  # mixed prompt lengths
    return ids


@pytest.fixture(scope="module")
def plain(smollm, prompts) -> list[list[int]]:
    outs = make_decoder(smollm, "none").generate(prompts, GREEDY)
    assert all(len(o.new_token_ids) == NEW_TOKENS and o.rounds == NEW_TOKENS for o in outs)
    return [o.new_token_ids for o in outs]


def test_plain_decoding_is_transformers_greedy(hf_smollm, prompts, plain):
    for ids, ours in zip(prompts[:4], plain[:4]):
        with torch.no_grad():
            ref = hf_smollm.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=2)
        assert ours == ref[0, len(ids):].tolist()


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("draft", ["ngram", "layerskip:4"])
def test_speculative_greedy_equals_plain(smollm, prompts, plain, draft, k):
    outs = make_decoder(smollm, draft, k=k).generate(prompts, GREEDY)
    for i, (o, ref) in enumerate(zip(outs, plain)):
        assert o.new_token_ids == ref, f"prompt {i} diverges at token " + str(
            next(j for j, (a, b) in enumerate(zip(o.new_token_ids, ref)) if a != b))
    # the drafter really took part: drafts were proposed and some accepted, in fewer rounds
    assert sum(o.drafted for o in outs) > 0
    assert sum(o.accepted for o in outs) > 0
    assert sum(o.rounds for o in outs) < len(prompts) * NEW_TOKENS
