"""Several verifier and drafter replicas (local processes standing in for pods) behind one gateway.

Each request stays on one verifier and one drafter; new requests go to the least-loaded ones. A
drafter killed mid-stream moves its requests to the other drafter; a verifier killed (or frozen)
mid-stream has its requests prefilled again on the other verifier (prompt + output so far). Every
stream still equals plain greedy decoding token for token, text included.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal

import grpc
import pytest
import torch

from rpc.ports import free_block
from rpc.stack import Stack, StackConfig
from engine.config import SamplingParams
from protos.tandem.v1 import gateway_pb2_grpc
from rpc import tensors
from tests.conftest import make_decoder
from tests.e2e.conftest import chat_request, metrics, run
from tests.e2e.test_faults import _wait_for

TEXTS = ["Tell me about the moon.", "Describe a cat in detail.", "Explain how rain forms.",
         "Write a short story about a robot.", "What makes a good friend?", "Describe the city of Paris.",
         "How do airplanes fly?", "Explain photosynthesis simply."]
N = 48


def start_replicas(verifiers: int, drafters: int, **overrides) -> Stack:
    """Processes with one torch thread each: five of them share a small CPU without oversubscribing it."""
    n = 1 + verifiers + drafters
    cfg = StackConfig(port=free_block(n), metrics_port=free_block(n), device="cpu", kv_cache_tokens=8192,
                      verifiers=verifiers, drafters=drafters,
                      **{**overrides, "extra_env": {"OMP_NUM_THREADS": "1", **overrides.get("extra_env", {})}})
    stack = Stack(cfg)
    stack.start()
    try:
        stack.wait_ready(timeout_s=300)
        wait_ready_replicas(stack, n - 1)  # the gateway serves once one verifier is up: it uses every replica
    except Exception:
        stack.stop()
        raise
    return stack


def wait_ready_replicas(stack: Stack, n: int, timeout_s: float = 300.0) -> None:
    _wait_for(lambda: replicas_up(stack) == n, timeout=timeout_s, what=f"the gateway to use {n} replicas")


def replicas_up(stack: Stack, service: str = "") -> int:
    """Replicas (of ``service``, or all) the gateway sends requests to."""
    return int(sum(v for k, v in metrics(stack, "gateway").items()
                   if k.startswith("tandem_replica_up{") and f'service="{service}' in k))


@pytest.fixture(scope="class")
def stack():
    s = start_replicas(2, 2, draft="ngram", k=4,
                       gateway_flags={"drafter_probe_s": 0.3, "verifier_probe_s": 0.3})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reference(smollm):
    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # beside the stack's processes
    try:
        outs = make_decoder(smollm, "none").generate(prompts, SamplingParams(max_tokens=N, ignore_eos=True))
    finally:
        torch.set_num_threads(threads)
    return [(o.new_token_ids, smollm.tokenizer.decode(o.new_token_ids, skip_special_tokens=True)) for o in outs]


async def streams(address: str, during=None, texts=TEXTS, options=None) -> tuple[list, object]:
    """All texts streamed at once; ``during()`` runs (in a thread) once every stream has its first tokens.
    ``options``: the channels' (each stream opens its own)."""
    started = asyncio.Event()
    seen: set[int] = set()

    async def one(i: int):
        ids, text, last = [], "", None
        async with grpc.aio.insecure_channel(address, options=options) as ch:
            async for resp in gateway_pb2_grpc.GatewayStub(ch).Generate(chat_request(texts[i], N, ignore_eos=True),
                                                                        timeout=300):
                ids += tensors.token_ids(resp.token_ids, "token_ids")
                text += resp.text
                last = resp
                seen.add(i)
                if len(seen) == len(texts):
                    started.set()
        return ids, text, last

    tasks = [asyncio.create_task(one(i)) for i in range(len(texts))]
    await started.wait()
    seen_during = await asyncio.get_running_loop().run_in_executor(None, during) if during else None
    return await asyncio.gather(*tasks), seen_during


def assert_exact(results, reference):
    for (ids, text, last), (ref_ids, ref_text) in zip(results, reference):
        assert ids == ref_ids and text == ref_text  # nothing lost, nothing repeated
        assert last.usage.completion_tokens == N


def moved(stack: Stack, service: str) -> float:
    return metrics(stack, "gateway").get(f'tandem_requests_moved_total{{service="{service}"}}', 0.0)


class TestTwoVerifiersTwoDrafters:
    """One stack for these, in this order: balance, lose a drafter, freeze a verifier, then kill it."""

    def test_requests_are_balanced_over_the_replicas(self, stack, reference):
        def running():
            return {v: metrics(stack, v)["tandem_verifier_running"] for v in ("verifier", "verifier-1")}

        results, during = run(streams(stack.gateway_address, running))
        assert_exact(results, reference)
        # all eight in flight at once: each verifier held the KV of four of them
        assert during == {"verifier": 4, "verifier-1": 4}
        assert running() == {"verifier": 0, "verifier-1": 0}  # and freed it
        assert {d: metrics(stack, d)["tandem_drafter_running"] for d in ("drafter", "drafter-1")} == \
            {"drafter": 0, "drafter-1": 0}
        assert sum(r[2].usage.draft_tokens for r in results) > 0

    def test_a_drafter_killed_mid_stream_moves_its_requests(self, stack, reference):
        before = moved(stack, "drafter")
        results, _ = run(streams(stack.gateway_address, lambda: stack.kill("drafter-1")))
        assert_exact(results, reference)
        assert moved(stack, "drafter") > before  # its requests went on drafting on the other drafter
        assert metrics(stack, "gateway")["tandem_drafter_available"] == 1
        assert replicas_up(stack, "drafter") == 1

    def test_a_verifier_that_hangs_is_lost_by_its_health_checks(self, stack, reference):
        pid = stack.procs["verifier-1"].pid
        before = moved(stack, "verifier")
        try:
            results, _ = run(streams(stack.gateway_address, lambda: os.kill(pid, signal.SIGSTOP)))
            # its Verify never returns: two failed health checks give it up, its streams go on elsewhere
            assert_exact(results, reference)
            assert moved(stack, "verifier") >= before + 1
            assert replicas_up(stack, "verifier") == 1
        finally:
            os.kill(pid, signal.SIGCONT)
        _wait_for(lambda: replicas_up(stack, "verifier") == 2, what="the verifier to be taken back")
        # the requests moved away from it were released there before it took new ones
        assert metrics(stack, "verifier-1")["tandem_verifier_running"] == 0

    def test_a_verifier_killed_mid_stream_moves_its_requests(self, stack, reference):
        before = moved(stack, "verifier")
        results, _ = run(streams(stack.gateway_address, lambda: stack.kill("verifier-1")))
        assert_exact(results, reference)  # the killed verifier's streams continued on the other one
        assert moved(stack, "verifier") >= before + 1
        assert metrics(stack, "verifier")["tandem_verifier_running"] == 0
        assert replicas_up(stack, "verifier") == 1


def test_eagle_drafters_each_described_and_fed_features_after_a_move(reference):
    """The default drafter (an EAGLE head, fed target features) on two replicas; one is killed mid-stream."""
    eagle = start_replicas(1, 2, k=4, gateway_flags={"draft_timeout_s": 5.0, "drafter_probe_s": 0.3})  # auto
    try:
        counted = {}

        def kill():
            eagle.kill("drafter-1")
            counted["drafted"] = metrics(eagle, "gateway")["tandem_draft_tokens_total"]

        results, _ = run(streams(eagle.gateway_address, kill, TEXTS[:4]))
        assert_exact(results, reference[:4])
        gw = metrics(eagle, "gateway")
        assert moved(eagle, "drafter") > 0  # onto the other head, which got the history and the features since
        assert gw["tandem_draft_tokens_total"] > counted["drafted"]
        accepted = sum(r[2].usage.accepted_tokens for r in results)
        rounds = sum(r[2].usage.rounds for r in results)
        assert (accepted + rounds) / rounds > 1.3  # the heads draft only from features that arrived intact
    finally:
        eagle.stop()


def test_two_gateway_processes_share_its_port_and_stream_exactly(reference):
    """``gateways=2`` (tandem serve --gateways 2): two gateway processes on one port (SO_REUSEPORT), each with its
    own Serve stream to the verifier; the kernel spreads the clients' connections over them. Sixteen streams, each
    on a connection of its own, all equal plain greedy decoding, and both processes served some."""
    cfg = StackConfig(colocated=True, gateways=2, draft="ngram", k=4, device="cpu", kv_cache_tokens=8192,
                      extra_env={"OMP_NUM_THREADS": "1"})
    cfg = dataclasses.replace(cfg, port=free_block(cfg.block), metrics_port=free_block(cfg.block))
    stack = Stack(cfg)
    stack.start()
    try:
        stack.wait_ready(timeout_s=300)  # each process SERVING on its own health port
        assert stack.names() == ["verifier", "gateway", "gateway-1"]
        # a connection per stream (channels to one address otherwise share one)
        results, _ = run(streams(stack.gateway_address, texts=TEXTS * 2,
                                 options=[("grpc.use_local_subchannel_pool", 1)]))
        assert_exact(results, reference * 2)
        served = [sum(v for k, v in metrics(stack, g).items() if k.startswith("tandem_requests_total"))
                  for g in ("gateway", "gateway-1")]
        assert sum(served) == 16 and min(served) >= 1, served
    finally:
        stack.stop()
