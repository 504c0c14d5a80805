"""Replica pools without a model: address settings, discovery, least-loaded pinning, health, lost verifiers."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gateway.clients import Verdict
from gateway.discovery import Discovery, Target, parse_targets, resolve_host
from gateway.replicas import ReplicaPool
from gateway.requests import GatewayRequest
from gateway.settings import GatewaySettings
from gateway.verifiers import Verifiers
from engine.config import SamplingParams
from rpc.settings import load


class FakeClient:
    def __init__(self, address: str) -> None:
        self.address = address
        self.released: list[str] = []

    async def release(self, ids) -> None:
        self.released += ids


def make(address: str):
    return grpc.aio.insecure_channel(address), FakeClient(address)


def pool_of(*addresses: str, resolver=None, probe_s: float = 0.05) -> ReplicaPool:
    targets = [t for a in addresses for t in parse_targets(a)]
    discovery = Discovery(targets) if resolver is None else Discovery(targets, resolver)
    return ReplicaPool("verifier", discovery, make, probe_s=probe_s, discovery_s=probe_s)


async def discovered(pool: ReplicaPool, up: bool = True) -> ReplicaPool:
    await pool.discover()
    for rep in pool.replicas.values():
        rep.up = up
    return pool


# ------------------------------------------------------------------------------------ settings



async def two_verifiers() -> tuple[ReplicaPool, Verifiers]:
    """Two discovered fake verifiers behind a Verifiers driver that prefills through client.prefill."""
    pool = pool_of("127.0.0.1:1,127.0.0.1:2")
    pool.make = lambda a: (grpc.aio.insecure_channel(a), FakeVerifier(a))
    await discovered(pool)
    return pool, Verifiers(pool, lambda client, reqs: client.prefill(reqs))

def test_address_settings_take_lists_and_names():
    s = load(GatewaySettings, verifier_address="10.0.0.1:50052, tandem-verifier-headless:50052,[::1]:7")
    assert s.verifier_targets() == [Target("10.0.0.1", 50052), Target("tandem-verifier-headless", 50052),
                                    Target("::1", 7)]
    assert load(GatewaySettings).drafter_targets() == [Target("localhost", 50053)]


@pytest.mark.parametrize("value, message", [
    ("verifier", "is not host:port"), ("a:1,", "empty entry"), ("a:0", "port '0'"), ("a:http", "port 'http'"),
    ("::1:5", "brackets"), ("[nope]:5", "not an IPv6 address"), ("dns:///v:1", "without a scheme"),
    ("a b:1", "not a host name"), ("a:1,a:1", "listed twice"), ("", "at least one")])
@pytest.mark.parametrize("field", ["verifier_address", "drafter_address"])
def test_bad_address_settings_name_the_field(field, value, message):
    with pytest.raises(ValueError) as exc:
        load(GatewaySettings, **{field: value})
    assert str(exc.value).startswith(f"{field}:") and message in str(exc.value)


# ------------------------------------------------------------------------------------ discovery


def test_a_name_resolves_to_its_replicas():
    assert asyncio.run(resolve_host("localhost", 4321)) == ["127.0.0.1:4321"]  # IPv4 only: one replica
    assert asyncio.run(resolve_host("no-such-host.invalid", 1)) == []
    addresses = asyncio.run(Discovery(parse_targets("localhost:1,127.0.0.2:2,[::1]:3")).addresses())
    assert addresses == ["127.0.0.1:1", "127.0.0.2:2", "[::1]:3"]


def test_replicas_follow_dns_and_drain():
    answers = {"v": ["127.0.0.11:5", "127.0.0.12:5"]}

    async def resolver(host, port):
        if answers[host] is None:
            raise OSError("SERVFAIL")
        return answers[host]

    async def scenario():
        pool = await discovered(pool_of("v:5", resolver=resolver))
        assert sorted(pool.replicas) == ["127.0.0.11:5", "127.0.0.12:5"] and pool.discovery.dynamic
        a = pool.pin("r1")
        gone = a.address
        answers["v"] = [x for x in ["127.0.0.11:5", "127.0.0.12:5", "127.0.0.13:5"] if x != gone]
        await pool.refresh()  # (the health checks fail: nothing listens; draining is about DNS)
        assert pool.replicas[gone].draining and pool.pinned("r1") is a  # keeps its request
        for rep in pool.replicas.values():
            rep.up = True
        assert all(pool.pin(f"n{i}").address != gone for i in range(6))  # takes no new ones
        answers["v"] = None  # a failed lookup keeps the last answer
        await pool.discover()
        assert len(pool.replicas) == 3
        await pool.release(["r1"])
        await pool.refresh()
        assert gone not in pool.replicas  # drained: closed
        await pool.close()

    asyncio.run(scenario())


# ------------------------------------------------------------------------------------ pinning


def test_new_requests_go_to_the_least_loaded_replica():
    async def scenario():
        pool = await discovered(pool_of("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"))
        a, b, c = pool.replicas.values()
        for i in range(6):
            pool.pin(f"r{i}")
        assert [r.load for r in (a, b, c)] == [2, 2, 2]
        done = sorted(a.pins)
        await pool.release(done)
        assert a.load == 0 and a.client.released == done and pool.pin("new") is a  # the least loaded
        assert pool.pin("new2") is a and [r.load for r in (a, b, c)] == [2, 2, 2]
        b.up = False  # down: never chosen; its requests move on their next pin
        moved = sorted(b.pins)
        for rid in moved:
            assert pool.pin(rid) in (a, c)
        assert b.load == 0 and b.orphans == set(moved) and pool.moved == len(moved)
        c.draining = True  # gone from DNS: no new requests
        assert pool.pin("x") is a
        a.up = False
        assert pool.pin("y") is None and pool.pinned("y") is None  # nothing left to take it
        await pool.close()

    asyncio.run(scenario())


async def _health_server(status) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await servicer.set("", status)
    return server, servicer, port


def test_health_checks_bring_replicas_down_and_up():
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING

    async def scenario():
        (s1, h1, p1), (s2, h2, p2) = await _health_server(serving), await _health_server(not_serving)
        pool = pool_of(f"127.0.0.1:{p1},localhost:{p2}")
        await pool.refresh()
        a, b = pool.replicas[f"127.0.0.1:{p1}"], pool.replicas[f"127.0.0.1:{p2}"]
        assert a.up and not b.up
        assert pool.pin("r1") is a
        await h1.set("", not_serving)
        await pool.refresh()
        assert a.up  # one failed check is not enough
        await pool.refresh()
        assert not a.up
        await h2.set("", serving)
        await pool.refresh()
        assert b.up and pool.pin("r1") is b and a.orphans == {"r1"}
        await h1.set("", serving)
        await pool.refresh()
        assert a.up and a.client.released == ["r1"] and not a.orphans  # freed before it takes new requests
        await pool.close()
        await s1.stop(None)
        await s2.stop(None)

    asyncio.run(scenario())


# ------------------------------------------------------------------------------------ lost verifiers


def _req(i: int) -> GatewayRequest:
    """A request whose gateway key (what pins it and names it to the verifiers) reads like its label."""
    return GatewayRequest(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=8), 2048, output_ids=[7] * i, key=f"r{i}")


def _ok(r: GatewayRequest, token: int) -> Verdict:
    return Verdict(r.request_id, [token], "", 0, 0, None)


class FakeVerifier(FakeClient):
    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.fail: grpc.StatusCode | None = None
        self.prefilled: list[tuple[str, int]] = []
        self.lost: set[str] = set()

    def _maybe_fail(self):
        if self.fail is not None:
            raise grpc.aio.AioRpcError(self.fail, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone")

    async def prefill(self, reqs):
        self._maybe_fail()
        self.prefilled += [(r.request_id, len(r.output_ids)) for r in reqs]
        return [_ok(r, 100) for r in reqs]

    async def verify(self, reqs):
        self._maybe_fail()
        return [Verdict(r.request_id, [], "", 0, 0, None, "not running here", grpc.StatusCode.NOT_FOUND)
                if r.request_id in self.lost else _ok(r, 200) for r in reqs]


def test_a_lost_verifiers_requests_are_prefilled_again_elsewhere():
    async def scenario():
        pool, verifiers = await two_verifiers()
        reqs = [_req(i) for i in range(4)]
        assert [v.committed for v in await verifiers.prefill(reqs)] == [[100]] * 4
        a, b = pool.replicas["127.0.0.1:1"], pool.replicas["127.0.0.1:2"]
        assert a.load == b.load == 2

        def verify(client, idx):
            return client.verify([reqs[i] for i in idx])

        on_a = set(a.pins)
        a.client.fail = grpc.StatusCode.UNAVAILABLE
        verdicts = await verifiers.call(reqs, verify)
        # a's requests: prefilled on b with their output so far, that prefill is their verdict; b's: verified
        assert [v.request_id for v in verdicts] == [r.request_id for r in reqs]
        assert [v.committed for v in verdicts] == [[100] if r.request_id in on_a else [200] for r in reqs]
        assert {(r.request_id, len(r.output_ids)) for r in reqs if r.request_id in on_a} <= set(b.client.prefilled)
        assert not a.up and b.load == 4 and pool.moved == 2 and not any(v.error for v in verdicts)
        assert a.orphans == on_a  # released there if it comes back
        b.client.lost = {"r0"}  # b restarted and no longer knows r0: only r0 is prefilled again
        before = len(b.client.prefilled)
        verdicts = await verifiers.call(reqs, verify)
        assert verdicts[0].committed == [100] and b.client.prefilled[before:] == [("r0", 0)]
        assert [v.committed for v in verdicts[1:]] == [[200]] * 3
        b.client.fail = grpc.StatusCode.UNAVAILABLE  # the last verifier: nothing left, "not now" for every request
        verdicts = await verifiers.call(reqs, verify)
        assert all(v.error_code == grpc.StatusCode.UNAVAILABLE for v in verdicts)
        await pool.close()

    asyncio.run(scenario())


def test_a_call_past_its_deadline_is_a_busy_verifier_not_a_lost_one():
    """A long prefill outlasting its deadline fails that call's requests alone (DEADLINE_EXCEEDED); the verifier
    stays up and keeps the others (issue 22: one long prompt marked the only verifier down, failing every stream)."""
    async def scenario():
        pool, verifiers = await two_verifiers()
        reqs = [_req(i) for i in range(4)]
        await verifiers.prefill(reqs)
        a = pool.replicas["127.0.0.1:1"]
        a.client.fail = grpc.StatusCode.DEADLINE_EXCEEDED
        verdicts = await verifiers.call(reqs, lambda client, idx: client.verify([reqs[i] for i in idx]))
        for r, v in zip(reqs, verdicts):
            on_a = pool.pinned(r.request_id) is a
            assert (v.error_code == grpc.StatusCode.DEADLINE_EXCEEDED) == on_a and (v.committed == [200]) != on_a
        assert a.up and pool.moved == 0
        await pool.close()

    asyncio.run(scenario())


def test_other_verifier_errors_fail_only_that_replicas_requests():
    async def scenario():
        pool, verifiers = await two_verifiers()
        reqs = [_req(i) for i in range(4)]
        await verifiers.prefill(reqs)
        a = pool.replicas["127.0.0.1:1"]
        a.client.fail = grpc.StatusCode.INTERNAL
        verdicts = await verifiers.call(reqs, lambda client, idx: client.verify([reqs[i] for i in idx]))
        for r, v in zip(reqs, verdicts):
            assert (v.error_code == grpc.StatusCode.INTERNAL) == (pool.pinned(r.request_id) is a)
        assert a.up
        await pool.close()

    asyncio.run(scenario())


def test_a_call_to_a_verifier_that_hangs_is_given_up_when_it_goes_down():
    async def scenario():
        pool, verifiers = await two_verifiers()
        reqs = [_req(i) for i in range(2)]
        await verifiers.prefill(reqs)
        a = pool.pinned("r0")
        hung = asyncio.Event()

        async def verify(client, idx):
            if client is a.client:
                hung.set()
                await asyncio.sleep(3600)  # frozen: no answer, no error before the deadline
            return await client.verify([reqs[i] for i in idx])

        call = asyncio.create_task(verifiers.call(reqs, verify))
        await hung.wait()
        pool.mark_down(a, "failed 2 health checks")
        verdicts = await asyncio.wait_for(call, 5)
        assert verdicts[0].committed == [100] and pool.pinned("r0") is not a  # prefilled again elsewhere
        assert verdicts[1].committed == [200]
        await pool.close()

    asyncio.run(scenario())
