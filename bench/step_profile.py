"""GPU time of one captured uniform step, and the kernels in it: ``python -m bench.step_profile``.

For each (batch, q_len) the engine's own ``ModelRunner`` prefills ``--context`` tokens per
sequence, then runs one step through ``StepGraphs`` (capturing the bucket) and measures
- ``replay_ms``: ``graph.replay()`` alone, CUDA events over ``--iters`` replays (GPU time);
- ``step_ms``: the whole ``runner.run`` of that step (metadata, input copies, replay, output copy);
- the kernels of one replay (torch profiler): how many, and the ones that take the most time.
With ``--round DRAFT`` it profiles whole fused rounds instead (engine/fused_round.py: the target's
verify, accept and the drafter's next drafts in one graph; ``--temperature`` > 0: sampled rounds, rejection
sampling and sampled drafts): requests of ``--context`` prompt tokens
decode until every one is on the fast path, then ``round_ms`` is ``SpecDecoder.step`` (all host
work), ``run_ms`` the fused round's own ``run`` (inputs in, replay, the one read-back, rollback) and
``replay_ms`` the graph alone; at 16 rows or more on cuda a greedy step holds ``--spec-rounds`` rounds (the
engine's default 2: ``spec_rounds`` in the report), so ``round_ms`` is then that many rounds' time.
With ``--prefill LENS`` it times a new request's first round (its prefill, what sets time to first
token): ``prefill_ms`` is ``SpecDecoder.step`` for one new request of each prompt length (plain decoding,
the bench's engine config), with its kernels and the Python functions the host spends it in (cProfile);
with ``--round DRAFT`` too, also its second round (``second_round_ms``: the drafter's first drafts, made
eagerly, and the first verify), whose kernels and host functions are then the ones listed.
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
from engine.graphs import MAX_GRAPH_TOKENS
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


def _replay_ms(replay, iters: int) -> float:
    """GPU time of one ``replay()``, by CUDA events over ``iters`` replays after 10 warm ones."""
    for _ in range(10):
        replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


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
    replay_ms = _replay_ms(replay, iters)
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


def profile_round(model, draft: str, k: int, batch: int, context: int, iters: int, top: int,
                  temperature: float = 0.0, spec_rounds: int | None = None,
                  spec_tree: tuple[int, ...] | None = None) -> dict:
    from engine.config import SamplingParams
    from engine.factory import decoder_for

    cfg = EngineConfig(device="cuda", dtype="bfloat16", attention="torch", max_batch_size=batch, max_k=max(k, 1),
                       k=k, kv_cache_tokens=batch * (context + 8 * iters + 512) + 4096, spec_rounds=spec_rounds,
                       spec_tree=spec_tree)
    dec = decoder_for(model, cfg, draft)
    if dec.fused is None:
        raise SystemExit(f"bench.step_profile: {draft} with k={k} takes no fused rounds")
    for i in range(batch):
        dec.add_request([(7 * i + j) % 1000 + 10 for j in range(context)],
                        SamplingParams(max_tokens=8 * iters + 256, ignore_eos=True, temperature=temperature, seed=i))
    run_s = []
    run = dec.fused.run

    def timed_run(rows, *args, **kwargs):
        t0 = time.perf_counter()
        out = run(rows, *args, **kwargs)
        run_s.append(time.perf_counter() - t0)
        return out

    dec.fused.run = timed_run
    for _ in range(8):  # prefill, first drafts, graph capture
        dec.step()
    run_s.clear()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        dec.step()
    round_ms = (time.perf_counter() - t0) * 1e3 / iters
    graphs = [g for g in dec.fused.store.graphs.values() if g.graph is not None]
    replay = max(graphs, key=lambda g: g.inputs.shape[0]).graph.replay  # rewrites the same slots: idempotent
    replay_ms = _replay_ms(replay, iters)
    count, kernel_ms, top_rows = _kernels(replay, top)
    host_rows = _host_ops(dec.step, 3, top)
    host_fns = _host_fns(dec.step, 20, top)
    return {"round": draft, "k": k, "batch": batch, "context": context, "temperature": temperature,
            "spec_tree": list(spec_tree) if spec_tree else None,
            "spec_rounds": dec.fused.store.steps_for(batch) if k else 0,
            "fused_rounds_timed": len(run_s),
            "round_ms": round(round_ms, 4), "run_ms": round(sum(run_s) * 1e3 / max(len(run_s), 1), 4),
            "replay_ms": round(replay_ms, 4), "kernels": count, "kernel_ms": round(kernel_ms, 4),
            "top_kernels": top_rows, "top_host_ops": host_rows, "top_host_fns": host_fns}


def profile_prefill(model, length: int, iters: int, top: int, draft: str = "none", k: int = 4) -> dict:
    """A new request's first round (its prefill); with a drafter also its second: the first drafts
    (the drafter's catch-up over the prompt, eagerly) and the first verify."""
    from engine.config import SamplingParams
    from engine.factory import decoder_for

    k = 0 if draft == "none" else k
    cfg = EngineConfig(device="cuda", dtype="bfloat16", attention="torch", max_batch_size=4, k=k, max_k=max(k, 1),
                       kv_cache_tokens=4 * (length + 64) + 4096)
    dec = decoder_for(model, cfg, draft if k else None)
    params = SamplingParams(max_tokens=2 * k + 4, ignore_eos=True)
    prompts = [[(7 * i + j) % 1000 + 10 for j in range(length)] for i in range(iters + 4)]

    def rounds(prompt, second=None) -> list[float]:
        """Run the first round (and the second with a drafter; ``second`` wraps it); seconds of each."""
        rid = dec.add_request(prompt, params)
        times = []
        for fn in [dec.step] + ([second or dec.step] if k else []):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        dec.abort(rid)
        return times

    for prompt in prompts[:3]:  # kernels compiled, buckets captured
        rounds(prompt)
    timed = [rounds(prompt) for prompt in prompts[3:-1]]
    prefill_ms = sum(t[0] for t in timed) * 1e3 / iters
    row = {"prefill": length, "draft": draft, "prefill_ms": round(prefill_ms, 3)}
    if k:  # the second round's kernels and host functions
        row["second_round_ms"] = round(sum(t[1] for t in timed) * 1e3 / iters, 3)
        count, kernel_ms, top_rows = _kernels(lambda: rounds(prompts[0]), top)  # both rounds
        fns = []
        rounds(prompts[-1], lambda: fns.extend(_host_fns(dec.step, 1, top)))
    else:
        count, kernel_ms, top_rows = _kernels(lambda: rounds(prompts[0]), top)
        fns = _host_fns(lambda: rounds(prompts[1]), 1, top)
    return {**row, "kernels": count, "kernel_ms": round(kernel_ms, 4), "top_kernels": top_rows, "top_host_fns": fns}


def _host_fns(fn, calls: int, top: int) -> list[dict]:
    """The Python functions ``fn`` spends its host time in (cProfile; self and cumulative ms per call)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    for _ in range(calls):
        prof.runcall(fn)
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, primitive, tottime, cumtime, callers)
    host = sorted(({"fn": f"{f.rsplit('/', 2)[-1]}:{name}", "calls": v[0] / calls,
                    "cum_ms": round(v[3] * 1e3 / calls, 3), "self_ms": round(v[2] * 1e3 / calls, 3)}
                   for (f, _, name), v in stats.items()), key=lambda r: -r["self_ms"])
    return host[:top]


def _host_ops(fn, calls: int, top: int) -> list[dict]:
    """CPU time of ``fn`` by aten op and CUDA runtime call (self time over ``calls`` calls): where the
    host side of a round goes (copies, syncs, graph launches)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = sorted(({"op": e.key[:80], "count": e.count, "self_cpu_ms": round(e.self_cpu_time_total / 1e3 / calls, 4)}
                   for e in prof.key_averages()), key=lambda r: -r["self_cpu_ms"])
    return rows[:top]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", default="1,8,64", help="comma-separated batch sizes")
    p.add_argument("--q-len", default="1,5", help="tokens per row: 1 = decode, k + 1 = a verify")
    p.add_argument("--context", type=int, default=512, help="tokens already in each row's KV")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--aux", default="", help="comma-separated target layers to return as aux features (EAGLE)")
    p.add_argument("--top", type=int, default=8, help="kernels listed per case")
    p.add_argument("--round", metavar="DRAFT", help="profile fused rounds with this drafter (none: plain decode)")
    p.add_argument("--k", type=int, default=4, help="--round: draft length (with --spec-tree: the tree's depth)")
    p.add_argument("--temperature", type=float, default=0.0, help="--round: the requests' temperature (0: greedy)")
    p.add_argument("--spec-rounds", type=int, help="--round: whole rounds a greedy speculative replay of 16 rows or "
                   "more runs (default: the engine's, 2 on cuda); a step then holds that many rounds")
    p.add_argument("--spec-tree", metavar="B1,B2,..", help="--round: greedy rounds verify a tree of drafts of these "
                   "children per node by depth (as tandem bench --spec-tree)")
    p.add_argument("--prefill", metavar="LENS", help="comma-separated prompt lengths: time a new request's first round")
    p.add_argument("--torch-ops", action="store_true", help="plain torch ops, not the Triton kernels")
    p.add_argument("--eager-prefill", action="store_true",
                   help="--prefill: the eager path (no prefill graphs), the engine before engine/prefill_graphs.py")
    p.add_argument("--model", help="target (default: SmolLM2-135M-Instruct)")
    p.add_argument("--out", help="JSON report")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench.step_profile: needs a CUDA device")
    from engine.assets import default_model_path

    model = load_model(args.model or default_model_path(), device="cuda", dtype=torch.bfloat16, progress=False)
    aux = tuple(int(a) for a in args.aux.split(",") if a)
    rows = []
    for length in (int(x) for x in (args.prefill or "").split(",") if x):
        with mock.patch("engine.prefill_graphs.PrefillGraphs.bucket_for", lambda *a: None) if args.eager_prefill \
                else ExitStack():
            row = profile_prefill(model, length, args.iters, args.top, args.round or "none", args.k)
        rows.append(row)
        second = f", then {row['second_round_ms']:.3f} ms (first drafts)" if "second_round_ms" in row else ""
        print(f"prefill {length:5d} tokens: {row['prefill_ms']:.3f} ms{second}, {row['kernels']} kernels "
              f"({row['kernel_ms']:.3f} ms of kernel time)", flush=True)
        for k in row["top_kernels"][:4]:
            print(f"    {k['ms']:8.4f} ms  x{k['count']:4d}  {k['kernel'][:70]}")
        print("    host (self):", "; ".join(f"{h['fn']} {h['self_ms']:.2f} ms x{h['calls']:g}" for h in row["top_host_fns"]))
    if args.round and not args.prefill:
        top_shown = max(6, args.top)
        for b in (int(x) for x in args.batch.split(",")):
            tree = tuple(int(x) for x in args.spec_tree.split(",")) if args.spec_tree else None
            k = 0 if args.round == "none" else len(tree) if tree else args.k  # a tree's k is its depth
            row = profile_round(model, args.round, k, b, args.context, args.iters, args.top, args.temperature,
                                args.spec_rounds, tree)
            rows.append(row)
            shown = f" tree {args.spec_tree}" if args.spec_tree else ""
            print(f"round {args.round}{shown} k={row['k']} T={args.temperature} batch {b:3d}: step {row['round_ms']:.3f} ms, fused run "
                  f"{row['run_ms']:.3f} ms, replay {row['replay_ms']:.3f} ms, {row['kernels']} kernels "
                  f"({row['kernel_ms']:.3f} ms of kernel time)", flush=True)
            for k in row["top_kernels"][:top_shown]:
                print(f"    {k['ms']:8.4f} ms  x{k['count']:4d}  {k['kernel'][:70]}")
            print("    host, per step:", "; ".join(f"{h['op']} {h['self_cpu_ms']:.3f} ms x{h['count']}"
                                                   for h in row["top_host_ops"][:6]))
            print("    host (self, per step):", "; ".join(f"{h['fn']} {h['self_ms']:.3f} ms x{h['calls']:g}"
                                                          for h in row["top_host_fns"]))
    with ExitStack() as stack:
        if args.torch_ops:
            stack.enter_context(mock.patch.object(ops, "use_kernels", lambda x: False))
            stack.enter_context(mock.patch("engine.attention.static.StaticAttention.__init__.__defaults__", (False,)))
        for b in (int(x) for x in args.batch.split(",") if not (args.round or args.prefill)):
            for q in (int(x) for x in args.q_len.split(",")):
                if q > 1 and b * q > MAX_GRAPH_TOKENS:
                    print(f"batch {b:3d} q_len {q}: skipped, {b * q} tokens is more than a captured step holds "
                          f"(MAX_GRAPH_TOKENS {MAX_GRAPH_TOKENS})", flush=True)
                    continue
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
