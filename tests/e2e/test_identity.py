"""A client's request_id is a label: nothing a client sends reaches another client's request (real processes).

Two gateways share one verifier and one drafter (the deploy's two gateway replicas); both clients name their
request "victim". Each gets exactly its own answer. A direct Verify or Release naming a client's id finds
nothing on the verifier (the gateway names requests with keys of its own), a Prefill with no id is refused per
item and leaves nothing behind, and the requests of a Serve stream cannot be named by the per-request RPCs.
"""

from __future__ import annotations

import asyncio
import os
import subprocess

import grpc
import pytest

from engine.config import SamplingParams
from protos.tandem.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from rpc import convert, tensors
from rpc.ports import free_block
from tests.conftest import make_decoder
from tests.e2e.conftest import chat_request, gateway_command, generate, metrics, run
from tests.e2e.test_faults import _wait_for

N = 40
TEXTS = ("Describe a cat in detail.", "Explain how rain forms.")


@pytest.fixture(scope="module")
def second_gateway(split_stack):
    """Another gateway process on the same verifier and drafter."""
    port = free_block(1)
    cmd = gateway_command(split_stack, port, "--k", "4")
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    def serving() -> bool:
        with grpc.insecure_channel(f"localhost:{port}") as ch:
            try:
                return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                    health_pb2.HealthCheckResponse.SERVING
            except grpc.RpcError:
                return False
    try:
        _wait_for(serving, timeout=300, what="the second gateway")
        yield f"localhost:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def solo(smollm):
    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]
    outs = make_decoder(smollm, "ngram").generate(prompts, SamplingParams(max_tokens=N, ignore_eos=True))
    return [o.new_token_ids for o in outs]


def _named(text: str) -> object:
    req = chat_request(text, N, ignore_eos=True)
    req.request_id = "victim"
    return req


def test_two_clients_with_one_request_id_each_get_their_own_answer(split_stack, second_gateway, solo):
    async def both():
        return await asyncio.gather(generate(split_stack.gateway_address, _named(TEXTS[0])),
                                    generate(second_gateway, _named(TEXTS[1])))

    (a_ids, _, a_last), (b_ids, _, b_last) = run(both())
    assert a_ids == solo[0] and b_ids == solo[1]  # no piece of one in the other
    assert a_last.request_id == b_last.request_id == "victim"  # the label is echoed back
    _wait_for(lambda: metrics(split_stack, "verifier")["tandem_verifier_running"] == 0, what="the KV to be freed")


def test_a_clients_request_id_names_nothing_on_the_verifier(split_stack, solo):
    """While "victim" streams, a caller that reaches the verifier (holding a certificate it accepts) and names it
    gets NOT_FOUND and takes nothing."""
    async def attack():
        victim = asyncio.create_task(generate(split_stack.gateway_address, _named(TEXTS[0])))
        await asyncio.sleep(0.5)
        async with split_stack.channel("verifier") as ch:
            stub = verifier_pb2_grpc.VerifierStub(ch)
            verify = await stub.Verify(verifier_pb2.VerifyRequest(items=[verifier_pb2.VerifyItem(request_id="victim")]),
                                       timeout=60)
            released = await stub.Release(common_pb2.ReleaseRequest(request_ids=["victim", "serve:1:0"]), timeout=60)
        return await victim, verify, released

    (ids, _, _), verify, released = run(attack())
    assert ids == solo[0]
    assert verify.verdicts[0].error_code == grpc.StatusCode.NOT_FOUND.value[0] and released.released == 0


def test_a_prefill_without_an_id_is_refused_and_holds_nothing(split_stack):
    params = convert.sampling_to_pb(SamplingParams(max_tokens=2**31 - 1))
    items = [verifier_pb2.PrefillItem(request_id=rid, prompt=tensors.encode([1, 2, 3], "int32"), sampling=params)
             for rid in ("", "serve:7:0")]

    async def prefill():
        async with split_stack.channel("verifier") as ch:
            return await verifier_pb2_grpc.VerifierStub(ch).Prefill(verifier_pb2.PrefillRequest(items=items),
                                                                     timeout=60)

    resp = run(prefill())
    for v in resp.verdicts:
        assert v.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "request_id" in v.error
    m = metrics(split_stack, "verifier")
    assert m["tandem_verifier_running"] == 0 and m["tandem_verifier_kv_blocks_used"] == 0
