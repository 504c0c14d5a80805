"""Real processes on loopback: stacks of gateway / verifier / drafter started with `python -m cli.main`.

A stack is secure by default (``rpc.stack``): its verifiers and drafters speak mutual TLS with credentials it made,
so a test reaches them through ``stack.channel(name)`` / ``stack.blocking_channel(name)``; its gateway listens on
127.0.0.1 and needs no key (``generate`` also takes a ``GatewayAccess``).
"""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from rpc.ports import free_block
from rpc.stack import Stack, StackConfig
from protos.tandem.v1 import gateway_pb2, gateway_pb2_grpc
from rpc import tensors
from rpc.gateway_client import GatewayAccess, access


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


async def generate(gateway: GatewayAccess | str, req: gateway_pb2.GenerateRequest,
                   timeout: float = 300, token_times: list[float] | None = None) -> tuple[list[int], str, object]:
    """Stream one request (from a gateway's address, or its access: TLS, API key); returns (token ids, text, last
    response). ``token_times``: gets the monotonic time each response carrying tokens arrived."""
    gateway = access(gateway)
    ids, text, last = [], "", None
    async with gateway.channel() as ch:
        async for resp in gateway_pb2_grpc.GatewayStub(ch).Generate(req, timeout=timeout, metadata=gateway.metadata):
            new = tensors.token_ids(resp.token_ids, "token_ids")
            if new and token_times is not None:
                token_times.append(time.monotonic())
            ids += new
            text += resp.text
            last = resp
    return ids, text, last


def run(coro):
    return asyncio.run(coro)


def gateway_command(stack: Stack, port: int, *flags: str) -> list[str]:
    """Another gateway for ``stack``'s verifiers and drafters, on 127.0.0.1:``port``, holding the stack's
    credentials (its client certificate)."""
    ports = stack.cfg.ports
    security = stack.credentials.flags("gateway") if stack.credentials is not None else {"insecure": True}
    cmd = [sys.executable, "-m", "cli.main", "gateway", "--host", "127.0.0.1", "--gateway-port", str(port),
           "--verifier-address", f"localhost:{ports['verifier']}", "--drafter-address", f"localhost:{ports['drafter']}"]
    for name, value in security.items():
        cmd += [f"--{name.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return cmd + list(flags)


# one stack of each kind per pytest worker, shared by every file that only calls it (services, identity, security,
# hardening, ...): a stack's start is 20-25 s of CPU, and idle it costs about 1 %. A test must leave it as it found it
# (no KV held, no process stopped); one that kills or reconfigures a service starts a stack of its own.
@pytest.fixture(scope="session")
def split_stack():
    stack = start_stack(draft="ngram", k=4)
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def colocated_stack():
    stack = start_stack(draft="ngram", k=4, colocated=True)
    yield stack
    stack.stop()
