"""The loaded process's objects kept out of Python's garbage collections.

A process with the model, its tokenizer and (in a bench) the datasets loaded tracks about 300k Python
objects. A full (generation 2) collection walks all of them: 124-198 ms on the H100 machine's CPU, 140-260 ms
on a 2-core one (bench/RESULTS.md). Python starts one whenever enough objects have survived two collections, which
happens soon after a load, so the first requests a server answers, or the first case a bench times, could stall
for that long in the middle of a round. ``gc.freeze()`` moves every object alive into a permanent generation that
collections skip (as vLLM does after its warm-up, and SGLang offers): the collections that still run walk only
what was made since.

Objects frozen are never collected for cycles while frozen, so freeze what lives as long as the process (a
server after its warm-up) or unfreeze when what was frozen is to be dropped (``frozen_heap``: a bench case's
decoder).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


def freeze_heap() -> int:
    """Collect what is garbage now, then leave every object still alive out of later collections -> how many
    objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@contextmanager
def frozen_heap() -> Iterator[int]:
    """``freeze_heap()`` while entered (yields how many objects it froze); on exit they are collectable again."""
    frozen = freeze_heap()
    try:
        yield frozen
    finally:
        gc.unfreeze()
