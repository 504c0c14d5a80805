"""Split mode with the verifier calling its drafter (``tandem serve --direct-draft``): the verifier runs the rounds
over Serve streams as co-located serving does, drafting through the drafter service (verifier_svc/remote_drafter.py).
The default drafter (the shipped EAGLE head), so target features cross the wire from the verifier to the drafter."""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.conftest import chat_request, generate, metrics, run, start_stack
from tests.e2e.test_eagle_split import N, TEXTS, _all, reference  # noqa: F401 (reference: a fixture)
from tests.e2e.test_faults import _wait_for


@pytest.fixture(scope="module")
def stack():
    s = start_stack(k=4, direct_draft=True)  # --draft auto
    yield s
    s.stop()


def _drafted(stack) -> float:
    return metrics(stack, "gateway")["tandem_draft_tokens_total"]


def test_streams_equal_plain_greedy_and_the_drafter_drafts(stack, reference):
    before = metrics(stack, "verifier")
    results = run(_all(stack.gateway))
    for (ids, _, last), ref in zip(results, reference):
        assert ids == ref
    accepted = sum(r[2].usage.accepted_tokens for r in results)
    rounds = sum(r[2].usage.rounds for r in results)
    # the head drafts only from the features the verifier sent it: acceptance proves they arrived intact
    assert accepted > 0 and (accepted + rounds) / rounds > 1.3
    after = metrics(stack, "verifier")
    sent = 'tandem_verifier_draft_calls_total{outcome="sent"}'
    assert after[sent] > before.get(sent, 0)
    assert after['tandem_verifier_draft_calls_total{outcome="failed"}'] == 0


def test_seeded_sampling_is_reproducible(stack):
    """One stream at a time: whether a request speculates in a round depends on how many run beside it (the
    batch policy, --spec-max-batch), and a round with drafts draws its coins otherwise than one without."""
    def once(seed):
        return run(generate(stack.gateway, chat_request(TEXTS[1], N, ignore_eos=True, temperature=0.8, seed=seed)))

    first, again, other = once(11), once(11), once(12)
    assert first[0] == again[0] and len(first[0]) == N
    assert first[0] != other[0]
    assert first[2].usage.accepted_tokens > 0  # drafts from the drafter service took part


def test_a_killed_drafter_costs_drafts_not_requests(stack, reference):
    """The drafter dies while streams run: they finish, equal to plain greedy (their rounds without drafts decode
    plainly); once it is back, the verifier sends the requests' whole history again and drafting resumes."""
    async def streams_with_a_kill():
        tasks = [asyncio.create_task(generate(stack.gateway, chat_request(t, N, ignore_eos=True))) for t in TEXTS]
        await asyncio.sleep(0.5)
        stack.kill("drafter")
        return await asyncio.gather(*tasks)

    for (ids, _, last), ref in zip(run(streams_with_a_kill()), reference):
        assert ids == ref and last.finish_reason
    stack.start_one("drafter")
    stack.wait_ready()
    before = _drafted(stack)
    for (ids, _, _), ref in zip(run(_all(stack.gateway)), reference):
        assert ids == ref
    assert _drafted(stack) > before  # drafting resumed on the restarted drafter
    m = metrics(stack, "verifier")
    assert m['tandem_verifier_draft_calls_total{outcome="failed"}'] >= 1


def test_a_drafter_that_cannot_start_fails_the_start_at_once():
    """The verifier waits for its drafter; a drafter that exits meanwhile ends the stack's start with its name, not
    after the verifier's wait (--drafter-connect-s) runs out."""
    with pytest.raises(RuntimeError, match="drafter exited with code"):
        start_stack(direct_draft=True, draft="none")  # the drafter service refuses to run without a drafter


def test_a_cancelled_stream_frees_its_state_on_both_services(stack):
    """A client that goes away mid-stream: the verifier frees the request's KV and tells the drafter, which drops
    its history and the head's KV."""
    async def cancel_one():
        from protos.tandem.v1 import gateway_pb2_grpc

        async with stack.gateway.channel() as ch:
            call = gateway_pb2_grpc.GatewayStub(ch).Generate(chat_request(TEXTS[2], 2000, ignore_eos=True),
                                                             metadata=stack.gateway.metadata)
            n = 0
            async for _ in call:
                n += 1
                if n == 4:  # a few rounds in: the drafter holds the request too
                    break
            held = (await asyncio.to_thread(metrics, stack, "drafter"))["tandem_drafter_running"]
            call.cancel()
            return held

    assert run(cancel_one()) >= 1
    _wait_for(lambda: metrics(stack, "verifier")["tandem_verifier_running"] == 0, what="the verifier's KV freed")
    _wait_for(lambda: metrics(stack, "drafter")["tandem_drafter_running"] == 0, what="the drafter's state freed")
