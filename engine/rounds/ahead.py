"""The round launched ahead: at most one per graph executor (``FusedRounds``), and its life.

While the same rows keep running, ``FusedRounds.run`` launches round r + 1 right after round r's replay and
before the host reads round r, with r + 1's inputs (last committed token, next drafts and their q, KV
lengths) chained on the device. Until round r is read the host does not know r + 1's KV lengths
(``Launch.lengths`` is None); ``known`` fills them in right after the read. Meanwhile every KV block the
launch may write stays allocated: round r rolls each row back with ``keep_blocks``.

The next round either *takes* it (``take``: the same rows, at the same lengths, verifying the same number of
drafts; rows that finished since it was launched may be missing: their outputs are not read) and only reads
it, or it is *dropped*: by ``take`` on any other difference, or by ``expect`` when the scheduler is about to
run other rows (one that still runs goes elsewhere, one enters a speculative graph). Rows arriving beside it
(prefills, run in an eager round) do not drop it; they *join* the chain later (``FusedRounds.run``: the round
launched then holds them too): on a plain graph the round after, on a speculative one the round the drafter made
their first drafts in. A dropped launch is never read: the KV blocks it
held past each row's length go back to their allocators (no other forward may see them), and its sampled rows'
drafter draws are rewound (their next round draws what it drew). A finished row's blocks went back when it
finished: the GPU runs the launch before anything enqueued later can reuse them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch

if TYPE_CHECKING:
    from engine.kv_cache import BlockAllocator


@dataclass
class Launch:
    """A replay on its way: the rows it runs (request ids, in order), each row's L and the drafts it verifies
    (None while it is chained from a round not yet read) and where its output lands on the host."""

    g: Any                             # the graph it replays (``round_graph.RoundGraph``)
    rows: tuple[str, ...]
    lengths: list[int] | None
    num_draft: tuple[int, ...] | None
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

    def known(self, lengths: list[int], num_draft: tuple[int, ...]) -> None:
        """The round before it was read: each row's L once that round's tokens are committed, and the drafts it
        verifies (engine/rounds/chained.py's ``count_down``)."""
        self.launch.lengths, self.launch.num_draft = lengths, num_draft

    def take(self, rows: tuple[str, ...], lengths: Sequence[int], num_draft: tuple[int, ...]
             ) -> tuple[Launch, list[int]] | None:
        """The launch and where each of ``rows`` is in it, if it runs this round (else it is dropped); there is
        none held afterwards."""
        launch, self.launch = self.launch, None
        if launch is None:
            return None
        index = self.match(launch, rows, lengths, num_draft)
        if index is None:
            self._drop(launch)
            return None
        return launch, index

    def match(self, launch: Launch, rows: tuple[str, ...], lengths: Sequence[int], num_draft: tuple[int, ...]
              ) -> list[int] | None:
        """Where each of ``rows`` is in ``launch``, if it runs them next as they are (``take``'s test); else None."""
        index = self._index(launch, rows)
        if (index is None or [launch.lengths[i] for i in index] != list(lengths)
                or tuple(launch.num_draft[i] for i in index) != num_draft):
            return None
        return index

    def expect(self, rows: tuple[str, ...]) -> None:
        """Before a round's rows are chosen to run anywhere: unless the launch runs these requests next (and
        only requests that finished besides; rows it does not hold join it), drop it."""
        if self.launch is None:
            return
        held = set(self.launch.rows)  # rows it does not hold join it
        rows = tuple(rid for rid in rows if rid in held)
        if self._index(self.launch, rows) is None:
            self._drop(self.launch)
            self.launch = None

    def _index(self, launch: Launch, rows: tuple[str, ...]) -> list[int] | None:
        """Each row's position in the launch, if the launch holds every one of them and its other rows have
        finished (their KV is gone); else None."""
        if launch.rows == rows:
            return list(range(len(rows))) if rows else None
        at = {rid: i for i, rid in enumerate(launch.rows)}
        index = [at.get(rid) for rid in rows]
        if not rows or None in index:
            return None
        kept = set(rows)
        return None if any(rid in self.target for rid in launch.rows if rid not in kept) else index

    def _drop(self, launch: Launch) -> None:
        self.dropped += 1
        program = launch.g.program
        live = [rid for rid in launch.sampled if rid in self.target]
        if live and program is not None:
            program.rewind(live)
        for alloc in {self.target} | ({program.allocator} if program is not None and program.allocator else set()):
            for rid in launch.rows:
                if rid in alloc:
                    alloc.truncate(rid, alloc.length(rid))
