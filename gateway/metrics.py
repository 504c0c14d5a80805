"""Prometheus metrics of the gateway. Everything here is host data the round already has: no GPU sync."""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)


class GatewayMetrics:
    def __init__(self) -> None:
        self.acceptance_length = Histogram("tandem_acceptance_length", "tokens committed per request per round",
                                           buckets=tuple(range(1, 34)))
        self.tokens = Counter("tandem_generated_tokens", "tokens streamed to clients")
        self.tokens_per_s = Gauge("tandem_tokens_per_second", "tokens streamed per second over the last 10 s")
        self.ttft = Histogram("tandem_time_to_first_token_seconds", "arrival to first token", buckets=_LATENCY)
        self.itl = Histogram("tandem_inter_token_latency_seconds", "time between tokens of a stream",
                             buckets=_LATENCY)
        self.queue_depth = Gauge("tandem_queue_depth", "requests waiting for a batch slot")
        self.batch_size = Gauge("tandem_batch_size", "requests in the last round")
        self.rounds = Counter("tandem_rounds", "speculative rounds driven")
        self.draft_tokens = Counter("tandem_draft_tokens", "draft tokens sent for verification")
        self.accepted_tokens = Counter("tandem_accepted_tokens", "draft tokens the target accepted")
        self.round_seconds = Histogram("tandem_round_seconds", "wall time of a round at the gateway",
                                       buckets=_LATENCY)
        self.round_phase = Histogram("tandem_round_phase_seconds",
                                     "draft: waiting for Draft before Verify; verify: the Verify/Step call; "
                                     "wait: waiting for the early draft after Verify", ["phase"], buckets=_LATENCY)
        self.early = Counter("tandem_early_draft", "early drafts of round r+1 by outcome", ["outcome"])
        self.early_hit_rate = Gauge("tandem_early_draft_hit_rate", "share of early drafts that were used")
        self.requests = Counter("tandem_requests", "finished requests by finish reason", ["finish_reason"])
        self.drafter_up = Gauge("tandem_drafter_available", "1 while the drafter answers, 0 while degraded")
        self._window: deque[tuple[float, int]] = deque()
        self._window_tokens = 0
        self._hits = self._misses = 0

    def watch(self, pools) -> None:
        """Export the replica pools' state (read at each scrape)."""
        REGISTRY.register(ReplicaCollector(pools))

    def streamed(self, n: int, now: float) -> None:
        """``n`` tokens streamed at ``now``: the counter, and the 10-second rate kept as a running sum (this runs
        for every row of every round: it must not cost more with more traffic)."""
        self.tokens.inc(n)
        self._window.append((now, n))
        self._window_tokens += n
        while self._window and self._window[0][0] < now - 10.0:
            self._window_tokens -= self._window.popleft()[1]
        span = max(now - self._window[0][0], 1.0)
        self.tokens_per_s.set(self._window_tokens / span)

    def early_outcome(self, hits: int, misses: int) -> None:
        if hits:
            self.early.labels("hit").inc(hits)
        if misses:
            self.early.labels("miss").inc(misses)
        self._hits += hits
        self._misses += misses
        if self._hits + self._misses:
            self.early_hit_rate.set(self._hits / (self._hits + self._misses))

    @staticmethod
    def now() -> float:
        return time.perf_counter()


class ReplicaCollector:
    """Per replica (``service`` verifier or drafter, ``address`` ip:port): requests pinned there, and whether it
    takes new requests; per service: requests moved to another replica after theirs was lost."""

    def __init__(self, pools) -> None:
        self.pools = pools

    def collect(self):
        pinned = GaugeMetricFamily("tandem_replica_requests", "requests pinned to a replica (their state lives there)",
                                   labels=["service", "address"])
        up = GaugeMetricFamily("tandem_replica_up", "1 while a replica answers and takes new requests",
                               labels=["service", "address"])
        moved = CounterMetricFamily("tandem_requests_moved", "requests moved to another replica after theirs was "
                                                             "lost (verifier: prefilled again)", labels=["service"])
        for pool in self.pools:
            for rep in list(pool.replicas.values()):
                pinned.add_metric([pool.service, rep.address], rep.load)
                up.add_metric([pool.service, rep.address], 1.0 if rep.up and not rep.draining else 0.0)
            moved.add_metric([pool.service], pool.moved)
        yield pinned
        yield up
        yield moved
