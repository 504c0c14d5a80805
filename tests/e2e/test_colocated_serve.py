"""Co-located serving over Serve streams: the verifier runs the rounds, the gateway admits, cancels and streams.

Real processes on loopback: two co-located verifiers behind one gateway. Every stream equals plain greedy
decoding token for token (text included) when the requests are spread over both, when one verifier is killed
mid-stream (its requests are admitted again on the other with their output so far) and beside a request the
verifier refuses; a cancelled stream's KV is freed; and the verifier's streams are sessions of their own: one
caller's slots name nothing of another's. Each verifier runs its engine in a process of its own (the default): that
process killed mid-stream stops its verifier and its requests go on, on the other; the same stack with the engine
on a thread of the verifier's process streams exactly as well.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from protos.tandem.v1 import common_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from rpc import convert, tensors
from tests.e2e.conftest import chat_request, metrics, run
from tests.e2e.test_faults import _wait_for
from tests.e2e.test_replicas import (TEXTS, assert_exact, moved, reference, replicas_up, start_replicas, streams,
                                     wait_ready_replicas)

__all__ = ["reference"]  # the module fixture, shared with test_replicas


@pytest.fixture(scope="module")
def stack():
    s = start_replicas(2, 0, colocated=True, draft="ngram", k=4, gateway_flags={"verifier_probe_s": 0.3, "max_k": 16})
    yield s
    s.stop()


def running(stack, name: str) -> float:
    return metrics(stack, name)["tandem_verifier_running"]


def test_streams_spread_over_the_verifiers_equal_plain_greedy(stack, reference):
    results, during = run(streams(stack.gateway_address, lambda: {v: running(stack, v)
                                                                  for v in ("verifier", "verifier-1")}))
    assert_exact(results, reference)
    assert during == {"verifier": 4, "verifier-1": 4}  # least loaded first: four requests' KV on each
    _wait_for(lambda: running(stack, "verifier") == running(stack, "verifier-1") == 0, what="the KV to be freed")
    rounds = metrics(stack, "gateway")["tandem_rounds_total"]
    assert rounds > 0 and sum(r[2].usage.rounds for r in results) >= 8


def test_a_refused_request_fails_alone_naming_its_field(stack, reference):
    """The verifier's own check (k above its max_k 8, which the gateway's max_k 16 lets through) refuses one
    admission on a stream that carries others: that request ends INVALID_ARGUMENT, the others run on."""
    async def both():
        bad = chat_request("Hello", 8, ignore_eos=True, k=12)
        async with grpc.aio.insecure_channel(stack.gateway_address) as ch:
            stub = gateway_pb2_grpc.GatewayStub(ch)
            good = asyncio.create_task(streams(stack.gateway_address))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in stub.Generate(bad, timeout=60):
                    pass
            return err.value, await good

    err, (results, _) = run(both())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "k: must be in [0, max_k=8], got 12" in err.details()
    assert_exact(results, reference)


def test_a_cancelled_stream_frees_its_kv(stack):
    async def cancel_after_first_tokens():
        async with grpc.aio.insecure_channel(stack.gateway_address) as ch:
            call = gateway_pb2_grpc.GatewayStub(ch).Generate(chat_request(TEXTS[0], 400, ignore_eos=True),
                                                             timeout=120)
            async for resp in call:
                if resp.token_ids.shape and resp.token_ids.shape[0]:
                    call.cancel()
                    break

    run(cancel_after_first_tokens())
    _wait_for(lambda: running(stack, "verifier") == running(stack, "verifier-1") == 0, what="the KV to be freed")
    for v in ("verifier", "verifier-1"):
        assert metrics(stack, v)["tandem_verifier_kv_blocks_used"] == 0


def test_serve_streams_are_sessions_of_their_own(stack):
    """Two callers on one verifier both use slot 0: a cancel on one stream ends only its own request, and closing
    a stream frees everything it admitted."""
    def admit(prompt: list[int], max_tokens: int) -> verifier_pb2.ServeControl:
        params = convert.sampling_to_pb(convert.sampling_from_pb(common_pb2.SamplingParams(
            max_tokens=max_tokens, ignore_eos=True)))
        return verifier_pb2.ServeControl(admit=[verifier_pb2.ServeAdmit(
            slot=0, prompt=tensors.encode(prompt, "int32"), sampling=params)])

    async def two_callers():
        async with stack.channel("verifier") as ch:
            stub = verifier_pb2_grpc.VerifierStub(ch)
            a, b = stub.Serve(), stub.Serve()
            await a.write(admit([1, 2, 3], 200))
            await b.write(admit([4, 5, 6], 6))
            first = await a.read()  # A's request runs ...
            await a.write(verifier_pb2.ServeControl(cancel=tensors.encode([0], "int32")))  # ... and ends
            got = 0
            while True:  # B's slot 0 runs to its end regardless
                update = await b.read()
                for rr in update.rounds:
                    got += int(tensors.to_numpy(rr.counts, "counts").sum())
                    if tensors.to_numpy(rr.finish, "finish").tolist() == [common_pb2.FINISH_REASON_LENGTH]:
                        await b.done_writing()
                        return first, got
    first, got = run(two_callers())
    assert len(first.rounds) >= 1 and got == 6
    _wait_for(lambda: running(stack, "verifier") + running(stack, "verifier-1") == 0, what="the sessions' KV")


def engine_process(pid: int) -> int:
    """The verifier's engine process (verifier_svc/core.py): the child it started through multiprocessing's spawn."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if "spawn_main" in Path(f"/proc/{child}/cmdline").read_text():
                return int(child)
    raise AssertionError(f"verifier {pid} has no engine process")


def test_an_engine_process_killed_mid_stream_stops_its_verifier_and_moves_its_requests(stack, reference):
    """verifier-1's engine dies: that verifier's Serve streams end UNAVAILABLE and it stops itself (whatever runs it
    starts a fresh one: here the test), while the gateway goes on with those requests on the other verifier."""
    before = moved(stack, "verifier")
    verifier = stack.procs["verifier-1"]
    engine = engine_process(verifier.pid)
    results, _ = run(streams(stack.gateway_address, lambda: os.kill(engine, signal.SIGKILL)))
    assert_exact(results, reference)
    assert moved(stack, "verifier") >= before + 1
    assert verifier.wait(timeout=60) is not None  # ended by itself, nobody signalled it
    stack.start_one("verifier-1")
    wait_ready_replicas(stack, 2)


def test_an_engine_on_a_thread_of_the_verifier_streams_exactly(reference):
    """engine_process off (TANDEM_ENGINE_PROCESS=false): the engine runs on a thread of the verifier's process."""
    local = start_replicas(1, 0, colocated=True, draft="ngram", k=4, extra_env={"TANDEM_ENGINE_PROCESS": "false"})
    try:
        with pytest.raises(AssertionError, match="no engine process"):
            engine_process(local.procs["verifier"].pid)
        results, _ = run(streams(local.gateway_address))
        assert_exact(results, reference)
        assert metrics(local, "verifier")["tandem_verifier_serve_rounds_total{kind=\"run\"}"] > 0
    finally:
        local.stop()


@pytest.mark.parametrize("where", ["--engine-process", "--no-engine-process"])
def test_a_model_the_engine_cannot_load_is_one_line_naming_the_field(where):
    """Loaded in the engine process or not, a bad --model ends the verifier with exit code 2 and the field named."""
    proc = subprocess.run([sys.executable, "-m", "cli.main", "verifier", "--model", "/nonexistent.gguf", "--device",
                           "cpu", "--insecure", "--verifier-port", "0", where], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr
    assert "tandem verifier: error: model: /nonexistent.gguf is neither a GGUF file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_verifier_killed_mid_stream_moves_its_requests(stack, reference):
    before = moved(stack, "verifier")
    results, _ = run(streams(stack.gateway_address, lambda: stack.kill("verifier-1")))
    assert_exact(results, reference)  # its streams went on, on the other verifier, from the output they had
    assert moved(stack, "verifier") >= before + 1
    _wait_for(lambda: running(stack, "verifier") == 0, what="the KV to be freed")
    assert replicas_up(stack, "verifier") == 1
