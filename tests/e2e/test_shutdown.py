"""SIGTERM ends a service promptly in every state: starting (loading its model), waiting for a peer (the gateway
before any verifier answers), serving (calls in flight get the grace period, then the process exits)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.tandem.v1 import common_pb2, gateway_pb2_grpc
from rpc import tensors
from rpc.server import STOP_MARGIN_S
from rpc.ports import free_block, port_in_use
from tests.e2e.conftest import chat_request, start_stack


def service(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def stopped_within(proc: subprocess.Popen, sig: int, seconds: float) -> tuple[int, float]:
    """Send ``sig``; the exit code and how long the process took to end (it must within ``seconds``)."""
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        code = proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"still running {seconds} s after {signal.Signals(sig).name}:\n{proc.communicate()[0]}")
    return code, time.monotonic() - t0


def health(port: int) -> int | None:
    """The health status a server reports, None while nothing answers."""
    with grpc.insecure_channel(f"localhost:{port}") as ch:
        try:
            return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1).status
        except grpc.RpcError:
            return None


def test_sigterm_while_loading_the_model():
    port = free_block(1)
    proc = service("verifier", "--verifier-port", str(port), "--device", "cpu", "--insecure")
    time.sleep(1.0)
    assert not port_in_use(port), "the verifier was already serving: this test wants it still starting"
    code, took = stopped_within(proc, signal.SIGTERM, 10)
    assert code in (0, -signal.SIGTERM)


def test_sigterm_while_the_gateway_waits_for_its_verifier():
    port = free_block(2)
    proc = service("gateway", "--gateway-port", str(port), "--verifier-address", f"localhost:{port + 1}",
                   "--insecure")
    deadline = time.monotonic() + 120
    while health(port) != health_pb2.HealthCheckResponse.NOT_SERVING:  # listening, not serving: waiting
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.2)
    code, took = stopped_within(proc, signal.SIGTERM, 5)
    out = proc.communicate()[0]
    assert code == 0, out
    assert "stopped while starting" in out


async def _stream(address: str, req) -> tuple[list[int], object]:
    """Stream one request: (token ids, its last response or the RpcError that ended it)."""
    ids, last = [], None
    async with grpc.aio.insecure_channel(address) as ch:
        try:
            async for resp in gateway_pb2_grpc.GatewayStub(ch).Generate(req, timeout=300):
                ids += tensors.token_ids(resp.token_ids, "token_ids")
                last = resp
        except grpc.aio.AioRpcError as exc:
            last = exc
    return ids, last


def test_sigterm_while_serving_drains_within_the_grace_period():
    grace = 4.0
    stack = start_stack(draft="ngram", k=4, colocated=True, gateway_flags={"grace_s": grace})
    try:
        gateway, verifier = stack.procs["gateway"], stack.procs["verifier"]

        async def scenario():
            short = asyncio.create_task(_stream(stack.gateway_address, chat_request("Name a colour.", 8, ignore_eos=True)))
            long = asyncio.create_task(_stream(stack.gateway_address,
                                               chat_request("Tell me a long story.", 4000, ignore_eos=True)))
            await asyncio.sleep(1.0)  # both admitted and decoding
            loop = asyncio.get_running_loop()
            stopping = loop.run_in_executor(None, stopped_within, gateway, signal.SIGTERM, grace + STOP_MARGIN_S)
            return await short, await long, await stopping

        (short_ids, short_last), (long_ids, long_last), (code, took) = asyncio.run(scenario())
        # the short answer finished normally during the grace period; the long one was cut off at its end
        assert len(short_ids) == 8 and short_last.finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert isinstance(long_last, grpc.aio.AioRpcError) and 0 < len(long_ids) < 4000
        assert code == 0 and took < grace + STOP_MARGIN_S
        # the verifier, serving and idle, stops at once
        code, took = stopped_within(verifier, signal.SIGTERM, STOP_MARGIN_S)
        assert code == 0 and took < 3
    finally:
        stack.stop()
