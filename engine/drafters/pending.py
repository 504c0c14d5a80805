"""A drafter's drafts made on the device, read on the host only when their values are needed.

Reading drafts on the host waits for the GPU. Where the drafts of a round's entering rows go straight into the
graph's next round, launched ahead (engine/rounds/chained.py's ``enter``), the values can stay on the device:
``PendingDrafts`` holds a round's drafts there ([B, K]) and a copy of them in pinned host memory queued right
after they are made, behind an event. ``RowDrafts`` is one row's, a sequence of token ids like any list of
drafts: its ``device`` tensor goes into a graph without a sync, and the first look at its values (``len`` needs
none) waits for that copy alone, not for the rounds queued after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class PendingDrafts:
    def __init__(self, ids: torch.Tensor,       # [B, K] long on the device: row i's drafts in its first lengths[i]
                 lengths: Sequence[int],        # [B] drafts per row (known on the host)
                 host: torch.Tensor | None,     # [>= B * K] long pinned: where the copy lands (None: ids are host)
                 ) -> None:
        self.ids, self.lengths = ids, list(lengths)
        self._values: list[list[int]] | None = None
        self._host, self._done = None, None
        if host is not None:
            self._host = host[: ids.numel()].view(ids.shape)
            self._host.copy_(ids, non_blocking=True)
            self._done = torch.cuda.Event()
            self._done.record()

    @property
    def read_yet(self) -> bool:
        return self._values is not None

    def read(self) -> list[list[int]]:
        """Every row's drafts (the first call waits for the copy; the host buffer is free afterwards)."""
        if self._values is None:
            if self._done is not None:
                self._done.synchronize()
            rows = (self.ids if self._host is None else self._host).tolist()
            self._values = [row[:n] for row, n in zip(rows, self.lengths)]
            self._host = None
        return self._values

    def rows(self) -> list["RowDrafts"]:
        return [RowDrafts(self, i, n) for i, n in enumerate(self.lengths)]


class RowDrafts(Sequence):
    """Row ``row``'s first ``n`` drafts of a ``PendingDrafts``."""

    def __init__(self, pending: PendingDrafts, row: int, n: int) -> None:
        self.pending, self.row, self.n = pending, row, n

    @property
    def device(self) -> torch.Tensor:
        """[n] long: the drafts on the device (no sync)."""
        return self.pending.ids[self.row, : self.n]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice) and i.step in (None, 1) and i.start in (None, 0) and (i.stop is None or i.stop >= 0):
            return RowDrafts(self.pending, self.row, self.n if i.stop is None else min(self.n, i.stop))
        return self.pending.read()[self.row][: self.n][i]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"RowDrafts({list(self) if self.pending.read_yet else f'{self.n} on the device'})"
