"""Co-located serving at engine speed: the verifier runs rounds back to back for its Serve streams.

Each open ``Serve`` stream is a ``Session``: the caller (the gateway) admits requests into it under
slot numbers of its own and cancels them; the session's requests run in the verifier's one decoder
beside every other session's, under internal ids (``serve:<session>:<slot>``, a namespace the per-request RPCs
refuse), so nothing one caller names can reach another's request. The ``RoundLoop`` runs *ticks* on the engine's one worker
thread: a tick applies the admissions and cancellations queued since the last one, runs one round
(``SpecDecoder.step``: admission as the KV cache allows, the round-token budget, fused rounds
launched ahead) and hands each session the rows of its requests as one ``Outcome``; then, while any
request is left, it queues the next tick itself. So consecutive rounds never wait on the caller,
and other engine calls (Prefill, Verify, Step, Release) still get the worker between ticks.

Free of gRPC: outcomes are columns (numpy arrays, one per field for the whole batch); the servicer
packs them into the wire's ``RoundReport``.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from engine.config import SamplingParams
from engine.request import FinishReason, RequestOutput
from engine.spec import SpecDecoder

log = logging.getLogger("tandem.verifier")

SERVE_PREFIX = "serve:"  # the requests of Serve streams; Prefill, Verify, Step and Release never name them

@dataclass(frozen=True)
class Admit:
    slot: int
    prompt: list[int]
    output: list[int]
    params: SamplingParams


@dataclass(frozen=True)
class Outcome:
    """One round's rows of one session, column by column."""

    slots: np.ndarray      # int32 [n]
    counts: np.ndarray     # int32 [n]: tokens committed per row
    tokens: np.ndarray     # int32 [sum(counts)]
    accepted: np.ndarray   # int32 [n]
    drafted: np.ndarray    # int32 [n]
    k: np.ndarray          # int32 [n]
    finish: tuple[FinishReason | None, ...]  # [n]: None while running
    text: bytes            # UTF-8 deltas, row after row
    text_offsets: np.ndarray  # int32 [n + 1]
    start_unix_nano: int
    duration_ns: int
    rounds: np.ndarray | None = None  # int32 [n]: rounds each row took (None: one each)

    def __reduce__(self):
        """Across the pipe to the serving process (verifier_svc/core.py) its integer columns travel as one buffer:
        pickling each numpy array on its own was most of a round's hand-out (py-spy of a served sampled round on an
        H100: bench/RESULTS.md, issue 21)."""
        rounds = self.rounds if self.rounds is not None else np.ones(len(self.slots), np.int32)
        n, columns = len(self.slots), (self.slots, self.counts, self.accepted, self.drafted, self.k, rounds,
                                       self.text_offsets, self.tokens)
        packed = np.concatenate(columns, dtype=np.int32).tobytes()
        return _unpack_outcome, (n, packed, self.finish, self.text, self.start_unix_nano, self.duration_ns)


def _unpack_outcome(n: int, packed: bytes, finish: tuple, text: bytes, start: int, duration: int) -> Outcome:
    a = np.frombuffer(packed, dtype=np.int32)
    slots, counts, accepted, drafted, k, rounds = (a[i * n: (i + 1) * n] for i in range(6))
    return Outcome(slots, counts, a[7 * n + 1:], accepted, drafted, k, finish, text, a[6 * n: 7 * n + 1], start,
                   duration, rounds)


@dataclass(eq=False)
class Session:
    """One Serve stream's requests. ``deliver`` is called on the engine thread with each round's ``Outcome`` and
    with refused admissions as ``(slot, error)``; it must hand them over without blocking."""

    id: int
    deliver: Callable[[Outcome | tuple[int, Exception]], None]
    live: set[int] = field(default_factory=set)  # slots of requests running or queued in the decoder

    def rid(self, slot: int) -> str:
        return f"{SERVE_PREFIX}{self.id}:{slot}"


def _columns(rows: Sequence[tuple[int, RequestOutput, int]], start: int, duration: int) -> Outcome:
    n = len(rows)
    texts = [o.text_delta.encode() for _, o, _ in rows]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum([len(t) for t in texts], out=offsets[1:])
    return Outcome(np.fromiter((slot for slot, _, _ in rows), np.int32, n),
                   np.fromiter((len(o.new_token_ids) for _, o, _ in rows), np.int32, n),
                   np.fromiter(itertools.chain.from_iterable(o.new_token_ids for _, o, _ in rows), np.int32),
                   np.fromiter((o.round_accepted for _, o, _ in rows), np.int32, n),
                   np.fromiter((o.round_drafted for _, o, _ in rows), np.int32, n),
                   np.fromiter((k for _, _, k in rows), np.int32, n),
                   tuple(o.finish_reason for _, o, _ in rows),
                   b"".join(texts), offsets, start, duration,
                   np.fromiter((o.round_count for _, o, _ in rows), np.int32, n))


class Lifetimes:
    """Where a Serve request's time goes inside the engine (engine thread only; read as running sums): ``queued``
    from its admission reaching this process to the tick that adds it to the decoder, ``first`` from then to its
    first tokens handed out, ``life`` from then to its last; ``requests`` finished so far. What a client waits
    beyond these is the wire, both ways."""

    def __init__(self) -> None:
        self.sums = {"requests": 0, "queued": 0.0, "first": 0.0, "life": 0.0}
        self._added: dict[str, list] = {}  # request id -> [added at, its first tokens handed out]

    def admitted(self, rid: str, queued: float, now: float) -> None:
        self.sums["queued"] += now - queued
        self._added[rid] = [now, False]

    def drop(self, rid: str) -> None:
        self._added.pop(rid, None)

    def handed_out(self, outputs: Sequence[RequestOutput], now: float) -> None:
        for o in outputs:
            added = self._added.get(o.request_id)
            if added is None:
                continue
            if not added[1] and o.new_token_ids:
                added[1] = True
                self.sums["first"] += now - added[0]
            if o.finished:
                del self._added[o.request_id]
                self.sums["requests"] += 1
                self.sums["life"] += now - added[0]


class RoundLoop:
    def __init__(self, decoder: SpecDecoder, worker: Executor) -> None:
        self.decoder = decoder
        self.worker = worker
        self.sessions: dict[int, Session] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # guards what the event loop hands the engine thread
        # (session, admits, cancels, closed, when queued)
        self._pending: list[tuple[Session, list[Admit], list[int], bool, float]] = []
        self._scheduled = False
        self._seconds = {"round": 0.0, "between": 0.0, "idle": 0.0}
        self.rounds = 0  # ticks that ran a round
        self._ended: float | None = None  # when the last tick ended
        self._idle = False                # it ended with nothing left to run
        self.row_seconds = 0.0            # rows x seconds of every round: its mean occupancy is this over "round"
        self.lives = Lifetimes()

    def seconds(self) -> dict[str, float]:
        """Where the engine thread's time went since the first Serve round (any thread may ask): running rounds
        (``round``), from one tick's end to the next one's start while requests ran (``between``: other engine
        calls, the thread waiting for the GIL) and with nothing to run (``idle``, up to now)."""
        out, ended = dict(self._seconds), self._ended
        if ended is not None:
            out["idle" if self._idle else "between"] += max(0.0, time.perf_counter() - ended)
        return out

    # ---------------------------------------------------------------- the caller's side (any thread)
    def open(self, deliver: Callable[[Outcome | tuple[int, Exception]], None]) -> Session:
        session = Session(next(self._ids), deliver)
        with self._lock:
            self.sessions[session.id] = session
        return session

    def control(self, session: Session, admits: Sequence[Admit] = (), cancels: Sequence[int] = (),
                close: bool = False) -> None:
        """Queue admissions and cancellations (``close``: the stream ended, every request of it goes)."""
        with self._lock:
            self._pending.append((session, list(admits), list(cancels), close, time.perf_counter()))
            if self._scheduled:
                return
            self._scheduled = True
        self.worker.submit(self._tick)

    # ---------------------------------------------------------------- the engine thread
    def _apply(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        dec, now = self.decoder, time.perf_counter()
        for session, admits, cancels, close, queued in pending:
            for slot in (list(session.live) if close else cancels):
                if slot in session.live:
                    session.live.discard(slot)
                    dec.abort(session.rid(slot))
                    self.lives.drop(session.rid(slot))
            if close:
                with self._lock:
                    self.sessions.pop(session.id, None)
                continue
            for a in admits:
                try:
                    if a.slot in session.live:
                        raise ValueError(f"slot: {a.slot} is already in use on this stream")
                    dec.add_request(a.prompt, a.params, session.rid(a.slot), a.output)
                    session.live.add(a.slot)
                    self.lives.admitted(session.rid(a.slot), queued, now)
                except ValueError as exc:
                    session.deliver((a.slot, exc))

    def _tick(self) -> None:
        began = time.perf_counter()
        ended, self._ended = self._ended, None  # the metrics thread adds nothing for a tick under way
        if ended is not None:
            self._seconds["idle" if self._idle else "between"] += began - ended
        self._idle = False
        rows = 0
        try:
            self._apply()
            dec = self.decoder
            if not dec.has_unfinished():
                with self._lock:  # nothing to run: the next control schedules a tick again
                    if not self._pending:
                        self._scheduled = False
                        self._ended, self._idle = time.perf_counter(), True
                        return
            else:
                start, t0 = time.time_ns(), time.perf_counter_ns()
                ks = {r.request_id: dec.draft_len(r) for r in dec.running}
                outputs = dec.step()
                self.rounds += 1
                rows = len(outputs)
                self.lives.handed_out(outputs, time.perf_counter())
                self._hand_out(outputs, ks, start, time.perf_counter_ns() - t0)
        except Exception:  # the loop must not die with requests in it: their sessions learn of it
            log.exception("serve round failed")
            self._fail_all()
        self._ended = time.perf_counter()
        self._seconds["round"] += self._ended - began
        self.row_seconds += rows * (self._ended - began)
        self.worker.submit(self._tick)

    def _hand_out(self, outputs: Sequence[RequestOutput], ks: dict[str, int], start: int, duration: int) -> None:
        by_session: dict[int, list[tuple[int, RequestOutput, int]]] = {}
        for o in outputs:
            sid, _, slot = o.request_id[len(SERVE_PREFIX):].partition(":")
            by_session.setdefault(int(sid), []).append((int(slot), o, ks.get(o.request_id, 0)))
        for sid, rows in by_session.items():
            session = self.sessions.get(sid)
            if session is None:
                continue
            for slot, o, _ in rows:
                if o.finished:
                    session.live.discard(slot)
            session.deliver(_columns(rows, start, duration))

    def _fail_all(self) -> None:
        for session in list(self.sessions.values()):
            for slot in list(session.live):
                self.decoder.abort(session.rid(slot))
                self.lives.drop(session.rid(slot))
                session.deliver((slot, RuntimeError("the verifier's round failed; see its log")))
            session.live.clear()
