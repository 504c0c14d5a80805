"""engine/heap.py: what is alive when a process has started is left out of Python's collections (a full one would
walk the loaded model's ~300k objects in the middle of a round), and a server freezes it once it is ready."""

from __future__ import annotations

import asyncio
import gc
import weakref

from engine.heap import frozen_heap
from rpc.ports import free_block
from rpc.server import Server, run_until_signal


class Node:
    """An object in a reference cycle: only a garbage collection frees it."""

    def __init__(self) -> None:
        self.me = self


def test_frozen_objects_outlive_collections_until_unfrozen():
    kept = [Node()]
    ref = weakref.ref(kept[0])
    garbage = weakref.ref(Node())  # a cycle already unreachable: collected before the freeze, not frozen
    with frozen_heap() as frozen:
        assert garbage() is None
        assert frozen > 0 and gc.get_freeze_count() > 0
        kept.clear()  # unreachable now, but frozen: no collection looks at it
        gc.collect()
        assert ref() is not None
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None


def test_a_server_freezes_what_it_started_with_once_warmed_up():
    kept: list[Node] = []
    seen: dict[str, object] = {}

    async def warm_up() -> None:  # a model's objects, made while starting
        assert gc.get_freeze_count() == 0
        kept.append(Node())
        seen["ref"] = weakref.ref(kept[0])

    async def main() -> None:
        server = Server([], "127.0.0.1", free_block(1), 4 << 20)
        serving = asyncio.create_task(run_until_signal(server, grace_s=0.1, warm_up=warm_up))
        for _ in range(500):  # up to 5 s for the server to start and freeze
            if gc.get_freeze_count():
                break
            await asyncio.sleep(0.01)
        kept.clear()
        gc.collect()
        seen["alive_while_serving"] = seen["ref"]() is not None
        # stopped by cancelling, not by a signal: a stop signal's deadline would end this test process
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await server.stop(0)

    try:
        asyncio.run(main())
    finally:
        gc.unfreeze()
    assert seen["alive_while_serving"] is True
    gc.collect()
    assert seen["ref"]() is None
