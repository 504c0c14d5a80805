"""What one call to a drafter service costs on the wire, against how long the caller was busy before it.

Starts a real drafter service (``tandem drafter --draft ngram``, plaintext on loopback, CPU) and a raw TCP echo
process, then for each gap (the caller busy on its own work between calls, as a verifier is between two rounds'
Draft calls) times, p50 over ``--calls`` calls: a raw socket round trip (what the machine's wake-ups cost), a unary
``Describe`` (gRPC with no engine work), a one-row ``Draft`` over the ``DraftStream`` the verifier keeps open
(verifier_svc/remote_drafter.py), whose drafter work (the n-gram lookup) is a few microseconds, and the same
``Draft`` as a unary call made on the caller's thread (``RemoteDrafter(stream=False)``).

    python -m bench.wire_probe --gaps-ms 0,2,5,20 --calls 300

One JSON line per gap.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time

from engine.config import SamplingParams
from engine.drafters.base import DraftRequest
from protos.tandem.v1 import drafter_pb2
from rpc.ports import free_block
from verifier_svc.remote_drafter import RemoteDrafter, open_channel

_ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(1); print("ready", flush=True); c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (d := c.recv(256)):
    c.sendall(d)
"""


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _p50(fn, calls: int, gap_s: float) -> float:
    times = []
    for _ in range(calls):
        _busy(gap_s)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(sorted(times)[len(times) // 2] * 1e3, 3)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gaps-ms", default="0,2,5,20", help="the caller's busy time between calls, comma-separated")
    ap.add_argument("--calls", type=int, default=300, help="calls per gap and kind")
    args = ap.parse_args(argv)
    echo_port = free_block(2)
    drafter_port = echo_port + 1
    echo = subprocess.Popen([sys.executable, "-c", _ECHO, str(echo_port)], stdout=subprocess.PIPE, text=True)
    drafter = subprocess.Popen([sys.executable, "-m", "cli.main", "drafter", "--draft", "ngram", "--device", "cpu",
                                "--insecure", "--drafter-port", str(drafter_port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        echo.stdout.readline()
        sock = socket.create_connection(("127.0.0.1", echo_port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        address = f"127.0.0.1:{drafter_port}"
        remote, unary = (RemoteDrafter(address, 49152, channel=open_channel(address, 64 << 20, None), timeout_s=30.0,
                                       connect_timeout_s=120.0, stream=stream) for stream in (True, False))
        tokens = list(range(100, 164))
        params = SamplingParams(max_tokens=1 << 20)

        def draft(drafter: RemoteDrafter = remote) -> None:
            tokens.append(100 + len(tokens) % 50)
            drafter.propose([DraftRequest("probe", list(tokens), 4, params)])

        def raw() -> None:
            sock.sendall(b"x" * 64)
            sock.recv(256)

        def describe() -> None:
            remote.stub.Describe(drafter_pb2.DescribeRequest(), timeout=5.0)

        for gap in (float(g) for g in args.gaps_ms.split(",")):
            row = {"gap_ms": gap}
            for name, fn in (("socket_ms", raw), ("describe_ms", describe), ("draft_ms", draft),
                             ("draft_unary_ms", lambda: draft(unary))):
                row[name] = _p50(fn, args.calls, gap / 1e3)
            print(json.dumps(row), flush=True)
    finally:
        drafter.kill()
        echo.kill()


if __name__ == "__main__":
    main()
