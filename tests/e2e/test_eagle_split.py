"""The default drafter (the shipped EAGLE head) split from the verifier: target features cross the wire."""

from __future__ import annotations

import grpc
import pytest

from engine.config import SamplingParams
from tests.conftest import make_decoder
from tests.e2e.conftest import chat_request, generate, metrics, run, start_stack
from tests.e2e.test_faults import _wait_for

TEXTS = ["Tell me about the moon.", "Describe a cat in detail.", "Explain how rain forms.",
         "Write a short story about a robot."]
N = 48


@pytest.fixture(scope="module")
def stack():
    s = start_stack(k=4, gateway_flags={"draft_timeout_s": 5.0, "drafter_probe_s": 0.3})  # --draft auto
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reference(smollm):
    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]
    outs = make_decoder(smollm, "none").generate(prompts, SamplingParams(max_tokens=N, ignore_eos=True))
    return [o.new_token_ids for o in outs]


async def _all(address):
    import asyncio

    return await asyncio.gather(*(generate(address, chat_request(t, N, ignore_eos=True)) for t in TEXTS))


def test_split_eagle_streams_equal_plain_greedy(stack, reference):
    results = run(_all(stack.gateway_address))
    for (ids, _, last), ref in zip(results, reference):
        assert ids == ref
    accepted = sum(r[2].usage.accepted_tokens for r in results)
    rounds = sum(r[2].usage.rounds for r in results)
    # the head drafts only from the features the verifier sent: acceptance proves they arrived intact
    assert accepted > 0 and (accepted + rounds) / rounds > 1.3
    assert metrics(stack, "gateway")["tandem_drafter_available"] == 1


LONG = 320


async def _streams_with_restart(address: str, prompts: list[str], restart) -> list:
    """Long streams; restart the drafter once every stream has its first tokens."""
    import asyncio

    started = asyncio.Event()
    seen: set[int] = set()

    async def one(i: int):
        from protos.tandem.v1 import gateway_pb2_grpc
        from rpc import tensors

        ids, last = [], None
        async with grpc.aio.insecure_channel(address) as ch:
            async for resp in gateway_pb2_grpc.GatewayStub(ch).Generate(
                    chat_request(prompts[i], LONG, ignore_eos=True), timeout=600):
                ids += tensors.token_ids(resp.token_ids, "token_ids")
                last = resp
                seen.add(i)
                if len(seen) == len(prompts):
                    started.set()
        return ids, last

    tasks = [asyncio.create_task(one(i)) for i in range(len(prompts))]
    await started.wait()
    await asyncio.get_running_loop().run_in_executor(None, restart)
    return await asyncio.gather(*tasks)


def test_in_flight_requests_resume_drafting_after_the_drafter_restarts(stack, smollm):
    prompts = TEXTS[:1]
    ref = make_decoder(smollm, "none").generate(
        [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in prompts],
        SamplingParams(max_tokens=LONG, ignore_eos=True))
    drafted = {}

    def restart():
        stack.kill("drafter")
        stack.start_one("drafter")
        stack.wait_ready()
        _wait_for(lambda: metrics(stack, "gateway")["tandem_drafter_available"] == 1, what="the drafter")
        drafted["at_restart"] = metrics(stack, "gateway")["tandem_draft_tokens_total"]

    results = run(_streams_with_restart(stack.gateway_address, prompts, restart))
    for (ids, last), r in zip(results, ref):
        assert ids == r.new_token_ids and last.usage.completion_tokens == LONG
    # the new drafter process knew none of these requests and gets only the features verified after
    # it came back: it starts its KV there and drafts again for the requests in flight
    assert metrics(stack, "gateway")["tandem_draft_tokens_total"] > drafted["at_restart"]
