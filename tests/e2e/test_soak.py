"""A bounded soak: valid streams, bad input, cancellations, deadlines, a killed drafter and a restarted verifier, mixed.

Real processes on loopback (split mode, n-gram drafter, k 4), requests arriving at seeded random times over about
30 seconds while the faults happen. Every valid stream must end exactly as its solo greedy decoding (nothing lost,
nothing repeated, whatever was killed under it); every bad request is INVALID_ARGUMENT; a cancelled or expired
stream ends by its own cancellation or deadline only; and afterwards neither service holds any KV or history.
The figures are printed (README.md, "Reliability", quotes a run).
"""

from __future__ import annotations

import asyncio
import random
import time

import grpc
import pytest

from engine.config import SamplingParams
from protos.tandem.v1 import gateway_pb2, gateway_pb2_grpc
from rpc import tensors
from rpc.gateway_client import GatewayAccess
from tests.conftest import make_decoder
from tests.e2e.conftest import chat_request, metrics, run, start_stack
from tests.e2e.test_faults import _wait_for

pytestmark = pytest.mark.slow

TEXTS = ["Tell me about the moon.", "Describe a cat.", "Explain how rain forms.", "What makes a good friend?",
         "How do airplanes fly?", "Name three rivers."]
N = 24
VALID, CANCELLED, EXPIRING = 30, 6, 4
BAD = [("prompt", lambda r: r.ClearField("messages")), ("sampling.temperature", lambda r: setattr(
    r.sampling, "temperature", float("inf"))), ("sampling.k", lambda r: setattr(r.sampling, "k", 99)),
    ("sampling.stop", lambda r: r.sampling.stop.extend(["x"] * 1000)),
    ("prompt.messages[0].role", lambda r: setattr(r.messages.messages[0], "role", "wizard")),
    ("sampling.top_p", lambda r: setattr(r.sampling, "top_p", 0.0))]


async def _stream(gateway: GatewayAccess, req, timeout: float, cancel_after: int | None = None):
    ids: list[int] = []
    async with gateway.channel() as ch:
        call = gateway_pb2_grpc.GatewayStub(ch).Generate(req, timeout=timeout, metadata=gateway.metadata)
        try:
            async for resp in call:
                ids += tensors.token_ids(resp.token_ids, "token_ids")
                if cancel_after is not None and len(ids) >= cancel_after:
                    call.cancel()
                    return ids, grpc.StatusCode.CANCELLED
        except grpc.aio.AioRpcError as exc:
            return ids, exc.code()
    return ids, grpc.StatusCode.OK


def test_soak(smollm):
    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]
    solo = [o.new_token_ids for o in make_decoder(smollm, "none").generate(
        prompts, SamplingParams(max_tokens=N, ignore_eos=True))]
    stack = start_stack(draft="ngram", k=4, gateway_flags={"drafter_probe_s": 0.3, "verifier_probe_s": 0.3,
                                                           "draft_timeout_s": 1.0})
    rng = random.Random(0)
    try:
        async def soak():
            address, t0 = stack.gateway, time.monotonic()
            plan = ([("valid", i % len(TEXTS)) for i in range(VALID)] + [("cancel", i) for i in range(CANCELLED)]
                    + [("expire", i) for i in range(EXPIRING)] + [("bad", i) for i in range(len(BAD))])
            rng.shuffle(plan)

            async def one(kind: str, i: int, at: float):
                await asyncio.sleep(at)
                text = TEXTS[i % len(TEXTS)]
                if kind == "valid":
                    return kind, i, await _stream(address, chat_request(text, N, ignore_eos=True), 600)
                if kind == "cancel":
                    return kind, i, await _stream(address, chat_request(text, 400, ignore_eos=True), 600,
                                                  cancel_after=3)
                if kind == "expire":
                    return kind, i, await _stream(address, chat_request(text, 4000, ignore_eos=True), 2.0)
                req = chat_request(text, N)
                BAD[i][1](req)
                ids, code = await _stream(address, req, 60)
                return kind, i, (ids, code)

            async def faults():
                await asyncio.sleep(8)
                stack.kill("drafter")
                await asyncio.sleep(4)
                stack.start_one("drafter")
                await asyncio.sleep(8)
                stack.kill("verifier")
                await asyncio.sleep(1)
                stack.start_one("verifier")

            fault = asyncio.create_task(faults())
            results = await asyncio.gather(*(one(k, i, rng.uniform(0, 30)) for k, i in plan))
            await fault
            return results, time.monotonic() - t0

        results, took = run(soak())
        by_kind: dict[str, list] = {}
        for kind, i, (ids, code) in results:
            by_kind.setdefault(kind, []).append((i, ids, code))
        lost = [(i, code) for i, ids, code in by_kind["valid"] if code != grpc.StatusCode.OK or ids != solo[i]]
        bad = [(BAD[i][0], code) for i, _, code in by_kind["bad"] if code != grpc.StatusCode.INVALID_ARGUMENT]
        cancelled = [code for _, _, code in by_kind["cancel"] if code != grpc.StatusCode.CANCELLED]
        expired = [code for _, _, code in by_kind["expire"] if code != grpc.StatusCode.DEADLINE_EXCEEDED]
        _wait_for(lambda: metrics(stack, "verifier")["tandem_verifier_kv_blocks_used"] == 0, timeout=60,
                  what="the verifier's KV to return to zero")
        _wait_for(lambda: metrics(stack, "drafter")["tandem_drafter_running"] == 0, timeout=60,
                  what="the drafter's histories to return to zero")
        print(f"\nsoak: {len(results)} streams in {took:.0f} s ({VALID} valid, {len(BAD)} bad inputs, {CANCELLED} "
              f"cancelled, {EXPIRING} past their deadline), faults: drafter killed and restarted, verifier killed "
              f"and restarted; lost: {len(lost)}, wrongly answered bad inputs: {len(bad)}; KV back to zero")
        assert lost == [] and bad == [] and cancelled == [] and expired == []
    finally:
        stack.stop()
