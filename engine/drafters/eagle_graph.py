"""The EAGLE head's part of a fused round (engine/fused_round.py): catch-up and k drafts on the device.

Layout (as ``EagleDrafter`` keeps it, base 1): head entry p (token x_p, feature f_{p-1}) lives at
KV index p - 1, which is also its rotary position. Before a round the head holds entries 1 .. L
(the last one is t0's, at position L). The round's verify produced the target's features of
positions L .. L + k; with the committed tokens c_0 .. c_a (accepted drafts, then the recovered or
bonus token) the head
1. catches up: entries L + 1 .. L + k + 1, tokens c_0 .. c_k, features f_L .. f_{L+k} -- a fixed
   shape; entries past L + a + 1 hold placeholders, are never attended by a committed entry and
   are overwritten later; only the output of entry L + a + 1 (gathered per row) goes on to the LM
   head: draft 1;
2. drafts: k - 1 single-token steps, entry L + a + 1 + j fed draft j and the previous output.
All of it reads lengths derived on the device from ``num_accepted``; the host only grows each
request's head KV before the round (to L + 2k) and cuts it to the committed length after.
In a sampling round every draft is picked as ``DraftSampler.pick`` picks it (``pick_in_graph``:
argmax for greedy rows, the exponential race over q for sampled ones) with noise the host drew
from the request's drafting stream into ``noise`` before the replay, k rows per round, the draws
the eager drafter would make; the q of each draft goes back with the drafts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from engine.attention.static import StaticAttention
from engine.config import SamplingParams
from engine.drafters.draft_sampling import pick_in_graph
from engine.graphs import PAD_SEQ

if TYPE_CHECKING:
    from engine.drafters.eagle import EagleDrafter
    from engine.fused_round import RoundSampling


class EagleProgram:
    def __init__(self, drafter: "EagleDrafter", rows: int, k: int, max_blocks: int, sampled: bool = False) -> None:
        runner = drafter.runner
        self.sampler, self.device = drafter.sampler, runner.device
        self.head, self.allocator, self.k, self.rows = drafter.head, runner.allocator, k, rows
        if PAD_SEQ not in self.allocator:
            self.allocator.extend(PAD_SEQ, 1)
        scratch = self.allocator.block_table(PAD_SEQ)[0]
        heads = self.head.config.num_heads
        self.catch = StaticAttention(runner.cache, heads, rows, k + 1, max_blocks, scratch)
        self.step = StaticAttention(runner.cache, heads, rows, 1, max_blocks, scratch)
        self.step.block_table = self.catch.block_table  # one table serves every head forward of the round
        dev = runner.device
        self._rows = torch.arange(rows, device=dev)
        self._offsets = torch.arange(k + 1, device=dev)
        vocab = self.head.eagle.target.vocab_size
        self.noise = torch.ones(rows, k, vocab, device=dev) if sampled else None  # [R, k, V] Exponential(1)

    def load(self, rows: Sequence[tuple[str, int, SamplingParams]]) -> None:
        alloc, k = self.allocator, self.k
        for rid, length, _ in rows:  # room for the catch-up (to L + k + 1) and the draft steps (to L + 2k)
            if alloc.length(rid) < length + 2 * k:
                alloc.extend(rid, length + 2 * k)
        self.catch.set_rows([alloc.block_table(rid) for rid, _, _ in rows], [length + k + 1 for _, length, _ in rows])
        if self.noise is not None:
            for i, (rid, _, params) in enumerate(rows):
                if not params.greedy:
                    gen = self.sampler.generator(rid, params.seed, self.device)
                    for j in range(k):
                        self.noise[i, j].exponential_(generator=gen)

    def _pick(self, logits: torch.Tensor, j: int, s: "RoundSampling | None"
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if s is None:
            return logits.argmax(-1), None
        return pick_in_graph(logits, s.greedy, s.temperature, s.top_k, s.top_p, self.noise[:, j], s.filtered,
                             self.sampler.top_m)

    def draft(self, committed: torch.Tensor, num_accepted: torch.Tensor, aux: torch.Tensor | None,
              kv_lens: torch.Tensor, sampling: "RoundSampling | None" = None
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        k, head = self.k, self.head
        self.catch.kv_lens.copy_(kv_lens)                                       # entries up to L + k + 1
        self.catch.prepare()
        positions = (kv_lens[:, None] - (k + 1) + self._offsets[None, :]).reshape(-1)  # L .. L + k
        tokens = committed.clamp(min=0).reshape(-1)                             # placeholders -> any id
        out = head(tokens, positions, self.catch, head.fuse_features(aux))      # [R*(k+1), H]
        g = out.view(self.rows, k + 1, -1)[self._rows, num_accepted]             # entry L + a + 1: [R, H]
        d, q = self._pick(head.compute_logits(g), 0, sampling)
        drafts, qs = [d], [q]
        base = kv_lens - k + num_accepted                                       # L + a + 1 entries held
        for j in range(1, k):
            self.step.kv_lens.copy_(base + j)
            self.step.prepare()
            g = head(d, base + j - 1, self.step, g)
            d, q = self._pick(head.compute_logits(g), j, sampling)
            drafts.append(d)
            qs.append(q)
        return torch.stack(drafts, dim=1), None if sampling is None else torch.stack(qs, dim=1)

    def commit(self, request_id: str, length: int) -> None:
        self.allocator.truncate(request_id, length)
