"""``tandem bench-plot``: draw a ``tandem bench`` JSON as a PNG beside it (needs matplotlib)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("bench-plot", help="draw bench/results/NAME.json as NAME.png (tokens/s vs batch size)",
                       description="One panel per (dataset, temperature): tokens/s of every engine against batch "
                                   "size, log-log. Needs matplotlib (in the dev extra).")
    p.add_argument("results", type=Path, help="a JSON written by `tandem bench`")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bench.plot import plot_file

    if not args.results.is_file():
        raise ValueError(f"results: {args.results} is not a file")
    print(f"wrote {plot_file(args.results)}")
    return 0
