"""Whether a round speculates: by what a round costs at this batch size and what its requests accept.

A fused round costs about the same whatever each row's ``num_draft`` (the graph verifies k + 1 positions a row
either way), so the choice that changes the cost is per round: the speculative graph (every row k drafts) or the
plain one (k 0). The rule, per round of B rows:

    speculate  iff  tau * (plain(B) + host_plain(B))  >=  margin * (spec(B) + host_spec(B))

- ``spec(B)``, ``plain(B)``: the GPU time of one replay of each graph's rows bucket, per forward (a plain round of
  several steps is a token's cost), timed right after it was captured (``GraphStore.replay_ms``);
- ``host_*(B)``: the host's share of a round of that bucket, learned for each graph from the rounds the engine runs
  (an EWMA of the round's wall time minus its replay; with rounds launched ahead it shrinks to what the GPU does
  not hide; rounds where a request entered the graph, its drafter's first drafts made eagerly, are not counted);
  a graph not run yet at that size takes the other's share;
- ``tau``: tokens a row is expected to commit per speculative round: the mean over the running requests of each
  one's own acceptance once it has speculated 16 rounds (weighed against a prior of 2.0 as if that were 2 rounds of
  its own), 2.0 before: every new request speculates until its own figure can decide;
- ``margin`` (1.05): speculation must promise 5% to be chosen, so a misestimate stays near 1.0x plain.

Where a bucket was not timed (no GPU, or its graphs were never captured) the rule is ``spec_max_batch``. The chosen k
per rows bucket is kept for the metrics (``chosen``).

The default rule (``--spec-policy max-batch``) is ``spec_max_batch`` alone: speculate while the running requests'
``spec_load`` is at most it, a greedy request weighing its drafter's ``batch_weight`` (1 for the EAGLE head, 5 for the
n-gram lookup, 2 for a drafter service) and a sampled one ``SAMPLED_LOAD`` times that. A sampled row's speculative
round costs more (its drafts' q in and out of the graph, rejection sampling over the vocabulary) and accepts less
(2.1 tokens a round against 2.7 greedy with the EAGLE head on ShareGPT); served on an H200 with
``spec_max_batch`` 8 (bench/RESULTS.md, issue 23), greedy speculation gained at 4 and 8 requests, sampled (T 0.7) at
4 and not at 8; on an H100, once an arrival's first drafts came from the round itself, greedy gained at 16 and
sampled at 8 neither gained nor lost: the default is 16.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, Sequence

log = logging.getLogger("tandem.engine")

MARGIN = 1.05       # the promised speedup speculation needs
PRIOR_TAU = 2.0     # tokens per row per speculative round a request is credited with before its own rounds
HOST_EWMA = 0.2     # weight of a new round's host time
TAU_EWMA = 0.05     # weight of a new speculative round's mean tokens per row (the reported running mean)
PRIOR_ROUNDS = 2    # the prior weighs as much as this many rounds of a request's own
MIN_ROUNDS = 16     # speculative rounds of its own before a request's acceptance counts
SAMPLED_LOAD = 2    # what a sampled request weighs against spec_max_batch (a greedy one: 1)
GUARD_ROUNDS = 4    # speculative rounds of a rows bucket the guard sees before their cost decides
GUARD_PROBE_S = 30.0  # how long the guard trusts a bucket's measured speculative rounds; then it measures again


def rows_bucket(buckets: Sequence[int], rows: int) -> int:
    """The smallest of ``buckets`` (ascending) that holds ``rows`` rows (the largest where none does)."""
    return next((b for b in buckets if b >= rows), buckets[-1])


def spec_load(greedy: Iterable[bool], weight: int = 1) -> int:
    """The running requests' weight against ``spec_max_batch`` (``greedy``: each request's params.greedy; ``weight``:
    what one greedy request weighs with the decoder's drafter, its ``batch_weight``)."""
    return weight * sum(1 if g else SAMPLED_LOAD for g in greedy)


class SpecPolicy:
    def __init__(self, k: int, buckets: Sequence[int], fallback_max_batch: int) -> None:
        self.k, self.buckets, self.fallback = k, tuple(buckets), fallback_max_batch
        self.spec_ms: dict[int, float] = {}   # rows bucket -> GPU ms of a speculative replay
        self.plain_ms: dict[int, float] = {}  # rows bucket -> GPU ms of a plain replay
        self.host_ms: dict[bool, dict[int, float]] = {True: {}, False: {}}  # speculative? -> bucket -> EWMA ms
        self.tau = PRIOR_TAU                  # the running mean over speculative rounds (reported, not decided on)
        self.chosen: dict[int, int] = {}      # rows bucket -> the k chosen for its last round (0: plain)
        self.last_k = k                       # the k chosen last

    def bucket(self, rows: int) -> int:
        return rows_bucket(self.buckets, rows)

    def timed(self, spec_ms: dict[int, float], plain_ms: dict[int, float]) -> None:
        """The replay times of the captured graphs, by rows bucket."""
        self.spec_ms.update(spec_ms)
        self.plain_ms.update(plain_ms)

    def measured(self, rows: int) -> bool:
        b = self.bucket(rows)
        return b in self.spec_ms and b in self.plain_ms

    def speculate(self, rows: int, taus: Iterable[float | None]) -> bool:
        """Whether a round of ``rows`` rows speculates; ``taus``: each request's own acceptance (None: unknown)."""
        b = self.bucket(rows)
        tau = self.tau
        if not self.measured(rows):
            yes = rows <= self.fallback
        else:
            known = [PRIOR_TAU if t is None else t for t in taus] or [PRIOR_TAU]
            tau = sum(known) / len(known)
            yes = tau * (self.plain_ms[b] + self.host(False, b)) >= MARGIN * (self.spec_ms[b] + self.host(True, b))
        k = self.k if yes else 0
        if self.chosen.get(b) != k:
            log.debug("batch policy: rounds of %d rows (bucket %d) %s: tau %.2f, spec %s ms, plain %s ms, speculative host %s ms",
                      rows, b, "speculate" if yes else "decode plainly", tau,
                      self.spec_ms.get(b), self.plain_ms.get(b), self.host_ms[True].get(b))
        self.chosen[b] = self.last_k = k
        return yes

    def host(self, speculative: bool, b: int) -> float:
        """The host's share of a round of bucket ``b`` on that graph: learned, else the other graph's (rounds launched
        ahead hide about as much of either), else 0."""
        own = self.host_ms[speculative].get(b)
        return own if own is not None else self.host_ms[not speculative].get(b, 0.0)

    def observe(self, speculative: bool, rows: int, round_ms: float) -> None:
        """A round of ``rows`` rows, all on one graph, took ``round_ms`` end to end on the host."""
        b = self.bucket(rows)
        replay = (self.spec_ms if speculative else self.plain_ms).get(b)
        if replay is None:
            return  # untimed bucket: the fallback rule decides there, and nothing is learned
        host = max(0.0, round_ms - replay)
        learned = self.host_ms[speculative]
        old = learned.get(b)
        learned[b] = host if old is None else (1 - HOST_EWMA) * old + HOST_EWMA * host

    def accepted(self, tokens_per_row: float) -> None:
        """A speculative round's rows committed this many tokens each on average."""
        self.tau = (1 - TAU_EWMA) * self.tau + TAU_EWMA * tokens_per_row

    def request_tau(self, accepted: int, drafted: int) -> float | None:
        """A request's expected tokens per speculative round: None (the prior) until it has drafted ``MIN_ROUNDS``
        rounds' worth (a request's first rounds after its prompt often accept little: they must not demote it for
        good), then its own rounds weighed against ``PRIOR_TAU`` as ``PRIOR_ROUNDS`` rounds."""
        rounds = drafted / self.k
        if rounds < MIN_ROUNDS:
            return None
        own = 1.0 + accepted / rounds
        return (PRIOR_ROUNDS * PRIOR_TAU + rounds * own) / (PRIOR_ROUNDS + rounds)


class SpecGuard:
    """The default rule's check where the drafter drafts outside the round's graph (a drafter service's, called over
    gRPC each round: verifier_svc/remote_drafter.py). Such a round costs the Draft call and an eager verify, which can
    take longer than the tokens it commits are worth: on an H200 at one request, a split round of 4.2 ms committed
    2.5 tokens where a plain token costs about 1 ms (bench/RESULTS.md, issue 21). Within ``spec_max_batch`` it lets a
    rows bucket speculate only while

        tau(B) * plain(B)  >=  MARGIN * spec(B)

    - ``spec(B)``: the mean wall time of the speculative rounds of that bucket it has seen (Draft call included),
      decided on once ``GUARD_ROUNDS`` were seen;
    - ``tau(B)``: the mean tokens a row committed in them;
    - ``plain(B)``: a plain token's cost at that bucket: the plain graph's replay timed at capture (a GPU), then
      learned from the plain rounds run (an EWMA of a round's wall time per token).
    Until both are known the bucket speculates (it is measuring), unless a smaller bucket was measured not to pay.
    A bucket's speculative figures are dropped and measured again once they are ``GUARD_PROBE_S`` old, at a moment
    no running request decodes plainly (the requests the guard stopped decode plainly to their end, as the batch
    policy's always do): a drafter that got faster is found after a lull in the load."""

    def __init__(self, buckets: Sequence[int], clock: Callable[[], float] = time.monotonic) -> None:
        self.buckets, self.clock = tuple(buckets), clock
        self.plain_ms: dict[int, float] = {}              # bucket -> ms of a plain token
        self.spec: dict[int, tuple[float, float, int]] = {}  # bucket -> (sum of round ms, sum of tokens/row, rounds)
        self.since: dict[int, float] = {}                 # bucket -> when its speculative figures started
        self.chosen: dict[int, bool] = {}                 # bucket -> its last verdict (for the logs)
        self.last = True                                  # the verdict last given (for the metrics)

    def bucket(self, rows: int) -> int:
        return rows_bucket(self.buckets, rows)

    def timed(self, plain_ms: dict[int, float]) -> None:
        """The plain graph's replay times by rows bucket (per token), before any request."""
        for b, ms in plain_ms.items():
            self.plain_ms.setdefault(b, ms)

    def speculate(self, rows: int, clean: bool = True) -> bool:
        """Whether rounds of ``rows`` rows should speculate. ``clean``: no running request decodes plainly, so the
        rounds to come can be measured: only then are figures older than ``GUARD_PROBE_S`` dropped (with requests
        decoding plainly beside them, new requests' rounds mix both graphs and measure neither)."""
        now = self.clock()
        if clean:
            for old in [b for b, t in self.since.items() if now - t > GUARD_PROBE_S]:
                del self.spec[old], self.since[old]
        b = self.bucket(rows)
        own = self._pays(b)
        # a bucket not measured yet does not speculate where a smaller one was measured not to pay: a drafter's round
        # grows with its rows (its Draft call, its eager verify) where a plain token hardly does
        yes = own if own is not None else all(self._pays(s) is not False for s in self.buckets if s < b)
        if self.chosen.get(b) != yes:
            spent, tokens, n = self.spec.get(b, (0.0, 0.0, 0))
            (log.debug if own is None else log.info)(
                "batch policy: rounds of %d rows (bucket %d) %s: %s", rows, b, "speculate" if yes else "decode plainly",
                ("measuring" if yes else "a smaller bucket does not pay") if own is None else
                f"a speculative round {spent / n:.2f} ms for {tokens / n:.2f} tokens a row, a plain token "
                f"{self.plain_ms[b]:.2f} ms")
        self.chosen[b] = self.last = yes
        return yes

    def _pays(self, b: int) -> bool | None:
        """Whether bucket ``b``'s speculative rounds were measured to pay (None: not measured)."""
        plain, (spent, tokens, n) = self.plain_ms.get(b), self.spec.get(b, (0.0, 0.0, 0))
        if plain is None or n < GUARD_ROUNDS:
            return None
        return tokens / n * plain >= MARGIN * spent / n

    def observe(self, speculative: bool, rows: int, round_ms: float, tokens_per_row: float) -> None:
        """A round of ``rows`` rows, all speculative (drafts from the drafter) or all plain, took ``round_ms`` on the
        host and committed ``tokens_per_row`` tokens a row (a plain round: its steps)."""
        b = self.bucket(rows)
        if not speculative:
            ms, old = round_ms / max(tokens_per_row, 1.0), self.plain_ms.get(b)
            self.plain_ms[b] = ms if old is None else (1 - HOST_EWMA) * old + HOST_EWMA * ms
            return
        spent, tokens, n = self.spec.get(b, (0.0, 0.0, 0))
        self.since.setdefault(b, self.clock())
        self.spec[b] = (spent + round_ms, tokens + tokens_per_row, n + 1)
