"""What a round launched ahead keeps on the device between rounds (engine/rounds/ahead.py, engine/rounds/fused.py).

A captured round's rows carry, in its graph's buffers, t0, the pending drafts and how many of them to verify
(``inputs`` [R, k + 2]), the KV length (``kv_lens`` [R]), the tokens each row may still commit and the drafts it
verifies a round while that room allows (``room`` [R, 2]: its own k, capped by the graph's; a row that entered the
graph without drafts verifies none in its first round and this many from its second). ``chain`` (inside the graph)
leaves the next round's inputs in those buffers; two more steps keep a chain of rounds what the host would have
launched:

- ``count_down`` (inside the graph, after the inputs are chained): each live row's room shrinks by the tokens it
  committed and its number of drafts to verify becomes min(its own k, room - 1), exactly the host's
  ``Scheduler.draft_len`` for the next round. So a row near its max_tokens still takes rounds launched ahead,
  verifying fewer drafts as it nears its end, instead of stopping the chain for the whole batch.
- ``compact`` (outside, before a replay): rows that finished since the round in flight was launched leave the
  chain; the live rows' buffers move up, in the host's order, into this graph or a smaller bucket's, and the
  rows after them become padding (KV length k + 1 in the scratch block, as a bucket's padding rows are). So a
  row finishing does not stop the chain either.
- ``enter`` (outside, after ``compact``): rows not in the round in flight join the chain (a plain graph's whose
  prompt ran beside it; a speculative graph's whose first drafts the drafter made this round): their inputs, KV
  lengths and room, known on the host, go into the rows after the live ones. So a row arriving does not stop
  the chain.
"""

from __future__ import annotations

from typing import Sequence

import torch

from engine.models import ops
from engine.upload import upload


def chain(inputs: torch.Tensor,               # [R, w+2] long, updated in place (w: k, or a draft tree's nodes)
          kv_lens: torch.Tensor,              # [R] long, updated in place
          committed: torch.Tensor,            # [R, k+1] long: this round's committed tokens
          accepted: torch.Tensor,             # [R] long
          next_drafts: torch.Tensor | None,   # [R, w] long: the drafter's next drafts (None with k 0)
          q: torch.Tensor | None = None,      # [R, k, V] float32: their q (sampling rounds)
          q_in: torch.Tensor | None = None,   # [R, k, V] float32: where the next round reads it, updated in place
          ) -> None:
    """The next round's inputs (what a round launched ahead reads; a round launched from the host overwrites them):
    t0 becomes this round's last committed token, the drafts its next drafts (and, in sampling rounds, their q),
    and each live row's KV length grows by the tokens committed; each row's num_draft stays. Padding rows (KV
    length exactly w + 1) stay as they are. On CUDA all but the q is one launch (``kernels.next_inputs``), else the
    torch steps below."""
    w = inputs.shape[1] - 2
    if q is not None:                                                          # before kv moves
        q_in.copy_(torch.where((kv_lens > w + 1)[:, None, None], q, q_in))
    if ops.use_kernels(kv_lens):  # one launch (kernels.next_inputs, the same steps)
        from kernels.next_inputs import next_inputs

        next_inputs(inputs, kv_lens, committed, accepted, next_drafts)
        return
    live = (kv_lens > w + 1)[:, None]                                          # [R, 1]
    nxt = committed.gather(1, accepted[:, None])                               # [R, 1]
    if next_drafts is not None:
        nxt = torch.cat([nxt, next_drafts], dim=1)                             # [R, w + 1]
    inputs[:, : w + 1].copy_(torch.where(live, nxt, inputs[:, : w + 1]))
    kv_lens.add_(torch.where(live[:, 0], accepted + 1, 0))


def count_down(inputs: torch.Tensor,    # [R, w+2] long: t0, w drafts, how many of them to verify (chained)
               kv_lens: torch.Tensor,   # [R] long: chained (live rows > w + 1)
               room: torch.Tensor,      # [R, 2] long: tokens each row may still commit before this round; its k
               accepted: torch.Tensor,  # [R] long: drafts this round accepted
               ) -> None:
    w = inputs.shape[1] - 2  # k, or a draft tree's nodes (a row verifies up to k of its depths)
    live = kv_lens > w + 1
    left = torch.where(live, room[:, 0] - accepted - 1, room[:, 0])
    room[:, 0].copy_(left)
    nd = inputs[:, w + 1]
    inputs[:, w + 1].copy_(torch.where(live, torch.minimum(room[:, 1], (left - 1).clamp(min=0)), nd))


def next_num_draft(want: int, room: int, accepted: int) -> int:
    """``count_down``'s rule for one row, on the host: the drafts a row of k ``want`` verifies in the round after one
    that accepted ``accepted`` of its drafts with ``room`` tokens left before it."""
    return min(want, max(room - accepted - 2, 0))


def compact(src: Sequence[torch.Tensor | None],  # the source graph's row buffers, each [R_src, ...]
            dst: Sequence[torch.Tensor | None],  # the destination graph's, the same kinds, each [R_dst, ...]
            pads: Sequence[object],              # each buffer's padding row value (None: left as it is)
            index: Sequence[int],                # [n] the live rows' positions in src, in the host's order
            device: torch.device) -> None:
    """dst[:n] = src[index], dst[n:] = padding, buffer by buffer (src may be dst: the gather copies first)."""
    n = len(index)
    idx = upload(index, device)
    for s, d, pad in zip(src, dst, pads):
        if s is None:
            continue
        live = s.index_select(0, idx)
        if pad is not None and n < d.shape[0]:
            d[n:] = pad
        d[:n] = live


def enter(inputs: torch.Tensor,            # [R, w+2] long: the destination graph's, rows [at, at + n) written
          kv_lens: torch.Tensor,           # [R] long, rows [at, at + n) written
          rows: Sequence[Sequence[int]],   # [n][w+2] each joining row's t0, drafts and how many to verify
          lengths: Sequence[int],          # [n] each joining row's L (its committed tokens but t0)
          at: int,
          room: torch.Tensor | None = None,  # [R, 2] long (graphs that count down, k > 0), rows [at, at + n) written
          rooms: Sequence[tuple[int, int]] = ()) -> None:  # [n] each joining row's room and k
    """Joining rows' inputs, from the host, after the live rows' (in stream order after the round in flight)."""
    n, k = len(rows), inputs.shape[1] - 2
    inputs[at: at + n].copy_(torch.tensor(rows, dtype=torch.long).view(n, k + 2), non_blocking=True)
    kv_lens[at: at + n].copy_(torch.tensor([length + k + 1 for length in lengths], dtype=torch.long),
                              non_blocking=True)
    if room is not None:
        room[at: at + n].copy_(torch.tensor(list(rooms), dtype=torch.long).view(n, 2), non_blocking=True)
