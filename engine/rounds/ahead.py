"""The round launched ahead: at most one per graph executor (``FusedRounds``), and its life.

While the same rows keep running, ``FusedRounds.run`` launches round r + 1 right after round r's replay and
before the host reads round r, with r + 1's inputs (last committed token, next drafts and their q, KV
lengths) chained on the device. Until round r is read the host does not know r + 1's KV lengths
(``Launch.lengths`` is None); ``known`` fills them in right after the read. Meanwhile every KV block the
launch may write stays allocated: round r rolls each row back with ``keep_blocks``.

The next round either *takes* it (``take``: the same rows in the same order, at the same lengths, verifying
the same number of drafts) and only reads it, or it is *dropped*: by ``take`` on any difference, or by
``expect`` when the scheduler is about to run other rows (one finishes, one arrives, one runs elsewhere). A
dropped launch is never read: the KV blocks it held past each row's length go back to their allocators (no
other forward may see them), and its sampled rows' drafter draws are rewound (their next round draws what it
drew).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch

if TYPE_CHECKING:
    from engine.kv_cache import BlockAllocator


@dataclass
class Launch:
    """A replay on its way: the rows it runs (request ids, in order), each row's L (None while it is chained
    from a round not yet read), the drafts each verifies and where its output lands on the host."""

    g: Any                             # the graph it replays (``fused._RoundGraph``)
    rows: tuple[str, ...]
    lengths: list[int] | None
    num_draft: tuple[int, ...]
    out: torch.Tensor                  # [n, 2k+2] on the host (a pinned slot) or the graph's own buffer (eager)
    done: "torch.cuda.Event | None"
    sampled: tuple[str, ...] = ()      # its sampled rows (a dropped round gives back their drafter draws)

    def read(self) -> list[list[int]]:
        """The round's one host sync."""
        if self.done is not None:
            self.done.synchronize()
        return self.out.tolist()


class LaunchedAhead:
    def __init__(self, target: "BlockAllocator") -> None:
        self.target = target
        self.launch: Launch | None = None
        self.dropped = 0  # launches whose rows did not come back as they were (wasted, never read)

    def hold(self, launch: Launch) -> None:
        """A round just launched ahead of the one being read."""
        assert self.launch is None, "one round launched ahead at a time"
        self.launch = launch

    def known(self, lengths: list[int]) -> None:
        """The round before it was read: each row's L once that round's tokens are committed."""
        self.launch.lengths = lengths

    def take(self, rows: tuple[str, ...], lengths: Sequence[int], num_draft: tuple[int, ...]) -> Launch | None:
        """The launch, if it runs exactly this round (else it is dropped); there is none held afterwards."""
        launch, self.launch = self.launch, None
        if launch is not None and (launch.rows, launch.lengths, launch.num_draft) != (rows, list(lengths), num_draft):
            self._drop(launch)
            return None
        return launch

    def expect(self, rows: tuple[str, ...]) -> None:
        """Before a round's rows are chosen to run anywhere: unless the launch runs exactly these requests next,
        drop it."""
        if self.launch is not None and self.launch.rows != rows:
            self._drop(self.launch)
            self.launch = None

    def _drop(self, launch: Launch) -> None:
        self.dropped += 1
        program = launch.g.program
        if launch.sampled and program is not None:
            program.rewind(launch.sampled)
        for alloc in {self.target} | ({program.allocator} if program is not None and program.allocator else set()):
            for rid in launch.rows:
                if rid in alloc:
                    alloc.truncate(rid, alloc.length(rid))
