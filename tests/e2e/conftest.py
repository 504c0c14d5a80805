"""Real processes on loopback: stacks of gateway / verifier / drafter started with `python -m cli.main`."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from rpc.stack import Stack, StackConfig, free_block
from protos.tandem.v1 import gateway_pb2, gateway_pb2_grpc
from rpc import tensors


def start_stack(**overrides) -> Stack:
    # one torch thread per service process: three processes with two threads each on a 2-core CI
    # machine spend their time fighting over the cores
    env = {"OMP_NUM_THREADS": "1", **overrides.pop("extra_env", {})}
    cfg = StackConfig(**{"port": free_block(3), "metrics_port": free_block(3), "device": "cpu",
                         "kv_cache_tokens": 8192, "extra_env": env, **overrides})
    stack = Stack(cfg)
    stack.start()
    try:
        stack.wait_ready(timeout_s=300)
    except Exception:
        stack.stop()
        raise
    return stack


def metrics(stack: Stack, service: str) -> dict[str, float]:
    return stack.metrics(service)


def chat_request(text: str, max_tokens: int = 32, **sampling) -> gateway_pb2.GenerateRequest:
    req = gateway_pb2.GenerateRequest()
    req.messages.messages.append(gateway_pb2.ChatMessage(role="user", content=text))
    req.sampling.max_tokens = max_tokens
    for k, v in sampling.items():
        setattr(req.sampling, k, v)
    return req


async def generate(address: str, req: gateway_pb2.GenerateRequest, timeout: float = 300) -> tuple[list[int], str, object]:
    """Stream one request; returns (token ids, text, last response)."""
    ids, text, last = [], "", None
    async with grpc.aio.insecure_channel(address) as ch:
        async for resp in gateway_pb2_grpc.GatewayStub(ch).Generate(req, timeout=timeout):
            ids += tensors.token_ids(resp.token_ids, "token_ids")
            text += resp.text
            last = resp
    return ids, text, last


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def split_stack():
    stack = start_stack(draft="ngram", k=4)
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def colocated_stack():
    stack = start_stack(draft="ngram", k=4, colocated=True)
    yield stack
    stack.stop()
