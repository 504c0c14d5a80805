"""A drafter service as the verifier's own drafter: split mode with the rounds run by the verifier.

``tandem verifier --direct-drafter-address HOST:PORT`` drafts through this class instead of an embedded drafter.
It is an engine ``Drafter``: the decoder asks it for a round's drafts exactly as it asks an embedded one, and it
sends one ``DraftRequest`` to the drafter service for all the round's rows, over a ``DraftStream`` kept
open across rounds (no per-call setup on the round's path). So the verifier runs rounds back
to back for its Serve streams as co-located serving does; the gateway never calls the drafter, and a round
costs one verify and one Draft call, not the gateway's Draft and Verify calls and their per-request messages.

Per request it sends only what the drafter has not seen: the committed tokens past those it sent last time,
and the target features (an EAGLE head) queued since, at most ``feature_window`` of the latest. Request ids on
the drafter carry a tag of this process and a serial number, so verifiers sharing one drafter never name each
other's requests and a request never meets the state of an earlier one that had its id.

The drafter is never on the critical path for correctness: a failed or late ``Draft`` (past ``timeout_s``)
means no drafts this round (the target decodes those rows plainly) and no call for ``retry_s``; a drafter that
restarted asks for a resync (``DRAFT_STATUS_RESYNC``) and is sent those requests' whole history in a second
call of the same round; a row the drafter refuses gets no drafts, and its error is logged.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from typing import Sequence

import grpc
import torch

from engine.drafters.base import DraftProposal, DraftRequest, FeatureQueue
from protos.tandem.v1 import common_pb2, drafter_pb2, drafter_pb2_grpc
from rpc import convert, tensors
from rpc.server import client_options
from rpc.tls import Identity

log = logging.getLogger("tandem.verifier")


class DrafterUnavailable(RuntimeError):
    """The drafter service did not answer Describe in time (at start-up)."""


def open_channel(address: str, max_message_bytes: int, identity: Identity | None) -> grpc.Channel:
    """A blocking channel to the drafter: mutual TLS with this verifier's identity (None: plaintext)."""
    options = client_options(max_message_bytes)
    if identity is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, identity.channel_credentials(), options=options)


class RemoteDrafter:
    graph_rounds = False  # drafts arrive from another process: the rounds verify them outside a fused graph
    tree_rounds = False
    primes = False
    batch_weight = 2  # two RPCs a round; the guard (engine/policy.py SpecGuard) times its rounds within the limit

    def __init__(self, address: str, vocab_size: int, *, channel: grpc.Channel, timeout_s: float = 2.0,
                 retry_s: float = 1.0, feature_window: int = 1024, connect_timeout_s: float = 300.0,
                 stream: bool = True) -> None:
        self.address = address
        self.vocab = vocab_size
        self.stub = drafter_pb2_grpc.DrafterStub(channel)
        self.timeout = timeout_s
        self.retry_s = retry_s
        self.window = feature_window
        self.tag = secrets.token_hex(4)   # this process's prefix for its request ids on the drafter
        self.sent: dict[str, int] = {}    # committed tokens of each request the drafter is known to hold
        self.keys: dict[str, str] = {}    # the id on the drafter of each request ever sent to it (``_key``)
        self.serial = 0
        self.down_until = 0.0              # monotonic time before which no Draft is sent
        self.calls = self.failures = self.resyncs = 0
        self.call_s = 0.0                  # wall time in Draft calls (for tandem_verifier_draft_call_seconds)
        self._stream: DraftStream | None = None
        self.stream = stream               # False: one unary Draft call a round, made on the caller's thread
        info = self._describe(connect_timeout_s)
        self.name = f"remote:{info.name}"
        self.deterministic = info.deterministic
        self.target_features = tuple(info.feature_layers)
        self.feature_size = info.feature_size

    def _describe(self, timeout_s: float) -> drafter_pb2.DrafterInfo:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.stub.Describe(drafter_pb2.DescribeRequest(), timeout=5.0, wait_for_ready=True)
            except grpc.RpcError as exc:
                if time.monotonic() >= deadline:
                    raise DrafterUnavailable(f"direct_drafter_address: no drafter answered at {self.address} within "
                                             f"{timeout_s:.0f} s ({exc.code().name}: {exc.details()})") from None
                log.info("verifier: waiting for the drafter at %s (%s)", self.address, exc.code().name)
                time.sleep(1.0)

    def _key(self, request_id: str) -> str:
        """The request's id on the drafter: unique to this process and to this request (the verifier reuses a Serve
        stream's ids for later requests; a new one must not meet the old one's state, its draft noise above all)."""
        key = self.keys.get(request_id)
        if key is None:
            self.serial += 1
            key = self.keys[request_id] = f"{self.tag}/{self.serial}/{request_id}"
        return key

    def _item(self, r: DraftRequest, start: int) -> drafter_pb2.DraftItem:
        item = drafter_pb2.DraftItem(request_id=self._key(r.request_id), start=start,
                                     tokens=tensors.encode(r.token_ids[start:], "int32"), k=r.k,
                                     sampling=convert.sampling_to_pb(r.params))
        if r.features is not None and r.features.shape[0]:
            fstart, feats = FeatureQueue(r.features_start, r.features).take(self.window)  # the latest ``window``
            item.features.CopyFrom(tensors.encode(feats, "bfloat16"))
            item.features_start = fstart
        return item

    def _call(self, items: list[drafter_pb2.DraftItem]) -> list[drafter_pb2.DraftResult] | None:
        self.calls += 1
        t0 = time.perf_counter()
        try:
            if not self.stream:
                return list(self.stub.Draft(drafter_pb2.DraftRequest(items=items), timeout=self.timeout).results)
            if self._stream is None:
                self._stream = DraftStream(self.stub)
            return list(self._stream.ask(drafter_pb2.DraftRequest(items=items), self.timeout).results)
        except (grpc.RpcError, TimeoutError, ConnectionError) as exc:
            self.failures += 1
            self.down_until = time.monotonic() + self.retry_s
            self.sent.clear()  # whatever it held may be gone: the next call resends every history
            if self._stream is not None:
                self._stream.close()  # a late answer must not be read as the next call's
                self._stream = None
            why = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.RpcError) else str(exc)
            log.warning("verifier: Draft to %s failed (%s); plain decoding for %.1f s", self.address, why,
                        self.retry_s)
            return None
        finally:
            self.call_s += time.perf_counter() - t0

    def propose(self, requests: Sequence[DraftRequest]) -> DraftProposal:
        """One Draft call for every row (a second for rows the drafter lost) -> drafts; none where it failed."""
        n = len(requests)
        tokens: list[list[int]] = [[] for _ in range(n)]
        if not n or time.monotonic() < self.down_until:
            return DraftProposal(tokens, None)
        starts = [min(self.sent.get(r.request_id, 0), len(r.token_ids)) for r in requests]
        results = self._call([self._item(r, s) for r, s in zip(requests, starts)])
        if results is None:
            return DraftProposal(tokens, None)
        lost = [i for i, res in enumerate(results) if res.status == drafter_pb2.DRAFT_STATUS_RESYNC]
        if lost:
            self.resyncs += len(lost)
            again = self._call([self._item(requests[i], 0) for i in lost])
            for i, res in zip(lost, again or [None] * len(lost)):
                results[i] = res
        probs = None
        for i, (r, res) in enumerate(zip(requests, results)):
            if res is None or res.status != drafter_pb2.DRAFT_STATUS_OK:
                self.sent.pop(r.request_id, None)
                if res is not None:
                    log.warning("verifier: the drafter refused %s: %s", r.request_id, res.error)
                continue
            self.sent[r.request_id] = len(r.token_ids)
            try:
                drafts = tensors.token_ids(res.tokens, "tokens")[: r.k]
                if res.HasField("probs") and not r.params.greedy and drafts:
                    q = convert.draft_probs_from_pb(res.probs, drafts, self.vocab, "probs")
                    if probs is None:
                        probs = torch.zeros(n, max(x.k for x in requests), self.vocab)
                    probs[i, : len(drafts)] = q
            except ValueError as exc:  # a malformed answer costs that row its drafts, nothing else
                log.warning("verifier: the drafter's answer for %s is malformed: %s", r.request_id, exc)
                continue
            tokens[i] = drafts
        return DraftProposal(tokens, probs)

    def release(self, request_id: str) -> None:
        """Forget the request here and tell the drafter without waiting (its lease frees it if this is lost): also
        after a failed call, which may have left the request's history there."""
        self.sent.pop(request_id, None)
        key = self.keys.pop(request_id, None)
        if key is None:
            return
        future = self.stub.Release.future(common_pb2.ReleaseRequest(request_ids=[key]), timeout=self.timeout)
        future.add_done_callback(_log_failure)

    def capture_prefills(self) -> int:
        return 0  # the drafter service captures its own graphs

    def stats(self) -> dict[str, int]:
        """Draft calls sent, of them failed, and rows sent again whole (the drafter had lost them)."""
        return {"sent": self.calls, "failed": self.failures, "resynced": self.resyncs}


_END = object()


class DraftStream:
    """One ``DraftStream`` call, kept open across rounds: ``ask`` sends a DraftRequest and waits (at most
    ``timeout`` seconds) for its DraftResponse, which a reader thread hands over in order."""

    def __init__(self, stub: drafter_pb2_grpc.DrafterStub) -> None:
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._responses: queue.SimpleQueue = queue.SimpleQueue()
        self.call = stub.DraftStream(iter(self._requests.get, _END))
        threading.Thread(target=self._read, name="drafter-stream", daemon=True).start()

    def _read(self) -> None:
        try:
            for response in self.call:
                self._responses.put(response)
            self._responses.put(ConnectionError("the drafter ended the stream"))
        except grpc.RpcError as exc:
            self._responses.put(exc)

    def ask(self, request: drafter_pb2.DraftRequest, timeout: float) -> drafter_pb2.DraftResponse:
        self._requests.put(request)
        try:
            out = self._responses.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no answer within {timeout} s") from None
        if isinstance(out, Exception):
            raise out
        return out

    def close(self) -> None:
        self._requests.put(_END)
        self.call.cancel()


def _log_failure(future: grpc.Future) -> None:
    if future.exception() is not None:
        log.debug("verifier: Release on the drafter failed: %s", future.exception())
