"""What a bucket's host-side load costs a round: ``StaticAttention.set_rows`` timed on the CPU, per call.

Before each replay of a round's graph the host writes every row's block table and KV length into the bucket's
device buffers (engine/attention/static.py). This times that call over rounds in which every row commits 2-3
tokens (so a row's table grows by a block every few rounds, as in decoding), 16-token blocks, 128-block tables,
at 4, 16 and 64 rows, on the CPU (the host's work; the copy itself is a memcpy here). ``--trees`` runs the same
measurement in each source tree given (e.g. an older commit's ``git archive``), in turn, twice (ABBA), each in a
process of its own.

    python -m bench.set_rows_probe --trees .,/tmp/base

One JSON line per tree and run: microseconds per call by rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_MEASURE = """
import json, random, sys, time
import torch
from engine.attention.static import StaticAttention
from engine.kv_cache import PagedKVCache

out = {}
for rows in (4, 16, 64):
    cache = PagedKVCache(1, 2, 8, num_tokens=rows * 2048 + 64, block_size=16, dtype=torch.float32, device="cpu")
    alloc = cache.allocator
    alloc.extend("pad", 1)
    attn = StaticAttention(cache, 6, rows, 5, max_blocks=128, scratch_block=alloc.block_table("pad")[0],
                           use_kernel=False)
    ids = [f"r{i}" for i in range(rows)]
    lens = {r: random.Random(i).randint(200, 600) for i, r in enumerate(ids)}
    spent, calls = 0.0, int(sys.argv[1])
    for it in range(calls):
        for r in ids:
            lens[r] += 2 if it % 2 else 3
            alloc.extend(r, lens[r])
        tables, kv = [alloc.block_table(r) for r in ids], [lens[r] for r in ids]
        start = time.perf_counter()
        attn.set_rows(tables, kv)
        spent += time.perf_counter() - start
    out[rows] = round(spent / calls * 1e6, 1)
print(json.dumps(out))
"""


def measure(tree: str, calls: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(calls)], env=env, cwd=os.path.abspath(tree),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", default=".", help="comma-separated source trees to time, in turn (ABBA when two)")
    ap.add_argument("--calls", type=int, default=500, help="set_rows calls timed per batch size")
    args = ap.parse_args(argv)
    trees = [t for t in args.trees.split(",") if t]
    order = trees + trees[::-1] if len(trees) > 1 else trees
    for tree in order:
        print(json.dumps({"tree": tree, "us_per_call_by_rows": measure(tree, args.calls)}), flush=True)


if __name__ == "__main__":
    main()
