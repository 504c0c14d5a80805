"""The replicas of one service (the verifiers, or the drafters) as the gateway sees them.

Each replica has its own channel and client, a health state and the requests pinned to it: a
request's KV cache (verifier) or drafting history (drafter) lives on one replica for all its
rounds, so the requests pinned to a replica are its load, and ``pin`` puts a request on the
least-loaded usable replica. A background task health-checks every replica (grpc.health.v1)
each probe period and resolves the address names again every discovery interval:

- a replica whose RPC fails (the caller calls ``mark_down``) or that fails two health checks
  in a row is **down**: the caller moves its requests at their next round (``pin`` again);
- a down replica that answers SERVING again is **up** once ``connect`` accepts it (for the
  drafters: Describe); requests moved away from it are released there then;
- a replica whose address left DNS (a pod no longer ready, or gone) **drains**: it takes no new
  requests, keeps those it has while it answers, and is closed once it has none.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Generic, Protocol, Sequence, TypeVar

import grpc

from gateway.clients import is_serving
from gateway.discovery import Discovery
from gateway.tasks import cancel_and_wait

log = logging.getLogger("tandem.gateway")

DOWN_AFTER = 2  # failed health checks in a row that make an up replica down


class Client(Protocol):
    async def release(self, ids: Sequence[str]) -> None: ...


C = TypeVar("C", bound=Client)


@dataclass(eq=False)
class Replica(Generic[C]):
    address: str
    channel: grpc.aio.Channel
    client: C
    up: bool = False          # answered SERVING and was accepted; False until its first health check
    draining: bool = False    # gone from DNS: no new requests
    unusable: str = ""        # why it can never be used (``connect`` said so): not checked again
    failures: int = 0         # health checks failed in a row
    gone: asyncio.Event = field(default_factory=asyncio.Event)  # set while down: calls in flight give up
    pins: set[str] = field(default_factory=set)     # requests whose state lives here
    orphans: set[str] = field(default_factory=set)  # requests no longer here (moved, or ended while it was down)

    @property
    def load(self) -> int:
        return len(self.pins)


class ReplicaPool(Generic[C]):
    def __init__(self, service: str, discovery: Discovery, make: Callable[[str], tuple[grpc.aio.Channel, C]], *,
                 probe_s: float, discovery_s: float,
                 connect: Callable[[Replica[C]], Awaitable[bool]] | None = None) -> None:
        self.service = service
        self.discovery = discovery
        self.make = make                  # address -> (channel, client)
        self.probe_s = probe_s
        self.discovery_s = discovery_s
        self.connect = connect            # may refuse a replica (False), setting ``unusable`` if it is for good
        self.replicas: dict[str, Replica[C]] = {}
        self.moved = 0                    # requests pinned again to another replica
        self._where: dict[str, Replica[C]] = {}
        self._task: asyncio.Task | None = None

    # ---------------------------------------------------------------- pinning
    @property
    def any_up(self) -> bool:
        return any(r.up for r in self.replicas.values())

    def pinned(self, request_id: str) -> Replica[C] | None:
        return self._where.get(request_id)

    def pin(self, request_id: str) -> Replica[C] | None:
        """(Re)pin a request to the least-loaded up replica that is not draining; None when there is none."""
        old = self.unpin(request_id)
        choices = [r for r in self.replicas.values() if r.up and not r.draining]
        new = min(choices, key=lambda r: (r.load, random.random())) if choices else None
        if old is not None and old is not new:
            old.orphans.add(request_id)
            self.moved += new is not None
        if new is not None:
            new.pins.add(request_id)
            new.orphans.discard(request_id)
            self._where[request_id] = new
        return new

    def unpin(self, request_id: str) -> Replica[C] | None:
        rep = self._where.pop(request_id, None)
        if rep is not None:
            rep.pins.discard(request_id)
        return rep

    def group(self, request_ids: Sequence[str]) -> dict[Replica[C], list[int]]:
        """Positions of the pinned requests, by replica (unpinned ones are left out)."""
        out: dict[Replica[C], list[int]] = {}
        for i, rid in enumerate(request_ids):
            rep = self._where.get(rid)
            if rep is not None:
                out.setdefault(rep, []).append(i)
        return out

    async def release(self, request_ids: Sequence[str]) -> None:
        """Requests that ended: unpin them and free their state where it lives (a down replica: once it is up)."""
        groups: dict[Replica[C], list[str]] = {}
        for rid in request_ids:
            rep = self.unpin(rid)
            if rep is not None:
                groups.setdefault(rep, []).append(rid)
        await asyncio.gather(*(self._release_on(rep, ids) for rep, ids in groups.items()))

    async def _release_on(self, rep: Replica[C], ids: list[str]) -> None:
        if not rep.up:
            rep.orphans.update(ids)
            return
        try:
            await rep.client.release(ids)
        except grpc.aio.AioRpcError as exc:
            log.warning("%s %s: release of %d requests failed: %s", self.service, rep.address, len(ids),
                        exc.code().name)
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                self.mark_down(rep, f"Release: {exc.code().name}")

    # ---------------------------------------------------------------- health
    def mark_down(self, rep: Replica[C], reason: str) -> None:
        if rep.up:
            log.warning("%s %s is down (%s): its %d requests move", self.service, rep.address, reason, rep.load)
        rep.up = False
        rep.failures = 0
        rep.gone.set()

    async def _check(self, rep: Replica[C]) -> None:
        if await is_serving(rep.channel, timeout_s=max(1.0, self.probe_s)):
            rep.failures = 0
            if not rep.up and (self.connect is None or await self.connect(rep)):
                await self._flush(rep)  # requests moved away while it was down are freed before it takes new ones
                rep.up = True
                rep.gone.clear()
                log.info("%s %s is up", self.service, rep.address)
        else:
            rep.failures += 1
            if rep.up and rep.failures >= DOWN_AFTER:
                self.mark_down(rep, f"failed {rep.failures} health checks")

    async def discover(self) -> None:
        addresses = await self.discovery.addresses()
        for a in addresses:
            rep = self.replicas.get(a)
            if rep is None:
                ch, client = self.make(a)
                self.replicas[a] = Replica(a, ch, client)
                log.info("%s replica %s found", self.service, a)
            elif rep.draining:
                rep.draining = False
                log.info("%s %s is back in discovery", self.service, a)
        for a, rep in self.replicas.items():
            if a not in addresses and not rep.draining:
                rep.draining = True
                log.info("%s %s left discovery: no new requests, closed after its %d requests", self.service, a,
                         rep.load)

    async def refresh(self, discover: bool = True) -> None:
        """Discover (optionally), check every replica, close drained ones, release orphans on replicas that are up."""
        if discover:
            await self.discover()
        await asyncio.gather(*(self._check(r) for r in self.replicas.values() if not r.unusable))
        for a, rep in list(self.replicas.items()):
            if rep.draining and not rep.pins:
                del self.replicas[a]
                await rep.channel.close()
        await asyncio.gather(*(self._flush(rep) for rep in self.replicas.values() if rep.up and rep.orphans))

    async def _flush(self, rep: Replica[C]) -> None:
        ids = sorted(rep.orphans)
        rep.orphans.clear()
        if ids:
            try:
                await rep.client.release(ids)
            except grpc.aio.AioRpcError as exc:
                log.warning("%s %s: release of %d moved requests failed: %s", self.service, rep.address, len(ids),
                            exc.code().name)

    async def wait_up(self, what: str) -> None:
        """Refresh until some replica is up (the gateway is not SERVING before a verifier is)."""
        said = -1e9
        while True:
            await self.refresh()
            if self.any_up:
                return
            if time.monotonic() - said >= 10:
                said = time.monotonic()
                log.info("waiting for %s at %s", what, ", ".join(str(t) for t in self.discovery.targets))
            await asyncio.sleep(self.probe_s)

    # ---------------------------------------------------------------- lifetime
    def start(self) -> None:
        self._task = asyncio.create_task(self._maintain(), name=f"{self.service}-replicas")

    async def _maintain(self) -> None:
        next_discovery = time.monotonic() + self.discovery_s
        while True:
            await asyncio.sleep(self.probe_s)
            discover = self.discovery.dynamic and time.monotonic() >= next_discovery
            if discover:
                next_discovery = time.monotonic() + self.discovery_s
            try:
                await self.refresh(discover)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s replicas: refresh failed", self.service)

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        for rep in self.replicas.values():
            await rep.channel.close()
