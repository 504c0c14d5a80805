"""Import check for the staged vLLM 0.26.0 peer (bench/device/stage_peers.sh, PEERS.md).

Imports every module that the peer runs touch: (a) offline ``vllm.LLM`` with plain decoding,
(b) n-gram speculation (``method="ngram"``: numba on the host; ``"ngram_gpu"``), (c)
``load_format="dummy"`` for Llama shapes, (d) the OpenAI-compatible server with streaming
completions, (e) stepping ``LLMEngine`` directly; plus the CUDA platform, both GPU model
runners, the FlashAttention-3 backend and the FlashInfer sampler that an H100 run goes
through.  Then it builds the engine configuration of a Llama-3.2-1B-shaped dummy model for
plain, ``ngram`` and ``ngram_gpu`` decoding (which model runner, async scheduling or not)
and the server's FastAPI app, without starting an engine.

First thing on the GPU machine, the peer directory ahead of everything else:

    source .carry/env/setup.sh && source .carry/env/peers.sh &&
      PYTHONPATH="$TANDEM_PEER_PYTHONPATH:$PYTHONPATH" python3 bench/device/peer_import_check.py

It prints one line per module and a summary, and exits 1 when anything is missing.
Without CUDA (the staging machine) the CUDA extensions cannot load; those failures are
listed, the extensions are replaced by empty stand-ins so that the pure-Python imports
behind them are still checked, the configuration step runs against a pretend H100, and
only failures of another kind fail the check.  ``--lazy`` also lists third-party packages
that the loaded vLLM modules import inside functions and that are absent (informational).
``--smoke`` (GPU only) then starts one engine per method (plain, ngram, ngram_gpu; dummy
weights, eager, token-id prompts) in a subprocess each and generates 64 greedy and 64
top-p/top-k tokens: a few minutes, including FlashInfer's first JIT build of its sampler.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types

# modules beside this file (it runs as a script)
from peer_imports import dist_version, forget, lazy_imports, pretend_h100, stub_cuda_exts, top, try_import, where
from peer_modules import ATTRS, CASES, GROUPS, LLAMA_1B


def config_check(problems: list[str]) -> None:
    """Engine configuration for plain / ngram / ngram_gpu on a dummy Llama-3.2-1B shape."""
    from vllm.engine.arg_utils import EngineArgs

    d = tempfile.mkdtemp(prefix="peer-llama1b-")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(LLAMA_1B, f)
    for name, spec in CASES.items():
        try:
            ea = EngineArgs(model=d, skip_tokenizer_init=True, dtype="bfloat16", load_format="dummy",
                            max_model_len=4096, speculative_config=spec)
            cfg = ea.create_engine_config()
            sc = cfg.speculative_config
            cc = cfg.compilation_config
            line = (f"  config {name:9} runner {'V2' if cfg.use_v2_model_runner else 'V1'}, "
                    f"async scheduling {cfg.scheduler_config.async_scheduling}, "
                    f"compile mode {cc.mode}, cudagraph {cc.cudagraph_mode}")
            if sc:
                line += (f", spec {sc.method} k={sc.num_speculative_tokens}"
                         f" lookup {sc.prompt_lookup_min}..{sc.prompt_lookup_max}")
            print(line)
        except Exception as e:  # noqa: BLE001
            problems.append(f"engine config {name}: {type(e).__name__}: {str(e).splitlines()[0]}")
    shutil.rmtree(d, ignore_errors=True)


def app_check(problems: list[str]) -> None:
    """The OpenAI server's FastAPI app (routes, metrics), built without an engine."""
    try:
        from vllm.entrypoints.openai.api_server import build_app
        from vllm.entrypoints.openai.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "/nonexistent"])
        app = build_app(args, ("generate",))
        paths = {getattr(r, "path", "") for r in app.routes}
        need = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"}
        print(f"  server app: {len(paths)} routes; {', '.join(sorted(need & paths))}")
        if need - paths:
            problems.append(f"server app lacks {sorted(need - paths)}")
    except Exception as e:  # noqa: BLE001
        problems.append(f"server app: {type(e).__name__}: {str(e).splitlines()[0]}")


def smoke_case(name: str) -> int:
    """GPU only, one engine per process: dummy Llama-3.2-1B, eager, token-id prompts, no tokenizer."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    d = tempfile.mkdtemp(prefix="peer-llama1b-")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(LLAMA_1B, f)
    t0 = time.time()
    llm = LLM(model=d, skip_tokenizer_init=True, dtype="bfloat16", load_format="dummy", max_model_len=1024,
              enforce_eager=True, gpu_memory_utilization=0.3, speculative_config=CASES[name])
    t1 = time.time()
    prompt = TokensPrompt(prompt_token_ids=[(7 * i) % 1000 + 100 for i in range(16)] * 4)
    greedy = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True, detokenize=False)
    sampled = SamplingParams(max_tokens=64, temperature=0.8, top_p=0.9, top_k=50, ignore_eos=True, detokenize=False)
    outs = llm.generate([prompt, prompt], [greedy, sampled], use_tqdm=False)
    t2 = time.time()
    toks = [len(o.outputs[0].token_ids) for o in outs]
    print(f"SMOKE {name}: engine up in {t1 - t0:.0f} s, generated {toks} tokens (greedy, top-p/top-k)"
          f" in {t2 - t1:.1f} s; greedy head {list(outs[0].outputs[0].token_ids[:8])}", flush=True)
    return 0 if toks == [64, 64] else 1


def smoke(problems: list[str]) -> None:
    print("\n[smoke: one engine per method, dummy Llama-3.2-1B, enforce_eager]")
    for name in CASES:
        try:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--smoke-case", name],
                               capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            problems.append(f"smoke {name}: timed out")
            continue
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("SMOKE ")]
        print("  " + (lines[-1][6:] if lines else f"{name}: no result"))
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-12:]
            print("    " + "\n    ".join(tail))
            problems.append(f"smoke {name}: exit {r.returncode}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lazy", action="store_true", help="also list absent packages imported inside functions")
    ap.add_argument("--smoke", action="store_true",
                    help="GPU only: also start an engine per method (plain, ngram, ngram_gpu) and generate 64 tokens")
    ap.add_argument("--smoke-case", help=argparse.SUPPRESS)
    args = ap.parse_args()

    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.smoke_case:
        return smoke_case(args.smoke_case)
    import torch

    gpu = torch.cuda.is_available()
    if not gpu:
        # vLLM turns Triton off when it sees no driver, unless CUDA_VISIBLE_DEVICES is empty
        # (its distributed-init case); keep it on so the Triton-kernel modules import as on a GPU.
        set_cvd = "CUDA_VISIBLE_DEVICES" not in os.environ
        if set_cvd:
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
    peer = [p.rstrip("/") for p in os.environ.get("TANDEM_PEER_PYTHONPATH", "").split(":") if p]
    print(f"python {sys.version.split()[0]}  torch {torch.__version__}  cuda available: {gpu}")
    print(f"TANDEM_PEER_PYTHONPATH={':'.join(peer) or '(unset)'}")
    problems: list[str] = []
    stubbed: list[str] = []

    spec = importlib.util.find_spec("vllm")
    if spec is None:
        print("FAIL: vllm is not importable (is the peer directory on PYTHONPATH?)")
        return 1
    print(f"vllm from {spec.origin}")
    if peer and not any((spec.origin or "").startswith(p + "/") for p in peer):
        problems.append(f"vllm comes from {spec.origin}, not from {':'.join(peer)}")
    if gpu and not torch.__version__.startswith("2.11."):
        problems.append(f"vLLM 0.26.0 is built for torch 2.11; this is {torch.__version__}")

    results: dict[str, tuple[str, str]] = {}
    for mods in GROUPS.values():
        for m in mods:
            results[m] = try_import(m)
    if not gpu:
        # Load what is left behind stand-ins for the CUDA extensions, to check the Python side.
        for m, (s, _) in list(results.items()):
            if s != "ok":
                forget(m)
        stubbed = stub_cuda_exts()
        for m, (s, d) in list(results.items()):
            if s == "cuda":
                s2, d2 = try_import(m)
                results[m] = ("cuda-stubbed", d) if s2 == "ok" else (s2, d2)

    for group, mods in GROUPS.items():
        print(f"\n[{group}]")
        for m in mods:
            s, d = results[m]
            mark = {"ok": "ok", "cuda-stubbed": "ok*"}.get(s, s.upper())
            print(f"  {mark:8} {m}{'  -- ' + d if d else ''}")
            if s != "ok" and not (s == "cuda-stubbed" and not gpu):
                problems.append(f"{m}: {s}: {d}")

    for mod, attr in ATTRS:
        try:
            getattr(importlib.import_module(mod), attr)
        except Exception as e:  # noqa: BLE001
            problems.append(f"{mod}.{attr}: {type(e).__name__}: {e}")

    print("\n[checks]")
    try:
        from typing import get_args

        from vllm.config.speculative import SpeculativeMethod

        def flat(t):
            for a in get_args(t):
                yield from (flat(a) if get_args(a) else [a])

        methods = sorted(set(flat(SpeculativeMethod)))
        ng = [x for x in methods if "ngram" in x]
        print(f"  speculative methods: {', '.join(methods)}")
        print(f"  n-gram methods: {ng} (keys: num_speculative_tokens, prompt_lookup_max, prompt_lookup_min)")
        if "ngram" not in ng:
            problems.append("no 'ngram' speculative method")
    except Exception as e:  # noqa: BLE001
        problems.append(f"speculative methods: {type(e).__name__}: {e}")
    try:
        import numba
        import numpy as np

        print(f"  numba {numba.__version__} with numpy {np.__version__} ({where(np)})")
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as f

        out = [int(x) for x in f(np.array([1, 2, 3, 4, 1, 2, 3], dtype=np.int32), 2, 3, 64, 2)]
        print(f"  numba n-gram proposer on [1 2 3 4 1 2 3] proposes {out}")
        if out != [4, 1]:
            problems.append(f"n-gram proposer proposed {out}, expected [4, 1]")
    except Exception as e:  # noqa: BLE001
        problems.append(f"numba / n-gram proposer: {type(e).__name__}: {e}")
    try:
        from vllm.triton_utils import HAS_TRITON

        print(f"  vLLM sees Triton: {HAS_TRITON}")
        if gpu and not HAS_TRITON:
            problems.append("vLLM disabled Triton")
    except Exception as e:  # noqa: BLE001
        problems.append(f"triton_utils: {type(e).__name__}: {e}")
    if "flashinfer" in sys.modules:
        fi = sys.modules["flashinfer"]
        v = str(getattr(fi, "__version__", "?"))
        print(f"  flashinfer {v} from {where(fi)}")
        if not v.startswith("0.6.14"):
            problems.append(f"flashinfer {v} imported; vLLM 0.26.0 pins 0.6.14 (is the peer dir first on PYTHONPATH?)")
    print(f"  nvcc: {shutil.which('nvcc') or 'not on PATH'}; ninja: {shutil.which('ninja') or 'not on PATH'}"
          " (FlashInfer JIT-compiles its top-k/top-p sampling kernels with them)")
    if gpu:
        try:
            import vllm._C_stable_libtorch  # noqa: F401
            from vllm.platforms import current_platform
            from vllm.utils.flashinfer import has_flashinfer
            from vllm.vllm_flash_attn.flash_attn_interface import FA3_UNAVAILABLE_REASON, is_fa_version_supported

            cap = current_platform.get_device_capability()
            name = current_platform.get_device_name()
            print(f"  platform {type(current_platform).__name__} {name}, capability {cap}")
            if not current_platform.is_cuda():
                problems.append("vLLM did not detect the CUDA platform")
            print(f"  FA3 supported: {is_fa_version_supported(3)} {FA3_UNAVAILABLE_REASON or ''}")
            if cap is not None and cap.major == 9 and not is_fa_version_supported(3):
                problems.append(f"FlashAttention 3 unavailable: {FA3_UNAVAILABLE_REASON}")
            print(f"  has_flashinfer(): {has_flashinfer()}")
            print(f"  custom ops: {len([o for o in dir(torch.ops._C) if not o.startswith('_')])} in torch.ops._C")
        except Exception as e:  # noqa: BLE001
            problems.append(f"cuda checks: {type(e).__name__}: {e}")
    else:
        if set_cvd:
            del os.environ["CUDA_VISIBLE_DEVICES"]  # Triton's check is done; the config wants a device
        try:
            pretend_h100()
            print("  (no CUDA: the configuration below is built for a pretend H100)")
        except Exception as e:  # noqa: BLE001
            problems.append(f"pretend H100: {type(e).__name__}: {e}")
    config_check(problems)
    app_check(problems)
    if args.smoke:
        if gpu and not problems:
            smoke(problems)
        else:
            print("\n(--smoke skipped: " + ("no GPU" if not gpu else "fix the problems above first") + ")")

    print("\n[third-party packages imported]")
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    for t in sorted({top(n) for n in sys.modules} - stdlib - {"vllm", "__main__"}):
        m = sys.modules.get(t)
        if m is None or t.startswith("_") or not isinstance(m, types.ModuleType) or m.__dict__.get("__name__") != t:
            continue  # (also vLLM's LazyLoader aliases such as 'xgr')
        loc = where(m)
        if loc == "?" or f"{os.sep}vllm{os.sep}" in loc:
            continue  # vLLM's own aliases (LazyLoader names)
        src = "peer" if any(loc.startswith(p + "/") for p in peer) else "env"
        print(f"  {t:28} {dist_version(t):26} {src:4}  {loc}")

    if args.lazy:
        print("\n[absent packages imported inside functions of the loaded vllm modules]")
        for pkg, mods in sorted(lazy_imports(set(sys.modules)).items()):
            ms = sorted(mods)
            print(f"  {pkg:28} {', '.join(ms[:3])}{' ...' if len(ms) > 3 else ''}")

    print()
    if stubbed:
        print(f"no CUDA here: stand-ins for {', '.join(stubbed)}; modules marked ok* import behind them")
    if problems:
        print(f"FAIL: {len(problems)} problem(s):")
        for p in problems:
            print(f"  - {p}")
        return 1
    print(f"PASS: {len(results)} modules import{' (CUDA extensions stood in)' if stubbed else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
