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


LONG = 1500  # an upper bound: the stream stops once drafting has resumed (however long the restart took)


async def _stream_with_restart(stack, prompt: str, restart) -> tuple[list[int], bool]:
    """One long stream; restart the drafter once it has its first tokens, and stop reading (cancel the
    stream) once the gateway counts new draft tokens after the restart. -> (token ids, whether it resumed)."""
    import asyncio

    from protos.tandem.v1 import gateway_pb2_grpc
    from rpc import tensors

    restarted: asyncio.Future | None = None
    ids: list[int] = []
    async with grpc.aio.insecure_channel(stack.gateway_address) as ch:
        async for resp in gateway_pb2_grpc.GatewayStub(ch).Generate(chat_request(prompt, LONG, ignore_eos=True),
                                                                    timeout=600):
            ids += tensors.token_ids(resp.token_ids, "token_ids")
            if restarted is None:
                restarted = asyncio.get_running_loop().run_in_executor(None, restart)
            elif restarted.done():
                at_restart = restarted.result()
                scraped = await asyncio.to_thread(metrics, stack, "gateway")  # HTTP, off the event loop
                if scraped["tandem_draft_tokens_total"] > at_restart:
                    return ids, True  # leaving the block cancels the stream
    return ids, False


def test_in_flight_requests_resume_drafting_after_the_drafter_restarts(stack, smollm):
    def restart() -> float:
        stack.kill("drafter")
        stack.start_one("drafter")
        stack.wait_ready()
        _wait_for(lambda: metrics(stack, "gateway")["tandem_drafter_available"] == 1, what="the drafter")
        return metrics(stack, "gateway")["tandem_draft_tokens_total"]

    ids, resumed = run(_stream_with_restart(stack, TEXTS[0], restart))
    # the new drafter process knew none of these requests and gets only the features verified after
    # it came back: it starts its KV there and drafts again for the request in flight
    assert resumed, f"no draft tokens after the restart in {len(ids)} streamed tokens"
    ref = make_decoder(smollm, "none").generate([smollm.tokenizer.encode_chat([{"role": "user", "content": TEXTS[0]}])],
                                                SamplingParams(max_tokens=len(ids), ignore_eos=True))[0]
    assert ids == ref.new_token_ids  # nothing lost or changed across the restart
