"""Where the verifier's engine runs: a thread of the serving process, or a process of its own (the default).

Both are an ``EngineHandle`` to the servicer: ``call`` runs a ``VerifierEngine`` method by name between rounds,
``open``/``control`` drive the ``RoundLoop``'s Serve sessions (outcomes come back to ``deliver`` on the event loop)
and ``snapshot`` reads the engine's counters for the metrics.

Why a process (``engine_process``, as vLLM's engine core): the engine thread is host-bound Python that lets go of
the GIL in every CUDA call, and in one process with gRPC's event loop it waited for the GIL at each of them: served
rounds at c 64 took about twice the in-process ones, the RoundLoop without gRPC nearly none. In its own process the
engine has its interpreter to itself; the serving process hands it calls and controls, and it sends back results
and round outcomes, over one pipe (pickled dataclasses and numpy columns), read between ticks.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import itertools
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
from typing import Any, Callable, Protocol, Sequence

from engine.heap import freeze_heap
from engine.request import RequestOutput
from verifier_svc.remote_drafter import RemoteDrafter
from verifier_svc.serving import Admit, RoundLoop

log = logging.getLogger("tandem.verifier")

Deliver = Callable[[Any], None]  # an Outcome or (slot, exception), called on the event loop's thread
SNAPSHOT_TIMEOUT_S = 1.0  # a metrics scrape waits this long for a busy engine process, then reads the last one


class EngineHandle(Protocol):
    """What the servicer holds of the engine, wherever it runs."""

    can_step: bool             # an embedded drafter: Step and Serve work
    chunk_tokens: int | None   # a Prefill's prompt tokens per engine call (None: whole)

    async def call(self, name: str, *args) -> Any:
        """``VerifierEngine.<name>(*args)`` (or ``warm_up``) between rounds; its exception is raised here."""

    def open(self, deliver: Deliver) -> Any:
        """A Serve session; ``deliver`` gets its outcomes and refusals on the event loop's thread."""

    def control(self, session, admits: Sequence[Admit] = (), cancels: Sequence[int] = (), close: bool = False) -> None:
        """Queue a session's admissions and cancellations (``close``: it ended, its requests go)."""

    def snapshot(self) -> dict[str, Any]:
        """The engine's counters (``snapshot`` below), from any thread."""


def send(conn, msg: tuple) -> None:
    """Plain pickle over the pipe (not multiprocessing's, which would share a tensor's memory instead of copying it)."""
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def recv(conn) -> tuple:
    return pickle.loads(conn.recv_bytes())


def _portable(value):
    """A result as the serving process can take it: features copied off the GPU."""
    if isinstance(value, list):
        return [_portable(v) for v in value]
    if isinstance(value, RequestOutput) and value.features is not None and value.features.device.type != "cpu":
        return dataclasses.replace(value, features=value.features.cpu())
    return value


def snapshot(engine, loop: RoundLoop) -> dict[str, Any]:
    """The engine's counters for the metrics (any thread may call it where the engine runs)."""
    dec = engine.decoder
    out = {"stats": engine.stats(), "fast_path_exits": engine.fast_path_exits(), "rows": engine.rows(),
           "fused_rounds": engine.fused_rounds(), "serve_seconds": loop.seconds(), "serve_rounds": loop.rounds,
           "serve_row_s": loop.row_seconds, "serve_lives": dict(loop.lives.sums),
           "prefill_chunks": engine.prefill_chunks}
    if dec.fast.policy is not None:
        out["spec_k"] = dec.fast.policy.last_k
    elif dec.fast.guard is not None:
        out["spec_k"] = dec.config.k if dec.fast.guard.last else 0
    if isinstance(dec.drafter, RemoteDrafter):  # a drafter service this verifier calls (--direct-drafter-address)
        out["draft_calls"], out["draft_call_s"] = dec.drafter.stats(), dec.drafter.call_s
    return out


class LocalEngine:
    """The engine on one dedicated thread of this process (``engine_process`` off)."""

    def __init__(self, engine, device: str) -> None:
        from engine.factory import engine_thread

        self.engine = engine
        self.can_step, self.chunk_tokens = engine.can_step, engine.chunk_tokens
        self.pool = engine_thread("verifier-engine", device)
        self.loop = RoundLoop(engine.decoder, self.pool)

    async def call(self, name: str, *args):
        fn = _method(self.engine, name)
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def open(self, deliver: Deliver):
        aloop = asyncio.get_running_loop()
        return self.loop.open(lambda item: aloop.call_soon_threadsafe(deliver, item))

    def control(self, session, admits: Sequence[Admit] = (), cancels: Sequence[int] = (), close: bool = False) -> None:
        self.loop.control(session, admits, cancels, close)

    def snapshot(self) -> dict[str, Any]:
        return snapshot(self.engine, self.loop)


def _method(engine, name: str) -> Callable:
    if name == "warm_up":
        from verifier_svc.main import warm_up
        return lambda: warm_up(engine)
    return getattr(engine, name)


# ---------------------------------------------------------------------------------------- the engine's process
class _Ticks:
    """The RoundLoop's executor in the engine process: its ticks queue here and run between messages."""

    def __init__(self) -> None:
        self.work: collections.deque = collections.deque()

    def submit(self, fn: Callable, *args) -> None:
        self.work.append((fn, args))


def core_main(settings, conn) -> None:
    """The engine process: build the engine as ``tandem verifier`` would, then serve the pipe until it closes."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C stops the serving process; this one follows
    _exit_with_parent()
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())  # not its default multiprocessing lock, which this process's end would leak
    from verifier_svc.main import build_verifier, describe
    from verifier_svc.service import VerifierEngine

    try:
        built = build_verifier(settings)
    except Exception as exc:  # the serving process raises it as its own (a bad field is its one-line error)
        if not isinstance(exc, (ValueError, FileNotFoundError)):
            log.exception("the engine failed to load")
        send(conn, ("failed", exc))
        os._exit(1)
    describe(built, settings)
    engine = VerifierEngine(built.decoder, settings.lease_s)
    freeze_heap()  # the model's objects out of Python's collections (engine/heap.py; the warm-up's few stay in)
    ticks = _Ticks()
    loop = RoundLoop(engine.decoder, ticks)
    send(conn, ("built", {"vocab_size": built.target.config.vocab_size, "can_step": engine.can_step,
                         "chunk_tokens": engine.chunk_tokens, "snapshot": snapshot(engine, loop)}))
    sessions: dict[int, Any] = {}

    def handle(msg: tuple) -> None:
        kind = msg[0]
        if kind == "call":
            _, cid, name, args = msg
            try:
                result = (True, _method(engine, name)(*args))
            except Exception as exc:  # the caller's to answer (a bad field, no room, ...): this process goes on
                result = (False, exc)
            _reply(conn, cid, *result)
        elif kind == "snapshot":
            _reply(conn, msg[1], True, snapshot(engine, loop))
        elif kind == "open":
            sid = msg[1]
            sessions[sid] = loop.open(lambda item, sid=sid: send(conn, ("out", sid, item)))
        elif kind == "control":
            _, sid, admits, cancels, close = msg
            session = sessions.pop(sid) if close else sessions[sid]
            loop.control(session, admits, cancels, close)

    try:
        while True:
            if conn.poll(None if not ticks.work else 0):
                handle(recv(conn))
                while conn.poll(0):
                    handle(recv(conn))
            if ticks.work:
                fn, args = ticks.work.popleft()
                fn(*args)
    except (EOFError, OSError):  # the serving process is gone: so is its engine
        pass
    os._exit(0)


def _reply(conn, cid: int, ok: bool, value) -> None:
    try:
        send(conn, ("ret", cid, ok, _portable(value)))
    except (pickle.PicklingError, TypeError, AttributeError) as exc:  # the call fails, not the process
        send(conn, ("ret", cid, False, RuntimeError(f"the engine's answer could not be sent: {exc!r}")))


def _exit_with_parent() -> None:
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


# ---------------------------------------------------------------------------------------- the serving side
class EngineProcess:
    """The engine in a process of its own (``engine_process`` on): started by ``start``, which returns once the
    model is loaded. If it ends, every call and stream waiting on it fails and this process stops (SIGTERM to
    itself) so that whatever runs it starts a fresh verifier."""

    def __init__(self, settings) -> None:
        ctx = multiprocessing.get_context("spawn")  # CUDA in a forked child is not an option
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=core_main, args=(settings, child), name="tandem-verifier-engine", daemon=True)
        self._child = child
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        # call id -> its answer's future: the event loop's for calls, a thread's for the metrics' snapshots
        self._waiting: dict[int, asyncio.Future | concurrent.futures.Future] = {}
        self._sessions: dict[int, Deliver] = {}
        self._snap: dict[str, Any] = {}
        self._snap_at = 0.0
        self._snap_lock = threading.Lock()
        self.can_step, self.chunk_tokens, self.vocab_size = False, None, 0
        self._gone: Exception | None = None

    async def start(self) -> None:
        self.proc.start()
        self._child.close()
        try:
            kind, info = await asyncio.get_running_loop().run_in_executor(None, recv, self.conn)
        except EOFError:
            self.proc.join(5)
            raise RuntimeError(f"the verifier's engine process ended while loading (exit code "
                               f"{self.proc.exitcode}); see its log above") from None
        if kind == "failed":
            self.proc.join(5)
            raise info
        self.can_step, self.chunk_tokens, self.vocab_size = info["can_step"], info["chunk_tokens"], info["vocab_size"]
        self._snap, self._snap_at = info["snapshot"], time.monotonic()
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
        self._loop.add_reader(self.conn.fileno(), self._readable)

    def _send(self, msg: tuple) -> None:
        if self._gone is not None:
            raise self._gone
        with self._send_lock:
            send(self.conn, msg)

    async def call(self, name: str, *args):
        cid = next(self._ids)
        fut = self._waiting[cid] = self._loop.create_future()
        self._send(("call", cid, name, args))
        return await fut

    def open(self, deliver: Deliver) -> int:
        sid = next(self._ids)
        self._sessions[sid] = deliver
        self._send(("open", sid))
        return sid

    def control(self, session: int, admits: Sequence[Admit] = (), cancels: Sequence[int] = (),
                close: bool = False) -> None:
        if close:
            self._sessions.pop(session, None)
            if self._gone is not None:
                return
        self._send(("control", session, list(admits), list(cancels), close))

    def snapshot(self) -> dict[str, Any]:
        """The engine's counters, asked of it (a scrape from the metrics thread); the last ones where it stays busy
        past ``SNAPSHOT_TIMEOUT_S`` (a warm-up)."""
        with self._snap_lock:
            if (time.monotonic() - self._snap_at < 0.05 or threading.get_ident() == self._loop_thread
                    or self._gone is not None):
                return self._snap  # fresh enough, or asked on the event loop, which is what would bring the answer
            cid, answer = next(self._ids), concurrent.futures.Future()
            self._waiting[cid] = answer
            self._send(("snapshot", cid))
            try:
                self._snap, self._snap_at = answer.result(SNAPSHOT_TIMEOUT_S), time.monotonic()
            except (concurrent.futures.TimeoutError, RuntimeError):  # busy past the timeout, or gone: the last ones
                self._waiting.pop(cid, None)
            return self._snap

    def _readable(self) -> None:
        try:
            while self.conn.poll(0):
                self._dispatch(recv(self.conn))
        except (EOFError, OSError):
            self._lost()

    def _dispatch(self, msg: tuple) -> None:
        if msg[0] == "out":
            deliver = self._sessions.get(msg[1])
            if deliver is not None:
                deliver(msg[2])
            return
        _, cid, ok, value = msg
        waiter = self._waiting.pop(cid, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(value) if ok else waiter.set_exception(value)

    def _lost(self) -> None:
        self._loop.remove_reader(self.conn.fileno())
        self.proc.join(1)
        self._gone = error = RuntimeError(f"the verifier's engine process ended (exit code {self.proc.exitcode}); "
                                          "see its log")
        log.error("%s: stopping this verifier", error)
        for waiter in self._waiting.values():
            if not waiter.done():
                waiter.set_exception(error)
        self._waiting.clear()
        for deliver in self._sessions.values():  # every Serve stream ends UNAVAILABLE: its gateway resumes elsewhere
            deliver(error)
        os.kill(os.getpid(), signal.SIGTERM)
