"""What share of a thread's busy time py-spy found inside given frames, from ``py-spy record -f raw`` files.

Each line of a raw file is one distinct stack (``thread (tid): name;frame;frame;... count``). Samples of other threads
are left out, and so are idle ones (a frame matching ``--idle``: by default the engine process waiting on its pipe,
verifier_svc/core.py). For each pattern, the share of the busy samples with a frame that starts with it:
``RoundSampling.load (`` for a function, ``RoundSampling.load (engine/rounds/graph_sampling.py:97)`` for one line.

    python -m bench.pyspy_shares bench/results/h100-6912043-pyspy-colocated-native.txt \
      --frames "RoundSampling.load (engine/rounds/graph_sampling.py:9" "send (verifier_svc/core.py"

One JSON line per file.
"""

from __future__ import annotations

import argparse
import json


def shares(path: str, frames: list[str], thread: str = "MainThread", idle: str = "_ConnectionBase.poll (") -> dict:
    busy, hits = 0, dict.fromkeys(frames, 0)
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            names = stack.split(";")
            if not stack or thread not in names[0] or any(n.startswith(idle) for n in names):
                continue
            busy += int(count)
            for pattern in frames:
                if any(n.startswith(pattern) for n in names[1:]):
                    hits[pattern] += int(count)
    return {"file": path, "busy_samples": busy,
            "shares_pct": {p: round(100 * n / busy, 1) if busy else None for p, n in hits.items()}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="py-spy raw files")
    ap.add_argument("--frames", nargs="+", required=True, help="frame prefixes, each counted on its own")
    ap.add_argument("--thread", default="MainThread", help="the thread whose samples count (default MainThread)")
    ap.add_argument("--idle", default="_ConnectionBase.poll (", help="a frame prefix that marks a sample idle")
    args = ap.parse_args(argv)
    for path in args.files:
        print(json.dumps(shares(path, args.frames, args.thread, args.idle)), flush=True)


if __name__ == "__main__":
    main()
