"""GPU time of one captured uniform step, and the kernels in it: ``python -m bench.step_profile``.

For each (batch, q_len) the engine's own ``ModelRunner`` prefills ``--context`` tokens per
sequence, then runs one step through ``StepGraphs`` (capturing the bucket) and measures
- ``replay_ms``: ``graph.replay()`` alone, CUDA events over ``--iters`` replays (GPU time);
- ``step_ms``: the whole ``runner.run`` of that step (metadata, input copies, replay, output copy);
- the kernels of one replay (torch profiler): how many, and the ones that take the most time.
``--torch-ops`` runs the same buckets with the plain torch ops instead of the Triton kernels
(the engine before the fused kernels), for an A/B in one call. A JSON report goes to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from contextlib import ExitStack
from unittest import mock

import torch

from engine.config import EngineConfig
from engine.models import ops
from engine.models.loader import load_model
from engine.runner import Chunk, ModelRunner


def _kernels(replay, top: int) -> tuple[int, float, list[dict]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    times: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.name].append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
    count = sum(len(v) for v in times.values())
    total = sum(sum(v) for v in times.values()) / 1e3
    rows = sorted(({"kernel": k[:90], "count": len(v), "ms": round(sum(v) / 1e3, 4)} for k, v in times.items()),
                  key=lambda r: -r["ms"])
    return count, total, rows[:top]


def profile_case(model, batch: int, q_len: int, context: int, iters: int, aux: tuple[int, ...], top: int) -> dict:
    cfg = EngineConfig(device="cuda", dtype="bfloat16", attention="torch", max_batch_size=max(batch, 1),
                       max_k=max(q_len - 1, 1), k=0, kv_cache_tokens=batch * (context + 64) + 4096)
    runner = ModelRunner(model.model, cfg)
    seqs = [f"s{i}" for i in range(batch)]
    runner.run([Chunk(s, [(7 * i + j) % 1000 + 10 for j in range(context)]) for i, s in enumerate(seqs)])
    chunks = [Chunk(s, [11] * q_len, num_logits=q_len) for s in seqs]
    runner.run(chunks, aux_layers=aux)  # captures the bucket
    for s in seqs:
        runner.truncate(s, context)
    (bucket,) = runner.graphs._buckets.values()
    replay = bucket.graph.replay
    for _ in range(10):
        replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        replay()
    end.record()
    torch.cuda.synchronize()
    replay_ms = start.elapsed_time(end) / iters
    t0 = time.perf_counter()
    for _ in range(iters // 4):
        runner.run(chunks, aux_layers=aux)
        for s in seqs:
            runner.truncate(s, context)
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t0) * 1e3 / (iters // 4)
    count, kernel_ms, top_rows = _kernels(replay, top)
    return {"batch": batch, "q_len": q_len, "context": context, "aux_layers": list(aux),
            "replay_ms": round(replay_ms, 4), "step_ms": round(step_ms, 4), "kernels": count,
            "kernel_ms": round(kernel_ms, 4), "top_kernels": top_rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", default="1,8,64", help="comma-separated batch sizes")
    p.add_argument("--q-len", default="1,5", help="tokens per row: 1 = decode, k + 1 = a verify")
    p.add_argument("--context", type=int, default=512, help="tokens already in each row's KV")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--aux", default="", help="comma-separated target layers to return as aux features (EAGLE)")
    p.add_argument("--top", type=int, default=8, help="kernels listed per case")
    p.add_argument("--torch-ops", action="store_true", help="plain torch ops, not the Triton kernels")
    p.add_argument("--model", help="target (default: SmolLM2-135M-Instruct)")
    p.add_argument("--out", help="JSON report")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench.step_profile: needs a CUDA device")
    from engine.assets import default_model_path

    model = load_model(args.model or default_model_path(), device="cuda", dtype=torch.bfloat16, progress=False)
    aux = tuple(int(a) for a in args.aux.split(",") if a)
    rows = []
    with ExitStack() as stack:
        if args.torch_ops:
            stack.enter_context(mock.patch.object(ops, "use_kernels", lambda x: False))
            stack.enter_context(mock.patch("engine.attention.static.StaticAttention.__init__.__defaults__", (False,)))
        for b in (int(x) for x in args.batch.split(",")):
            for q in (int(x) for x in args.q_len.split(",")):
                row = profile_case(model, b, q, args.context, args.iters, aux, args.top)
                row["ops"] = "torch" if args.torch_ops else "triton"
                rows.append(row)
                print(f"{row['ops']:6s} batch {b:3d} q_len {q}: replay {row['replay_ms']:.3f} ms, step "
                      f"{row['step_ms']:.3f} ms, {row['kernels']} kernels ({row['kernel_ms']:.3f} ms of kernel time)",
                      flush=True)
                for k in row["top_kernels"][:4]:
                    print(f"    {k['ms']:8.4f} ms  x{k['count']:4d}  {k['kernel'][:70]}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
