"""Faults a single verifier brings (real processes): a restart, a full KV cache, a prompt past its deadline.

With one verifier that is killed and started again, in-flight streams wait for it (the gateway is NOT_SERVING
meanwhile) and go on from their output so far, equal to plain greedy decoding, in split and co-located mode.
Requests that do not fit the KV cache now wait for room instead of failing. A prompt whose prefill outlasts its
deadline fails alone: the verifier is busy, not lost, and the other streams finish.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engine.config import SamplingParams
from protos.tandem.v1 import gateway_pb2
from rpc.stack import Stack
from tests.conftest import make_decoder
from tests.e2e.conftest import chat_request, generate, metrics, run, start_stack
from tests.e2e.test_faults import _wait_for

TEXTS = ["Tell me about the moon.", "Describe a cat in detail.", "Explain how rain forms."]
N = 40


@pytest.fixture(scope="module")
def reference(smollm):
    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]
    outs = make_decoder(smollm, "none").generate(prompts, SamplingParams(max_tokens=N, ignore_eos=True))
    return [o.new_token_ids for o in outs]


def _health(stack: Stack) -> int:
    with stack.blocking_channel("gateway") as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status


@pytest.mark.parametrize("mode", [{}, {"direct_draft": True}, {"colocated": True}],
                         ids=["split", "split-direct", "colocated"])
def test_streams_ride_out_a_verifier_restart(reference, mode):
    stack = start_stack(draft="ngram", k=4, gateway_flags={"verifier_probe_s": 0.3}, **mode)
    try:
        seen_down = []

        def restart():
            stack.kill("verifier")
            _wait_for(lambda: _health(stack) == health_pb2.HealthCheckResponse.NOT_SERVING,
                      what="the gateway to report NOT_SERVING")
            seen_down.append(True)
            stack.start_one("verifier")

        async def streams():
            calls = [asyncio.create_task(generate(stack.gateway, chat_request(t, N, ignore_eos=True)))
                     for t in TEXTS]
            await asyncio.sleep(1.0)  # every stream under way
            await asyncio.get_running_loop().run_in_executor(None, restart)
            return await asyncio.gather(*calls)

        results = run(streams())
        assert seen_down and [ids for ids, _, _ in results] == reference  # nothing lost, nothing repeated
        _wait_for(lambda: _health(stack) == health_pb2.HealthCheckResponse.SERVING,
                  what="SERVING again")
        _wait_for(lambda: metrics(stack, "verifier")["tandem_verifier_running"] == 0, what="the KV to be freed")
    finally:
        stack.stop()


@pytest.mark.parametrize("colocated", [False, True], ids=["split", "colocated"])
def test_requests_wait_for_kv_room_instead_of_failing(colocated):
    """A cache of 128 tokens and three requests that each reserve most of it (a prompt of about 36 tokens, 50 new
    and the rounds' lookahead: 7 of its 8 blocks): one runs at a time, none fails."""
    stack = start_stack(draft="ngram", k=4, colocated=colocated, kv_cache_tokens=128)
    try:
        async def timed(text):
            """(tokens, the time of its first token, of its last)"""
            times: list[float] = []
            # one at a time, so the last waits for two others' 50 tokens: on a loaded 2-core CPU that can take
            # longer than generate's default 300 s deadline
            ids, _, _ = await generate(stack.gateway, chat_request(text, 50, ignore_eos=True), timeout=900,
                                       token_times=times)
            return ids, times[0], times[-1]

        async def three():
            return await asyncio.gather(*(timed(t) for t in TEXTS))

        results = sorted(run(three()), key=lambda r: r[1])
        assert [len(ids) for ids, _, _ in results] == [50] * 3
        # each began streaming only once the one before it had finished: it waited for room, then ran alone
        assert all(after[1] >= before[2] for before, after in zip(results, results[1:])), results
    finally:
        stack.stop()


def test_a_prompt_past_its_prefill_deadline_fails_alone(reference):
    stack = start_stack(draft="ngram", k=4, gateway_flags={"prefill_timeout_s": 1.0, "verifier_probe_s": 0.3})
    try:
        # 1,200 tokens: a prefill of 4.5 s on one core (measured in process, not in CI), 4x the 1 s deadline
        long = gateway_pb2.GenerateRequest(text="The quick brown fox jumps over the lazy dog. " * 120)
        long.sampling.max_tokens = 4

        async def both():
            other = asyncio.create_task(generate(stack.gateway, chat_request(TEXTS[0], N, ignore_eos=True)))
            await asyncio.sleep(0.5)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await generate(stack.gateway, long)
            return err.value, await other

        err, (ids, _, _) = run(both())
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert ids == reference[0]  # the verifier was busy, not lost: the other stream went on
        assert _health(stack) == health_pb2.HealthCheckResponse.SERVING
        _wait_for(lambda: metrics(stack, "verifier")["tandem_verifier_running"] == 0, what="the KV to be freed")
    finally:
        stack.stop()
