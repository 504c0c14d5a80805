"""Requests pinned to verifier replicas; a lost verifier's requests are prefilled again elsewhere.

A request's KV cache lives in one verifier for all its rounds. ``prefill`` pins each new request
to the least-loaded verifier; ``call`` runs a round's RPC on each verifier's share of the batch,
the verifiers concurrently, and hands the verdicts back in batch order.

A verifier is lost when its RPC fails with UNAVAILABLE, when it fails its health checks
(``ReplicaPool``: a hung one is given up there, and its calls in flight with it), or, for one request,
when it answers that it does not hold that request (NOT_FOUND: it restarted). A call past its deadline
(a long prefill) is not a lost verifier: that call's requests fail alone, with DEADLINE_EXCEEDED. No request fails for that: its requests are prefilled again on
another verifier with their prompt and the output committed so far (``Prefill``'s ``output``), and
that prefill's verdict, the next token, is their verdict of the round, so each client stream goes
on without a gap or a repeat. Only when no verifier is left do they fail, with UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Sequence

import grpc

from gateway.clients import Verdict, VerifierClient
from gateway.replicas import Replica, ReplicaPool
from gateway.requests import GatewayRequest

log = logging.getLogger("tandem.gateway")

LOST = frozenset({grpc.StatusCode.UNAVAILABLE})  # a call past its deadline is a busy verifier, not a lost one

PrefillFn = Callable[[VerifierClient, Sequence[GatewayRequest]], Awaitable[list[Verdict]]]
CallFn = Callable[[VerifierClient, list[int]], Awaitable[list[Verdict]]]  # positions in the batch


def failed(r: GatewayRequest, code: grpc.StatusCode, message: str) -> Verdict:
    return Verdict(r.key, [], "", 0, 0, None, message, code)


class Verifiers:
    def __init__(self, pool: ReplicaPool[VerifierClient], prefill: PrefillFn) -> None:
        self.pool = pool
        self._prefill = prefill  # one verifier's Prefill of some requests (the driver's: feature layers, sizes)

    async def _run(self, rep: Replica[VerifierClient], reqs: Sequence[GatewayRequest],
                   call: Callable[[VerifierClient], Awaitable[list[Verdict]]]) -> list[Verdict] | None:
        """The call's verdicts; None when the verifier is lost; error verdicts for any other failure.

        A call still in flight when the verifier is marked down (its health checks failed: hung,
        not only gone) is given up at once rather than at its deadline.
        """
        task = asyncio.ensure_future(call(rep.client))
        gone = asyncio.ensure_future(rep.gone.wait())
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not task.done():
                task.cancel()
        if not task.done():
            return None
        try:
            return task.result()
        except grpc.aio.AioRpcError as exc:
            if exc.code() in LOST:
                self.pool.mark_down(rep, f"{exc.code().name}: {exc.details()}")
                return None
            log.error("verifier %s: %s: %s", rep.address, exc.code().name, exc.details())
            return [failed(r, exc.code(), f"verifier failed: {exc.details()}") for r in reqs]

    async def prefill(self, reqs: Sequence[GatewayRequest]) -> list[Verdict]:
        """Pin each request to the least-loaded verifier and prefill it there (prompt + output so far)."""
        out: list[Verdict | None] = [None] * len(reqs)
        todo = list(range(len(reqs)))
        while todo:  # each pass either finishes or loses a verifier, so this ends
            groups: dict[Replica[VerifierClient], list[int]] = {}
            for i in todo:
                rep = self.pool.pin(reqs[i].key)
                if rep is None:
                    out[i] = failed(reqs[i], grpc.StatusCode.UNAVAILABLE, "no verifier is available")
                else:
                    groups.setdefault(rep, []).append(i)
            results = await asyncio.gather(*(
                self._run(rep, [reqs[i] for i in idx], lambda c, idx=idx: self._prefill(c, [reqs[i] for i in idx]))
                for rep, idx in groups.items()))
            todo = []
            for idx, verdicts in zip(groups.values(), results):
                if verdicts is None:
                    todo += idx
                else:
                    for i, v in zip(idx, verdicts):
                        out[i] = v
        return out  # type: ignore[return-value]

    async def call(self, reqs: Sequence[GatewayRequest], fn: CallFn) -> list[Verdict]:
        """``fn(client, positions)`` on each verifier's share of the batch, concurrently; verdicts in batch order."""
        out: list[Verdict | None] = [None] * len(reqs)
        move: list[int] = []
        groups: dict[Replica[VerifierClient], list[int]] = {}
        for i, r in enumerate(reqs):
            rep = self.pool.pinned(r.key)
            if rep is not None and rep.up:
                groups.setdefault(rep, []).append(i)
            else:
                move.append(i)
        results = await asyncio.gather(*(self._run(rep, [reqs[i] for i in idx], lambda c, idx=idx: fn(c, idx))
                                         for rep, idx in groups.items()))
        for idx, verdicts in zip(groups.values(), results):
            if verdicts is None:
                move += idx
                continue
            for i, v in zip(idx, verdicts):
                if v.error and v.error_code == grpc.StatusCode.NOT_FOUND:  # restarted: it no longer holds this one
                    move.append(i)
                else:
                    out[i] = v
        if move:
            log.warning("prefilling %d requests again on other verifiers (prompt + output so far)", len(move))
            for i, v in zip(move, await self.prefill([reqs[i] for i in move])):
                out[i] = v
        return out  # type: ignore[return-value]

    async def release(self, ids: Sequence[str]) -> None:
        await self.pool.release(ids)
