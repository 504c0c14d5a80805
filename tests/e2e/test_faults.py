"""Faults with real processes: the drafter killed, frozen past its deadline, restarted; overload."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import grpc
import pytest

from engine.config import SamplingParams
from tests.conftest import make_decoder
from tests.e2e.conftest import chat_request, free_block, gateway_command, generate, metrics, run, start_stack

TEXTS = ["Tell me about the moon.", "Describe a cat in detail.", "Explain how rain forms.",
         "Write a short story about a robot.", "What makes a good friend?", "Describe the city of Paris.",
         "How do airplanes fly?", "Explain photosynthesis simply."]
N = 48


@pytest.fixture(scope="module")
def stack():
    s = start_stack(draft="ngram", k=4, gateway_flags={"draft_timeout_s": 1.0, "drafter_probe_s": 0.3})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reference(smollm):
    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]
    outs = make_decoder(smollm, "none").generate(prompts, SamplingParams(max_tokens=N, ignore_eos=True))
    return [o.new_token_ids for o in outs]


def _wait_for(predicate, timeout=60.0, what=""):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


async def _streams_with_fault(address: str, fault) -> list:
    """Start all streams; run `fault()` once every stream has received its first tokens."""
    started = asyncio.Event()
    seen: set[int] = set()

    async def one(i: int):
        from protos.tandem.v1 import gateway_pb2_grpc
        from rpc import tensors

        ids, last = [], None
        async with grpc.aio.insecure_channel(address) as ch:
            async for resp in gateway_pb2_grpc.GatewayStub(ch).Generate(chat_request(TEXTS[i], N, ignore_eos=True),
                                                                        timeout=300):
                ids += tensors.token_ids(resp.token_ids, "token_ids")
                last = resp
                seen.add(i)
                if len(seen) == len(TEXTS):
                    started.set()
                if len(ids) < N // 2:
                    await asyncio.sleep(0.05)  # keep the streams in flight while the fault happens
        return ids, last

    tasks = [asyncio.create_task(one(i)) for i in range(len(TEXTS))]
    await started.wait()
    await asyncio.get_running_loop().run_in_executor(None, fault)
    return await asyncio.gather(*tasks)


def test_drafter_killed_mid_stream_then_restarted(stack, reference):
    results = run(_streams_with_fault(stack.gateway_address, lambda: stack.kill("drafter")))
    for (ids, last), ref in zip(results, reference):
        assert ids == ref  # every stream complete and correct, without the drafter
        assert last.usage.completion_tokens == N
    assert metrics(stack, "gateway")["tandem_drafter_available"] == 0
    # a new request while the drafter is down: plain decoding, still correct
    ids, _, last = run(generate(stack.gateway_address, chat_request(TEXTS[0], N, ignore_eos=True)))
    assert ids == reference[0] and last.usage.draft_tokens == 0
    # the drafter comes back: drafting resumes on its own
    stack.start_one("drafter")
    stack.wait_ready()
    _wait_for(lambda: metrics(stack, "gateway")["tandem_drafter_available"] == 1 or
              run(generate(stack.gateway_address, chat_request(TEXTS[1], 8)))[2].usage.draft_tokens > 0,
              what="drafting to resume")
    ids, _, last = run(generate(stack.gateway_address, chat_request(TEXTS[2], N, ignore_eos=True)))
    assert ids == reference[2] and last.usage.draft_tokens > 0


def test_drafter_past_its_deadline_degrades_to_plain_decoding(stack, reference):
    pid = stack.procs["drafter"].pid

    def freeze():
        os.kill(pid, signal.SIGSTOP)

    try:
        results = run(_streams_with_fault(stack.gateway_address, freeze))
        for (ids, _), ref in zip(results, reference):
            assert ids == ref
        assert metrics(stack, "gateway")["tandem_drafter_available"] == 0
    finally:
        os.kill(pid, signal.SIGCONT)
    _wait_for(lambda: metrics(stack, "gateway")["tandem_drafter_available"] == 1 or
              run(generate(stack.gateway_address, chat_request(TEXTS[3], 8)))[2].usage.draft_tokens > 0,
              what="the drafter to be used again")


def test_overload_is_resource_exhausted(stack):
    port = free_block(1)
    cmd = gateway_command(stack, port, "--max-batch-size", "1", "--max-queue", "0")
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        def serving():
            with grpc.insecure_channel(f"localhost:{port}") as ch:
                try:
                    return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1
                except grpc.RpcError:
                    return False
        _wait_for(serving, timeout=120, what="the small gateway")

        async def scenario():
            first = asyncio.create_task(generate(f"localhost:{port}", chat_request(TEXTS[4], 64, ignore_eos=True)))
            await asyncio.sleep(1.0)
            try:
                await generate(f"localhost:{port}", chat_request(TEXTS[5], 8))
                second = None
            except grpc.aio.AioRpcError as exc:
                second = exc.code()
            ids, _, _ = await first
            return len(ids), second
        n, code = run(scenario())
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert n == 64  # the admitted request is unaffected
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
