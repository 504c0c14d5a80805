"""Leases on what a service holds for a caller: state nobody renews is reclaimed.

A verifier holds a request's KV and a drafter its history from the call that creates it until a Release. A
caller that dies (a gateway killed, a network split) never releases: every call that names a request renews its
lease, and ``expired`` lists the requests no call has named for ``lease_s`` seconds, for the service to free.
The gateway names every running request each round, so only abandoned state ever expires. (A co-located Serve
stream's requests need none: they end with their stream.)
"""

from __future__ import annotations

import time
from typing import Iterable


class Leases:
    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self._last: dict[str, float] = {}

    def renew(self, ids: Iterable[str]) -> None:
        now = time.monotonic()
        for rid in ids:
            self._last[rid] = now

    def drop(self, ids: Iterable[str]) -> None:
        for rid in ids:
            self._last.pop(rid, None)

    def expired(self) -> list[str]:
        """Requests no call has named for ``lease_s`` (they are forgotten here: the caller frees them)."""
        cutoff = time.monotonic() - self.lease_s
        gone = [rid for rid, last in self._last.items() if last < cutoff]
        self.drop(gone)
        return gone
