"""Does importing torch change a grpc.aio client's CPU while it waits for streamed messages?

bench-serve's load clients no longer load torch; an earlier client design (a thread per stream) used ~10x the CPU
without it. This probe streams ``--messages`` small messages a stream, one every ``--gap-ms``, from a plain gRPC
server in a process of its own to ``--streams`` streams on one event loop, and prints the client's CPU share, with
torch imported (``--torch``) or not. Alternate the two in a shell loop to compare:

    for m in "" --torch "" --torch; do python -m bench.client_cpu_probe $m; done
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import multiprocessing as mp
import resource
import time


def _server(port_q, messages: int, gap_s: float) -> None:
    from concurrent import futures

    import grpc

    def stream(_req, _ctx):
        for _ in range(messages):
            time.sleep(gap_s)
            yield b"x" * 16

    handler = grpc.method_handlers_generic_handler("probe.S", {"Go": grpc.unary_stream_rpc_method_handler(stream)})
    server = grpc.server(futures.ThreadPoolExecutor(8))
    server.add_generic_rpc_handlers((handler,))
    port_q.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    server.wait_for_termination()


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _client(port: int, streams: int) -> tuple[int, float, float]:
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        go = channel.unary_stream("/probe.S/Go", request_serializer=lambda x: x, response_deserializer=lambda x: x)
        await channel.channel_ready()
        received = 0

        async def one() -> None:
            nonlocal received
            async for _ in go(b""):
                received += 1

        cpu0, t0 = _cpu_s(), time.monotonic()
        await asyncio.gather(*(one() for _ in range(streams)))
        return received, _cpu_s() - cpu0, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch", action="store_true", help="import torch in the client first")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--messages", type=int, default=2000, help="messages a stream")
    ap.add_argument("--gap-ms", type=float, default=1.0, help="the server's pause before each message")
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    if args.torch:
        importlib.import_module("torch")
    ctx = mp.get_context("spawn")
    port_q = ctx.Queue()
    server = ctx.Process(target=_server, args=(port_q, args.messages, args.gap_ms / 1e3), daemon=True)
    server.start()
    port = port_q.get(timeout=60)
    try:
        for _ in range(args.runs):
            n, cpu, wall = asyncio.run(_client(port, args.streams))
            print(f"torch={args.torch} messages={n} client cpu {cpu:.2f} s over {wall:.2f} s: {100 * cpu / wall:.1f} %")
    finally:
        server.kill()


if __name__ == "__main__":
    main()
