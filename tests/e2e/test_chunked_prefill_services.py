"""A long prompt through the split services is prefilled in chunks (``--max-round-tokens``), each its own engine call,
while another stream runs: both end exactly as their solo greedy decoding, and the verifier counts the chunks."""

from __future__ import annotations

import asyncio

import pytest

from engine.config import SamplingParams
from tests.conftest import make_decoder
from tests.e2e.conftest import chat_request, generate, metrics, run, start_stack

pytestmark = pytest.mark.slow

BUDGET = 32
LONG = "Here is a list of fruits: " + ", ".join(["apple", "banana", "cherry", "grape", "mango", "peach"] * 12) + \
    ". Which fruit comes up most?"
SHORT = "Name a color."


def test_a_long_prompt_is_prefilled_in_chunks_beside_a_running_stream(smollm):
    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in (LONG, SHORT)]
    assert len(prompts[0]) > 5 * BUDGET
    solo = [o.new_token_ids for o in make_decoder(smollm, "none").generate(
        prompts, SamplingParams(max_tokens=16, ignore_eos=True))]
    stack = start_stack(draft="ngram", k=4, extra_env={"TANDEM_MAX_ROUND_TOKENS": str(BUDGET)})
    try:
        async def both():
            short = asyncio.create_task(generate(stack.gateway, chat_request(SHORT, 16, ignore_eos=True)))
            await asyncio.sleep(0.5)  # the short stream is running when the long prompt arrives
            long = await generate(stack.gateway, chat_request(LONG, 16, ignore_eos=True))
            return long, await short

        (long_ids, _, _), (short_ids, _, _) = run(both())
        assert long_ids == solo[0] and short_ids == solo[1]
        chunks = metrics(stack, "verifier")["tandem_verifier_prefill_chunks"]
        assert chunks >= len(prompts[0]) // BUDGET - 1, chunks
    finally:
        stack.stop()
