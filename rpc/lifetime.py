"""How a service process ends: promptly on SIGTERM or SIGINT whatever it is doing, and with the process that
started it.

- ``Shutdown``: the first SIGTERM/SIGINT asks for a graceful stop (``rpc.server.run_until_signal`` decides what
  that means in each state) and starts a clock: a process still alive ``deadline_s`` later, or told a second
  time, exits at once. No state (loading, warming up, waiting for a peer, draining) can keep it running.
- ``watch_parent``: a process started by ``rpc.stack.Stack`` (``tandem serve``, ``tandem demo``, the tests)
  inherits the read end of a pipe whose only write end the parent holds. However the parent ends (SIGKILL
  included) the kernel closes that end, the read returns end-of-file, and the child sends itself SIGTERM: it
  stops as if it had been told to. (Linux's PR_SET_PDEATHSIG would do the same for the parent *thread*, so a
  child started from a short-lived thread would be killed with that thread; a pipe follows the process.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from typing import Awaitable

log = logging.getLogger("tandem.rpc")

# the environment variable that hands a child the read end of its parent's lifeline (a file descriptor number)
LIFELINE_FD = "TANDEM_LIFELINE_FD"


def watch_parent() -> None:
    """If this process was given a lifeline (``LIFELINE_FD``), stop it (SIGTERM to itself) once the parent is gone."""
    fd = os.environ.pop(LIFELINE_FD, None)  # popped: nothing this process starts inherits the duty
    if fd is None:
        return
    fd = int(fd)

    def watch() -> None:
        try:
            while os.read(fd, 1):  # the parent never writes: this returns b"" when its end closes
                pass
        except OSError:
            pass
        log.warning("the process that started this one is gone: stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


class Shutdown:
    """A service's stop request: set by the first SIGTERM/SIGINT, with a deadline for the whole stop."""

    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self.requested = asyncio.Event()

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self.requested.is_set():
            log.warning("%s again: exiting now", name)
            os._exit(128 + sig)
        log.info("%s: stopping (at most %.1f s)", name, self.deadline_s)
        self.requested.set()
        timer = threading.Timer(self.deadline_s, self._expire)
        timer.daemon = True
        timer.start()

    def _expire(self) -> None:
        log.error("still running %.1f s after the stop signal: exiting now", self.deadline_s)
        logging.shutdown()
        os._exit(1)

    async def wait(self) -> None:
        await self.requested.wait()

    async def unless_stopped(self, work: Awaitable[None]) -> bool:
        """Run ``work`` until it finishes (True) or a stop is requested first (False: ``work`` is cancelled; an
        engine thread it was waiting for may still be busy, which is why the process then exits without
        waiting for it, ``rpc.server.run``)."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self.requested.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if task.done():
            task.result()  # its exception, if any
            return True
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception:  # it failed while being given up: the stop goes on
            log.exception("while stopping")
        return False
