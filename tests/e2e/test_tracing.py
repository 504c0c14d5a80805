"""Traces from the three services reach a real OTLP/gRPC receiver: one span per round, linked end to end."""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.conftest import chat_request, generate, run, start_stack
from bench.otlp_receiver import OtlpReceiver

ROUND_ATTRS = ("spec.batch_size", "spec.k", "spec.drafted", "spec.accepted", "spec.acceptance_length", "spec.draft_ms",
               "spec.verify_ms", "spec.wait_ms", "spec.request_ids")


@pytest.fixture(scope="module")
def traced():
    """A split stack with the layer-skip drafter (sampled drafts carry their distribution), traced."""
    with OtlpReceiver() as rx:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint, "OTEL_EXPORTER_OTLP_INSECURE": "true",
               "OTEL_BSP_SCHEDULE_DELAY": "200"}
        stack = start_stack(draft="layerskip:4", k=3, extra_env=env)
        try:
            async def both():
                return await asyncio.gather(
                    generate(stack.gateway_address, chat_request("Name three rivers.", 24, ignore_eos=True)),
                    generate(stack.gateway_address, chat_request("Write a limerick.", 24, ignore_eos=True,
                                                                 temperature=0.7, seed=5)))
            results = run(both())
        finally:
            stack.stop()  # SIGTERM: each service flushes its spans on the way out
        spans = rx.wait_for(lambda s: {x.service_name for x in s} >= {"tandem-gateway", "tandem-verifier",
                                                                       "tandem-drafter"}
                            and sum(x.name == "tandem.request" for x in s) == 2)
        yield results, spans


def test_every_service_exports_under_its_own_name(traced):
    _, spans = traced
    assert {s.service_name for s in spans} == {"tandem-gateway", "tandem-verifier", "tandem-drafter"}


def test_one_round_span_per_round_with_attributes(traced):
    results, spans = traced
    rounds = {s.span_id: s for s in spans if s.name == "spec.round"}
    requests = {s.attributes["tandem.request_id"]: s for s in spans if s.name == "tandem.request"}
    for _ids, _, last in results:
        req = requests[last.request_id]
        linked = [rounds[span_id] for _, span_id in req.links]
        # usage.rounds counts the prefill too; every later round has one span, linked from the request
        assert len(linked) == last.usage.rounds - 1 > 0
        assert all(last.request_id in r.attributes["spec.request_ids"] for r in linked)
        accepted = sum(r.attributes["spec.accepted"][r.attributes["spec.request_ids"].index(last.request_id)]
                       for r in linked)
        assert accepted == last.usage.accepted_tokens
    for r in rounds.values():
        assert set(ROUND_ATTRS) <= set(r.attributes), r.attributes
        n = r.attributes["spec.batch_size"]
        assert len(r.attributes["spec.k"]) == len(r.attributes["spec.drafted"]) == len(r.attributes["spec.accepted"]) \
            == n
        # k is the stack's (3) but where the room left caps it; the drafted count is what was verified: at most k
        assert all(0 <= d <= k <= 3 for d, k in zip(r.attributes["spec.drafted"], r.attributes["spec.k"]))
        assert all(a <= d for a, d in zip(r.attributes["spec.accepted"], r.attributes["spec.drafted"]))
        assert r.attributes["spec.verify_ms"] > 0 and r.attributes["spec.acceptance_length"] >= 1.0
    assert any(k == 3 for r in rounds.values() for k in r.attributes["spec.k"])
    assert sum(len(req.links) for req in requests.values()) >= len(rounds)  # no round without a request


def test_rpc_spans_are_children_across_services(traced):
    _, spans = traced
    by_id = {s.span_id: s for s in spans}
    rounds = [s for s in spans if s.name == "spec.round"]
    for method, service in (("tandem.v1.Verifier/Verify", "tandem-verifier"),
                            ("tandem.v1.Drafter/Draft", "tandem-drafter")):
        servers = [s for s in spans if s.name == method and s.kind == "SERVER"]
        assert servers, f"no {method} server spans"
        for srv in servers:
            assert srv.service_name == service
            client = by_id[srv.parent_span_id]           # continued from the gateway's client span
            assert client.kind == "CLIENT" and client.service_name == "tandem-gateway"
            assert client.trace_id == srv.trace_id
            parent = by_id[client.parent_span_id]         # which belongs to a round (or the prefill)
            assert parent.name in ("spec.round", "spec.prefill")
    verify_parents = {by_id[by_id[s.parent_span_id].parent_span_id].span_id
                      for s in spans if s.name == "tandem.v1.Verifier/Verify" and s.kind == "SERVER"}
    assert verify_parents == {r.span_id for r in rounds}  # every round verified exactly once
    prefills = [s for s in spans if s.name == "tandem.v1.Verifier/Prefill" and s.kind == "SERVER"]
    assert prefills and all(by_id[by_id[p.parent_span_id].parent_span_id].name == "spec.prefill" for p in prefills)


def test_rounds_are_sampled_by_the_standard_sampler_variables_in_split_mode_with_direct_draft():
    """OTEL_TRACES_SAMPLER / _ARG thin the round spans (each round is a trace of its own): at a ratio of 0.5 some
    rounds of a stream are exported and some are not, and the stream is served the same. The stack is split mode
    with the verifier calling its drafter (tandem serve's default), so its round spans say who ran the rounds."""
    with OtlpReceiver() as rx:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint, "OTEL_EXPORTER_OTLP_INSECURE": "true",
               "OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_TRACES_SAMPLER": "traceidratio",
               "OTEL_TRACES_SAMPLER_ARG": "0.5"}
        stack = start_stack(draft="ngram", k=3, direct_draft=True, extra_env=env)
        try:
            ids, _, last = run(generate(stack.gateway, chat_request("Count from one to forty in words.", 64,
                                                                    ignore_eos=True)))
        finally:
            stack.stop()
        total = last.usage.rounds - 1  # the prefill is not a round of its own
        rx.wait_for(lambda s: any(x.name == "spec.round" for x in s))
        rounds = [s for s in rx.spans if s.name == "spec.round" and s.service_name == "tandem-gateway"]
    assert len(ids) == 64 and total >= 16
    assert 0 < len(rounds) < total, f"{len(rounds)} of {total} round spans exported at ratio 0.5"
    assert {r.attributes["spec.mode"] for r in rounds} == {"verifier-rounds"}


def test_where_the_verifier_runs_the_rounds_each_request_links_every_round_it_ran():
    """Split mode with the verifier calling its drafter (tandem serve's default): every round of a request, its last
    included, is linked from the request's span, and each round span lists exactly the requests it carried."""
    with OtlpReceiver() as rx:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint, "OTEL_EXPORTER_OTLP_INSECURE": "true",
               "OTEL_BSP_SCHEDULE_DELAY": "200"}
        stack = start_stack(draft="ngram", k=3, direct_draft=True, extra_env=env)
        try:
            async def both():
                return await asyncio.gather(
                    generate(stack.gateway, chat_request("Name three rivers.", 24, ignore_eos=True)),
                    generate(stack.gateway, chat_request("Write a limerick.", 40, ignore_eos=True)))
            results = run(both())
        finally:
            stack.stop()
        spans = rx.wait_for(lambda s: sum(x.name == "tandem.request" for x in s) == 2)
    rounds = {s.span_id: s for s in spans if s.name == "spec.round"}
    requests = {s.attributes["tandem.request_id"]: s for s in spans if s.name == "tandem.request"}
    for _, _, last in results:
        linked = [rounds[span_id] for _, span_id in requests[last.request_id].links]
        assert len(linked) == last.usage.rounds
        assert all(last.request_id in r.attributes["spec.request_ids"] for r in linked)
    for r in rounds.values():
        assert len(r.attributes["spec.request_ids"]) == r.attributes["spec.batch_size"] == len(r.attributes["spec.k"])
        assert r.parent_span_id == ""
