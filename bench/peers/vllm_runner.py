"""vLLM on ``tandem bench``'s prompts, run inside vLLM's own environment.

``bench.peers.vllm`` starts this module as a subprocess whose ``PYTHONPATH`` puts the staged
vLLM first (``bench/device/PEERS.md``): vLLM's pins (protobuf, flashinfer, ...) never meet
Tandem's. It reads a spec (JSON), builds one ``vllm.LLM`` and, per case, sends the prompts
``batch_size`` at a time arriving together, EOS ignored, exactly as ``bench.run.run_case``
does for Tandem. The engine is stepped by hand (``LLMEngine.step`` with delta outputs) so each
request's new tokens get a timestamp the moment vLLM hands them over: time to first token and
inter-token latency mean the same as in Tandem's rows (``bench.timing.TokenClock``).

Fairness, stated: bfloat16, vLLM's defaults otherwise (torch.compile + CUDA graphs, async
scheduling) except prefix caching, which is off (Tandem has none, and the same prompts run in
every case); sampled rows use one engine seed, not a seed per request (vLLM's per-request
generators take a slower path). ``acceptance_length`` is tokens per step a request got tokens
in (Tandem's committed per round); ``vllm_mean_acceptance_length`` is vLLM's own metric
(1 + accepted / drafts, steps without an n-gram match not counted).

Imports only vLLM, torch and ``bench.timing``: nothing that needs Tandem's protobuf.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.timing import TokenClock

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens",
                 "vllm:spec_decode_num_draft_tokens")


def build_llm(spec: dict):
    from vllm import LLM

    method = spec["method"]
    kwargs = dict(model=spec["model_dir"], dtype="bfloat16", seed=spec["seed"], load_format=spec["load_format"],
                  skip_tokenizer_init=True, enable_prefix_caching=False, max_num_seqs=spec["max_num_seqs"],
                  max_model_len=spec["max_model_len"], gpu_memory_utilization=spec["gpu_memory_utilization"],
                  disable_log_stats=False)
    if method != "none":
        kwargs["speculative_config"] = {"method": method, "num_speculative_tokens": spec["k"],
                                        "prompt_lookup_max": spec["prompt_lookup_max"],
                                        "prompt_lookup_min": spec["prompt_lookup_min"]}
    return LLM(**kwargs)


def spec_counters(llm) -> dict[str, float]:
    out = dict.fromkeys(SPEC_COUNTERS, 0.0)
    for m in llm.get_metrics():
        if m.name in out:
            out[m.name] += float(getattr(m, "value", 0) or 0)
    return out


def gpu_memory_used_mib() -> float | None:
    """Memory in use on the GPU, every process (vLLM's engine core runs in its own)."""
    if not shutil.which("nvidia-smi"):
        return None
    dev = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    out = subprocess.run(["nvidia-smi", "-i", dev, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True)
    return float(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def _params(temperature: float, max_tokens: int):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(temperature=temperature, top_p=1.0, max_tokens=max_tokens, min_tokens=max_tokens,
                          ignore_eos=True, detokenize=False, output_kind=RequestOutputKind.DELTA)


def run_batches(engine, prompts: list[list[int]], batch_size: int, params, tag: str) -> dict:
    """All prompts, ``batch_size`` at a time arriving together; per-request token timestamps."""
    clock = TokenClock()
    tokens = deliveries = 0
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        t0 = time.perf_counter()
        for j in range(i, min(i + batch_size, len(prompts))):
            rid = f"{tag}-{j}"
            clock.arrive(rid, t0)
            engine.add_request(rid, {"prompt_token_ids": list(prompts[j])}, params)
        while engine.has_unfinished_requests():
            outs = engine.step()
            now = time.perf_counter()
            for out in outs:
                n = sum(len(c.token_ids) for c in out.outputs)
                clock.tokens(out.request_id, n, now)
                tokens += n
                deliveries += n > 0
    elapsed = time.perf_counter() - start
    return {"output_tokens": tokens, "elapsed_s": round(elapsed, 3), "tokens_per_s": round(tokens / elapsed, 2),
            "acceptance_length": round(tokens / max(deliveries, 1), 3), **clock.summary()}


def run(spec: dict) -> list[dict]:
    import vllm

    t0 = time.perf_counter()
    llm = build_llm(spec)
    init_s = round(time.perf_counter() - t0, 1)
    engine = llm.llm_engine
    # warm-up: every case's batch size and sampling path once, before any clock starts. vLLM compiles some kernels
    # on first use (its own JIT monitor warns of it): warming each case just before it ran left the first greedy
    # cases 15-40% slower than the same cases run again later (bench/RESULTS.md, issue 19)
    for n, case in enumerate(spec["cases"]):
        bs = case["batch_size"]
        run_batches(engine, spec["prompts"][case["dataset"]][:bs], bs, _params(case["temperature"], 16), f"warm{n}")
    rows = []
    for n, case in enumerate(spec["cases"]):
        prompts = spec["prompts"][case["dataset"]]
        bs, temperature = case["batch_size"], case["temperature"]
        before = spec_counters(llm)
        row = run_batches(engine, prompts, bs, _params(temperature, spec["max_tokens"]), f"case{n}")
        after = spec_counters(llm)
        drafts = after[SPEC_COUNTERS[0]] - before[SPEC_COUNTERS[0]]
        accepted = after[SPEC_COUNTERS[1]] - before[SPEC_COUNTERS[1]]
        row.update(engine=spec["engine"], draft=spec["method"] if spec["method"] != "none" else None,
                   k=spec["k"] if spec["method"] != "none" else 0, batch_size=bs, temperature=temperature,
                   dataset=case["dataset"], num_prompts=len(prompts), max_tokens=spec["max_tokens"],
                   vllm_mean_acceptance_length=round(1 + accepted / drafts, 3) if drafts else None,
                   vllm_drafts=int(drafts), peak_memory_mib=gpu_memory_used_mib(),
                   peak_memory_kind="nvidia-smi, whole GPU", vllm_version=vllm.__version__, vllm_init_s=init_s,
                   load_format=spec["load_format"])
        print(f"vllm_runner: {spec['engine']} case {n + 1}/{len(spec['cases'])}: {row['tokens_per_s']} tokens/s",
              file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="vLLM rows for tandem bench (run by bench.peers.vllm)")
    p.add_argument("--spec", required=True, help="the spec JSON bench.peers.vllm writes")
    p.add_argument("--out", required=True, help="where the rows go (JSON list)")
    args = p.parse_args(argv)
    rows = run(json.loads(Path(args.spec).read_text()))
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
