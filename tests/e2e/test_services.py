"""The three services as real processes: lossless output, bad input, health, reflection, cancellation."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engine.config import SamplingParams
from protos.tandem.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from rpc import tensors
from tests.conftest import make_decoder
from tests.e2e.conftest import chat_request, generate, metrics, run

TEXTS = ["Name three fruits.", "What is 12 times 12?", "Write one sentence about the sea.",
         "Count from one to ten in words.", "Say hello in Spanish.", "What color is the sky?",
         "Give me a haiku about rain.", "Define the word 'algorithm' in one sentence."]
N = 32


@pytest.fixture(scope="module")
def reference(smollm):
    """What `tandem generate` produces: the in-process engine, greedy, same prompts."""
    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]
    outs = make_decoder(smollm, "ngram").generate(prompts, SamplingParams(max_tokens=N, ignore_eos=True))
    return [o.new_token_ids for o in outs]


async def _concurrent(address: str, reqs):
    return await asyncio.gather(*(generate(address, r) for r in reqs))


@pytest.mark.parametrize("mode", ["split", "colocated"])
def test_concurrent_streams_equal_generate(mode, split_stack, colocated_stack, reference, smollm):
    stack = split_stack if mode == "split" else colocated_stack
    results = run(_concurrent(stack.gateway_address, [chat_request(t, N, ignore_eos=True) for t in TEXTS]))
    for (ids, text, last), ref in zip(results, reference):
        assert ids == ref
        assert text == smollm.tokenizer.decode(ref, skip_special_tokens=True)
        assert last.finish_reason == common_pb2.FINISH_REASON_LENGTH
        u = last.usage
        assert u.completion_tokens == N and u.prompt_tokens > 0 and u.rounds >= 1
        assert u.acceptance_length == pytest.approx((u.accepted_tokens + u.rounds) / u.rounds, rel=1e-5)
    assert sum(r[2].usage.accepted_tokens for r in results) > 0  # drafts really crossed over
    assert metrics(stack, "gateway")["tandem_rounds_total"] > 0


def test_unary_matches_stream(split_stack, reference):
    async def call():
        async with grpc.aio.insecure_channel(split_stack.gateway_address) as ch:
            return await gateway_pb2_grpc.GatewayStub(ch).GenerateUnary(chat_request(TEXTS[0], N, ignore_eos=True),
                                                                         timeout=300)
    resp = run(call())
    assert tensors.token_ids(resp.token_ids, "token_ids") == reference[0]
    assert resp.usage.completion_tokens == N


def _bad_requests():
    long_text = "word " * 9000
    ids = lambda values: gateway_pb2.GenerateRequest(token_ids=tensors.encode(values, "int32"))  # noqa: E731
    cases = {
        "empty text": (gateway_pb2.GenerateRequest(text=""), "prompt.text"),
        "no prompt": (gateway_pb2.GenerateRequest(), "prompt"),
        "empty messages": (gateway_pb2.GenerateRequest(messages=gateway_pb2.ChatMessages()), "prompt.messages"),
        "bad role": (gateway_pb2.GenerateRequest(messages=gateway_pb2.ChatMessages(
            messages=[gateway_pb2.ChatMessage(role="robot", content="hi")])), "prompt.messages[0].role"),
        "id beyond vocab": (ids([1, 2, 49152]), "prompt.token_ids"),
        "negative id": (ids([1, -5]), "prompt.token_ids"),
        "2-d ids": (gateway_pb2.GenerateRequest(token_ids=tensors.encode([[1, 2]], "int32")), "prompt.token_ids"),
        "prompt over context": (gateway_pb2.GenerateRequest(text=long_text), "prompt"),
        "prompt over size limit": (gateway_pb2.GenerateRequest(text="x" * ((1 << 20) + 1)), "prompt.text"),
    }
    sampling = {"max_tokens 0": ("max_tokens", 0, "sampling.max_tokens"),
                "max_tokens over limit": ("max_tokens", 100000, "sampling.max_tokens"),
                "negative temperature": ("temperature", -0.5, "sampling.temperature"),
                "top_p 0": ("top_p", 0.0, "sampling.top_p"), "top_p above 1": ("top_p", 1.5, "sampling.top_p"),
                "negative top_k": ("top_k", -1, "sampling.top_k"), "k above max_k": ("k", 99, "sampling.k")}
    for name, (fld, value, field_name) in sampling.items():
        req = chat_request("hello", 8)
        setattr(req.sampling, fld, value)
        cases[name] = (req, field_name)
    return cases


BAD = _bad_requests()


def test_bad_input_is_invalid_argument_and_others_carry_on(split_stack, reference):
    async def scenario():
        good = asyncio.create_task(generate(split_stack.gateway_address, chat_request(TEXTS[1], N, ignore_eos=True)))
        errors = {}
        async with grpc.aio.insecure_channel(split_stack.gateway_address,
                                             options=[("grpc.max_send_message_length", 8 << 20)]) as ch:
            stub = gateway_pb2_grpc.GatewayStub(ch)
            for name, (req, _) in BAD.items():
                try:
                    async for _ in stub.Generate(req, timeout=60):
                        pass
                    errors[name] = None
                except grpc.aio.AioRpcError as exc:
                    errors[name] = (exc.code(), exc.details())
        return errors, await good

    errors, (ids, _, _) = run(scenario())
    for name, (_, field_name) in BAD.items():
        assert errors[name] is not None, f"{name}: accepted"
        code, details = errors[name]
        assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {code} {details}"
        assert details.startswith(field_name + ":") or details.startswith(field_name + " "), f"{name}: {details}"
    assert ids == reference[1]


@pytest.mark.parametrize("service", ["gateway", "verifier", "drafter"])
def test_health_and_reflection(split_stack, service):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with split_stack.blocking_channel(service) as ch:  # the verifier's and drafter's: mutual TLS
        status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        names = set(ProtoReflectionDescriptorDatabase(ch).get_services())
    assert f"tandem.v1.{service.capitalize()}" in names and "grpc.health.v1.Health" in names


def _wait_idle(stack, services, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        m = {s: metrics(stack, s) for s in services}
        if all(m[s][f"tandem_{s}_running"] == 0 and m[s][f"tandem_{s}_kv_blocks_used"] == 0 for s in services):
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"KV still held: {m}")
        time.sleep(0.2)


def test_cancelling_a_stream_frees_kv(split_stack):
    async def scenario():
        async with grpc.aio.insecure_channel(split_stack.gateway_address) as ch:
            call = gateway_pb2_grpc.GatewayStub(ch).Generate(chat_request(TEXTS[2], 2000, ignore_eos=True), timeout=300)
            got = 0
            async for resp in call:
                got += len(tensors.token_ids(resp.token_ids, "token_ids"))
                if got >= 8:
                    held = metrics(split_stack, "verifier")["tandem_verifier_kv_blocks_used"]
                    call.cancel()
                    return held
    held = run(scenario())
    assert held > 0
    m = _wait_idle(split_stack, ["verifier", "drafter"])
    # the verifier exports its fast path's exits by reason (split mode: no co-located rounds, none)
    assert m["verifier"]['tandem_fast_path_exits_total{reason="context_full"}'] == 0


def test_client_deadline_frees_kv(split_stack):
    async def scenario():
        try:
            await generate(split_stack.gateway_address, chat_request(TEXTS[3], 2000, ignore_eos=True), timeout=1.5)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    assert run(scenario()) == grpc.StatusCode.DEADLINE_EXCEEDED
    _wait_idle(split_stack, ["verifier", "drafter"])


def test_seeded_sampling_over_the_wire_is_reproducible(split_stack):
    req = chat_request(TEXTS[6], 24, temperature=0.8, top_p=0.95, seed=7, ignore_eos=True)
    a = run(generate(split_stack.gateway_address, req))[0]
    b = run(generate(split_stack.gateway_address, req))[0]
    req.sampling.seed = 8
    c = run(generate(split_stack.gateway_address, req))[0]
    assert a == b and a != c and len(a) == 24
