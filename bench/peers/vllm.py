"""vLLM as a ``tandem bench`` baseline: the same weights, prompts and cases, in its own process.

``vllm`` is plain decoding; ``vllm-ngram`` and ``vllm-ngram-gpu`` are vLLM's n-gram speculation
(prompt lookup on the host, and on the GPU), vLLM's best speculative method for a model with
no trained draft head. Each engine is one subprocess (``bench.peers.vllm_runner``) over every
case, so vLLM builds and compiles once per engine. vLLM runs from ``$TANDEM_PEER_PYTHONPATH``
(the staged peer, ``bench/device/PEERS.md``) or, where that is unset, from this environment.

The weights: a GGUF is exported once as a Hugging Face directory (``engine.models.export``);
a ``synthetic:`` target is a config-only directory and vLLM's ``load_format="dummy"`` (random
weights on its side too: speed is meaningful, acceptance is not).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path

VLLM_ENGINES = {"vllm": "none", "vllm-ngram": "ngram", "vllm-ngram-gpu": "ngram_gpu"}
ROOT = Path(__file__).resolve().parents[2]


def peer_env() -> dict[str, str]:
    """The environment of a vLLM subprocess: the staged peer first, then this project (for bench.timing)."""
    peer = os.environ.get("TANDEM_PEER_PYTHONPATH")
    if not peer and importlib.util.find_spec("vllm") is None:
        raise ValueError("baselines: vLLM is not installed here and TANDEM_PEER_PYTHONPATH is unset "
                         "(stage it with bench/device/stage_peers.sh; see bench/device/PEERS.md)")
    path = [p for p in (peer, str(ROOT), os.environ.get("PYTHONPATH")) if p]
    # no usage reports or hub lookups (the GPU machine reaches no network); the sampler's top-k/top-p in torch: the
    # bench asks for neither (FlashInfer's sampling kernels serve only those), and its JIT build costs minutes on
    # every fresh machine
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "VLLM_USE_FLASHINFER_SAMPLER": os.environ.get("VLLM_USE_FLASHINFER_SAMPLER", "0")}


def model_dir(model: str, work: Path) -> tuple[Path, str]:
    """(a Hugging Face directory vLLM loads, its load_format) for a Tandem --model value."""
    from engine.models import synthetic

    if synthetic.is_synthetic(model):
        return synthetic.hf_directory(model, work / "synthetic"), "dummy"
    path = Path(model)
    if path.is_dir():
        return path, "auto"
    from engine.models.export import export_hf

    out = work / "hf"
    if not (out / "config.json").is_file():
        export_hf(path, out, dtype="bfloat16")
    return out, "auto"


def run_vllm(engine: str, model: str, prompts: dict[str, list[list[int]]], cases: list[dict], *, max_tokens: int,
             k: int, seed: int, prompt_lookup: tuple[int, int] = (1, 4), gpu_memory_utilization: float = 0.5,
             work: Path | None = None) -> list[dict]:
    """Rows of one vLLM engine over ``cases`` ({dataset, batch_size, temperature}); one error row if it fails."""
    # one directory per model, kept: the next engine of the run reuses the export
    work = work or Path(tempfile.gettempdir()) / "tandem-vllm" / re.sub(r"[^A-Za-z0-9_.-]+", "_", model)[-120:]
    work.mkdir(parents=True, exist_ok=True)
    directory, load_format = model_dir(model, work)
    longest = max(len(p) for ps in prompts.values() for p in ps)
    spec = {"engine": engine, "method": VLLM_ENGINES[engine], "model_dir": str(directory), "load_format": load_format,
            "k": k, "prompt_lookup_min": prompt_lookup[0], "prompt_lookup_max": prompt_lookup[1], "seed": seed,
            "max_tokens": max_tokens, "max_num_seqs": max(c["batch_size"] for c in cases),
            "max_model_len": longest + max_tokens + k + 8, "gpu_memory_utilization": gpu_memory_utilization,
            "prompts": prompts, "cases": cases}
    spec_file, out_file = work / f"{engine}.spec.json", work / f"{engine}.rows.json"
    spec_file.write_text(json.dumps(spec))
    out_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.peers.vllm_runner", "--spec", str(spec_file), "--out", str(out_file)]
    code, tail = _run_teed(cmd, env=peer_env())
    if code != 0 or not out_file.is_file():
        print(f"bench: {engine} failed (exit {code}); its last lines are above", file=sys.stderr, flush=True)
        return [{"engine": engine, "error": tail[-1] if tail else f"exit {code}"}]
    return json.loads(out_file.read_text())


def _run_teed(cmd: list[str], env: dict[str, str], keep: int = 20) -> tuple[int, list[str]]:
    """Run ``cmd``; its output goes on to ours as it comes, its last ``keep`` lines of stderr are returned."""
    tail: deque[str] = deque(maxlen=keep)
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True, errors="replace") as proc:
        for line in proc.stderr:
            sys.stderr.write(line)
            if line.strip():
                tail.append(line.rstrip())
    return proc.returncode, list(tail)
