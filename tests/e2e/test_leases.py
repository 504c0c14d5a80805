"""State nobody renews is reclaimed (real processes): leases on the verifier's requests and the drafter's histories.

A caller that creates a request and goes away (a gateway killed mid-stream) never releases it; with a 2-second
lease the verifier and the drafter free it by themselves, while a stream the gateway drives (every round names its
request) outlives the lease and ends exactly.
"""

from __future__ import annotations

from engine.config import SamplingParams
from protos.tandem.v1 import drafter_pb2, drafter_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from rpc import convert, tensors
from tests.conftest import make_decoder
from tests.e2e.conftest import chat_request, generate, metrics, run, start_stack
from tests.e2e.test_faults import _wait_for


def test_abandoned_requests_expire_and_driven_ones_do_not(smollm):
    stack = start_stack(draft="ngram", k=4, extra_env={"TANDEM_LEASE_S": "2"})
    try:
        params = convert.sampling_to_pb(SamplingParams(max_tokens=64, ignore_eos=True))

        async def abandon():
            async with stack.channel("verifier") as ch:  # mutual TLS: the stack's own (gateway) certificate
                await verifier_pb2_grpc.VerifierStub(ch).Prefill(verifier_pb2.PrefillRequest(items=[
                    verifier_pb2.PrefillItem(request_id="orphan", prompt=tensors.encode([1, 2, 3], "int32"),
                                             sampling=params)]), timeout=60)
            async with stack.channel("drafter") as ch:
                await drafter_pb2_grpc.DrafterStub(ch).Draft(drafter_pb2.DraftRequest(items=[
                    drafter_pb2.DraftItem(request_id="orphan", start=0, tokens=tensors.encode([1, 2, 3, 1, 2], "int32"),
                                          k=2, sampling=params)]), timeout=60)

        run(abandon())
        assert metrics(stack, "verifier")["tandem_verifier_running"] == 1
        assert metrics(stack, "drafter")["tandem_drafter_running"] == 1
        prompt = smollm.tokenizer.encode_chat([{"role": "user", "content": "Describe a cat in detail."}])
        want = make_decoder(smollm, "none").generate([prompt], SamplingParams(max_tokens=96, ignore_eos=True))
        ids, _, _ = run(generate(stack.gateway, chat_request("Describe a cat in detail.", 96, ignore_eos=True)))
        assert ids == want[0].new_token_ids  # several lease periods long on this CPU, renewed every round
        _wait_for(lambda: metrics(stack, "verifier")["tandem_verifier_running"] == 0, timeout=20,
                  what="the verifier to free the abandoned request")
        _wait_for(lambda: metrics(stack, "drafter")["tandem_drafter_running"] == 0, timeout=20,
                  what="the drafter to free the abandoned history")
        assert metrics(stack, "verifier")["tandem_verifier_kv_blocks_used"] == 0
    finally:
        stack.stop()
