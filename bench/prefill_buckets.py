"""What one prefill-graph replay costs by bucket (rows x padded length): ``python -m bench.prefill_buckets`` (cuda).

The target (default model, bfloat16, the default engine config) captures each bucket of whole prompts
(engine/prefill_graphs.py) and replays it ``--iters`` times between CUDA events. One JSON line a bucket: rows, padded
length, tokens, ms a replay, and µs a padded token. What ``engine/prefill_graphs.py``'s packing cost model
(``REPLAY_TOKENS``) is fitted to.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from engine.assets import default_model_path
from engine.config import EngineConfig
from engine.models.loader import load_model
from engine.prefill_graphs import OWN_KEYS, PREFILL_BUCKETS, PrefillRow
from engine.runner import ModelRunner


def _time(replay, iters: int, device: str) -> float:
    """ms a replay: CUDA events on a GPU, the wall clock elsewhere."""
    if device != "cuda":
        t0 = time.perf_counter()
        with torch.inference_mode():
            for _ in range(iters):
                replay()
        return (time.perf_counter() - t0) * 1e3 / iters
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,8,16,32,64", help="rows buckets to time (comma-separated)")
    ap.add_argument("--lengths", default="64,128,256,512", help="padded lengths to time (comma-separated)")
    ap.add_argument("--max-tokens", type=int, default=16384, help="skip buckets of more tokens than this")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default="cuda", help="cuda (captured replays); cpu runs each bucket eagerly (a check)")
    args = ap.parse_args()
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    loaded = load_model(default_model_path(quiet=True), device=args.device, dtype=getattr(torch, dtype), progress=False)
    config = EngineConfig(device=args.device, dtype=dtype, attention="torch", cuda_graphs=True,
                          kv_cache_tokens=max(args.max_tokens, 4096) * 2)
    runner = ModelRunner(loaded.model, config)
    pg = runner.prefill_graphs
    for q in (int(x) for x in args.lengths.split(",")):
        assert q in PREFILL_BUCKETS, q
        for r in (int(x) for x in args.rows.split(",")):
            if r * q > args.max_tokens:
                continue
            key = (r, q, OWN_KEYS, (), 0)
            b = pg._buckets.get(key) or pg._build(*key)
            rows = [PrefillRow(f"s{i}", list(range(100, 100 + q)), 0, 1) for i in range(r)]
            for row in rows:
                runner.allocator.extend(row.seq_id, q)
            pg.run(key, rows)  # inputs in place, one replay
            ms = _time(lambda: b.graph.replay() if b.graph is not None else pg._forward(b), args.iters, args.device)
            print(json.dumps({"rows": r, "q": q, "tokens": r * q, "ms": round(ms, 3),
                              "us_per_token": round(1e3 * ms / (r * q), 3)}), flush=True)
            for row in rows:
                runner.allocator.free(row.seq_id)


if __name__ == "__main__":
    main()
