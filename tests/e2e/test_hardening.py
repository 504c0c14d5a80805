"""Hostile and heavy input against the real services on loopback: each is refused with INVALID_ARGUMENT naming what
is wrong, the batch it came with carries on, and the gateway's event loop is never the one doing slow work."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.tandem.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from rpc import tensors
from tests.e2e.conftest import chat_request, generate, run

GENERATE = "/tandem.v1.Gateway/Generate"


async def _raw(address: str, payload: bytes) -> grpc.aio.AioRpcError:
    """Bytes that are not a GenerateRequest (or one with a bad string), sent as one."""
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_stream(GENERATE, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in call(payload, timeout=30):
                pass
        return err.value


@pytest.mark.parametrize("payload", [b"\xff\xff\xff\xff", b"\x12\x02\xff\xfe"],  # garbage; text = invalid UTF-8
                         ids=["corrupt", "invalid-utf8"])
def test_an_undecodable_request_is_invalid_argument(split_stack, payload):
    err = run(_raw(split_stack.gateway_address, payload))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid message for tandem.v1.Gateway/Generate" in err.details()


def test_a_huge_tensor_shape_fails_its_item_alone(split_stack):
    """A shape whose element count overflows 64 bits, in one item of a Verify batch: that item is refused, naming
    its field; the batch's other item is judged on its own."""
    huge = common_pb2.Tensor(dtype="float32", shape=[2**32, 2**32], data=b"")
    items = [verifier_pb2.VerifyItem(request_id="a", draft_tokens=tensors.encode([1], "int32"),
                                     draft_probs=common_pb2.DraftDistribution(ids=huge, probs=huge)),
             verifier_pb2.VerifyItem(request_id="b")]

    async def verify():
        async with split_stack.channel("verifier") as ch:
            return await verifier_pb2_grpc.VerifierStub(ch).Verify(verifier_pb2.VerifyRequest(items=items), timeout=30)

    a, b = run(verify()).verdicts
    assert a.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "draft_probs" in a.error
    assert b.error_code == grpc.StatusCode.NOT_FOUND.value[0]  # judged on its own: it is simply not running


@pytest.mark.parametrize("sampling, field", [
    ({"temperature": float("inf")}, "sampling.temperature"), ({"temperature": 1e30}, "sampling.temperature"),
    ({"stop": [f"stop{i}" for i in range(10_000)]}, "sampling.stop"), ({"stop": ["x" * 5000]}, "sampling.stop")])
def test_out_of_range_sampling_is_refused_naming_the_field(split_stack, sampling, field):
    req = chat_request("Hello", 8)
    for key, value in sampling.items():
        if key == "stop":
            req.sampling.stop.extend(value)
        else:
            setattr(req.sampling, key, value)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        run(generate(split_stack.gateway_address, req))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith(field)


def test_a_long_prompt_is_tokenized_off_the_event_loop(split_stack):
    """While the gateway tokenizes a prompt of nearly its 1 MiB limit, its event loop keeps answering: health checks
    on its port go on being answered at once (on a busy 2-core machine the verifier's rounds, hence another stream's
    tokens, may stall for the CPU itself, which says nothing of the event loop)."""
    big = gateway_pb2.GenerateRequest(text="lorem ipsum dolor sit amet " * 38_000)
    big.sampling.max_tokens = 1

    async def both():
        answered_at: list[tuple[float, float]] = []  # (sent, answered) of each health check
        done = asyncio.Event()

        async def checks():
            async with grpc.aio.insecure_channel(split_stack.gateway_address) as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                while not done.is_set():
                    t0 = time.monotonic()
                    await stub.Check(health_pb2.HealthCheckRequest(), timeout=30)
                    answered_at.append((t0, time.monotonic()))
                    await asyncio.sleep(0.02)

        task = asyncio.create_task(checks())
        while not answered_at:
            await asyncio.sleep(0.02)
        sent = time.monotonic()
        async with grpc.aio.insecure_channel(split_stack.gateway_address) as ch:
            try:
                async for _ in gateway_pb2_grpc.GatewayStub(ch).Generate(big, timeout=300):
                    break
            except grpc.aio.AioRpcError:
                pass  # too long for the context: refused, after it was tokenized
        answered = time.monotonic()
        done.set()
        await task
        during = [(t0, t1) for t0, t1 in answered_at if sent < t0 and t1 < answered]
        return during, answered - sent

    during, took = run(both())
    assert took > 0.2 and during  # health checks were answered while the prompt was tokenized ...
    assert max(t1 - t0 for t0, t1 in during) < took / 2  # ... each well before the tokenizing ended


def test_a_cancelled_traced_stream_detaches_its_context(caplog):
    """The tracing interceptor keeps a stream's span current only while the handler computes: a client that cancels
    mid-stream leaves no "Failed to detach context" behind."""
    from rpc.interceptors import TracingServerInterceptor

    class Endless(gateway_pb2_grpc.GatewayServicer):
        async def Generate(self, request, context):
            while True:
                yield gateway_pb2.GenerateResponse(text="x")
                await asyncio.sleep(0.01)

    async def scenario():
        server = grpc.aio.server(interceptors=[TracingServerInterceptor()])
        gateway_pb2_grpc.add_GatewayServicer_to_server(Endless(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                call = gateway_pb2_grpc.GatewayStub(ch).Generate(gateway_pb2.GenerateRequest(text="hi"))
                n = 0
                async for _ in call:
                    n += 1
                    if n == 3:
                        call.cancel()
                        break
            await asyncio.sleep(0.3)
        finally:
            await server.stop(0)

    with caplog.at_level(logging.ERROR, logger="opentelemetry.context"):
        asyncio.run(scenario())
    assert not [r for r in caplog.records if "detach" in r.getMessage()]
