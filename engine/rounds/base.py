"""The typed data a round passes between its parts: the scheduler's ``RoundPlan``, the executors' ``RowResult``.

The scheduler (engine/scheduler.py) routes each row of a round to one executor and says why (``Reason``);
the executors (engine/rounds/eager.py, engine/rounds/fast_path.py) return one ``RowResult`` per row; the
decoder (engine/spec.py) commits the results to the requests in one place.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

if TYPE_CHECKING:
    from engine.request import Request


@dataclass(frozen=True)
class RoundItem:
    """One request's part of an eager round: its drafts and, for sampled requests, their distribution.

    ``prefill_chunk``: run only this many of the request's tokens not yet in the target's KV
    (chunked prefill). Fewer than all of them is a *partial* prefill: no drafts, nothing is
    verified or committed, the request's KV just grows; None runs them all.
    """

    request_id: str
    drafts: Sequence[int] = ()
    probs: torch.Tensor | None = None  # [len(drafts), V] q; None: one-hot drafts
    prefill_chunk: int | None = None


@dataclass(frozen=True)
class RowResult:
    """What an executor hands back for one row of a round, before anything reaches the request."""

    committed: list[int]            # accepted drafts + the recovered / bonus token (num_accepted + 1 tokens)
    num_accepted: int
    num_draft: int                  # drafts the round verified for the row
    next_drafts: list[int] | None = None  # the speculative graph: the k drafts of the row's next round
    next_q: torch.Tensor | None = None    # [k, V] their q (sampled rows): a view, valid until the next round
    # a replay of several speculative rounds: each round's (tokens committed, accepted, drafted), summed above
    rounds: tuple[tuple[int, int, int], ...] = ()

    def counts(self, kept: int) -> tuple[int, int, int]:
        """(rounds, accepted, drafted) of the rounds whose tokens reached the request (the first ``kept`` committed
        tokens: the stop rules may end it inside a replay of several rounds)."""
        if not self.rounds:
            return 1, self.num_accepted, self.num_draft
        n = accepted = drafted = tokens = 0
        for t, a, d in self.rounds:
            if n and tokens >= kept:
                break
            n, tokens, accepted, drafted = n + 1, tokens + t, accepted + a, drafted + d
        return n, accepted, drafted


class Path(enum.Enum):
    """Which executor runs a row."""

    FUSED = "fused"              # the speculative graph, ``SpecDecoder.fused`` (with k 0 it decodes plainly)
    FUSED_PLAIN = "fused_plain"  # the plain graph, ``SpecDecoder.fused_plain`` (k 0, no drafter)
    EAGER = "eager"              # the eager round (engine/rounds/eager.py)
    ENTERING = "entering"        # before the drafter ran: it asks for the graph's k first drafts; then FUSED or EAGER


class Reason(str, enum.Enum):
    """Why a row runs where it runs. The exits (``is_exit``) are the reasons a decoding request runs an eager
    round although the decoder has a fast path; ``SpecDecoder.fast_path_exits`` counts them by value."""

    # on a graph
    ON_GRAPH = "on_graph"            # FUSED: its drafts in hand from the graph's last round (or a graph of k 0)
    ENTERED = "entered"              # FUSED: its first drafts came from the drafter this round
    NO_DRAFTS = "no_drafts"          # FUSED_PLAIN: it verifies no drafts this round (k 0) and that graph exists
    DEMOTED = "demoted"              # FUSED_PLAIN: it ran while more than spec_max_batch requests did (to its end,
                                     # or until the load allows: Scheduler.rejoins)
    FIRST_DRAFTS = "first_drafts"    # ENTERING: waits for the drafter's first drafts
    # eager, and no exit: every request starts here, or the decoder has no fast path
    PREFILL = "prefill"              # (a chunk of) its prompt is not in the target's KV yet
    FUSED_OFF = "fused_off"          # fused rounds are off (``EngineConfig.fused_rounds``, no CUDA graphs)
    # eager: exits
    DRAFTER_WITHOUT_GRAPH = "drafter_without_graph"  # its drafter cannot draft inside a graph (n-gram)
    CONTEXT_FULL = "context_full"    # no room left in the context for a graph round (committed + 2k + 1 tokens)
    # fewer than the graph's k first drafts, no q for a sampled request, or the drafter's state not where a
    # graph round goes on from
    DRAFTER_NOT_READY = "drafter_not_ready"

    @property
    def is_exit(self) -> bool:
        return self in EXITS


EXITS = frozenset({Reason.DRAFTER_WITHOUT_GRAPH, Reason.CONTEXT_FULL, Reason.DRAFTER_NOT_READY})


@dataclass(frozen=True)
class RoutedRow:
    request: "Request"
    path: Path
    reason: Reason
    k: int                 # the request's draft length this round (``draft_len``: its k, capped by the room left)
    num_draft: int         # drafts it verifies this round: k, on a graph capped by the graph's k
    prefill_chunk: int | None = None
    item: RoundItem | None = None  # its drafts in hand: eager rows and entries, once the drafter ran

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass(frozen=True)
class RoundPlan:
    """One round's rows by executor, each row with its reason. ``entering`` is empty once the drafter's drafts
    are in (``Scheduler.settle``); ``launch_ahead``: the graph may launch its next round before this one is
    read (the same rows will come back, but for those that finish and those joining it; one graph runs)."""

    fused: tuple[RoutedRow, ...] = ()
    fused_plain: tuple[RoutedRow, ...] = ()
    eager: tuple[RoutedRow, ...] = ()
    entering: tuple[RoutedRow, ...] = ()
    launch_ahead: bool = False

    @property
    def off_graph(self) -> tuple[RoutedRow, ...]:
        """Rows no graph runs yet: they need the drafter (eager rows, entries)."""
        return self.eager + self.entering

    @property
    def exits(self) -> tuple[RoutedRow, ...]:
        return tuple(row for row in self.eager if row.reason.is_exit)
