"""Throughput of plain vs speculative decoding over a prompt set, in one process.

One target is loaded once; each drafter gets its own decoder (and KV cache) over the same
weights. Every configuration is warmed up (CUDA context, flashinfer JIT) before timing.
Rows follow the bench contract: engine, batch_size, dataset, temperature, tokens_per_s,
acceptance_length, speedup_vs_plain, plus what is needed to reproduce the number.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from engine.config import EngineConfig, SamplingParams
from engine.drafters import DraftSpec, build_drafter
from engine.models.loader import LoadedModel
from engine.runner import ModelRunner
from engine.spec import SpecDecoder


@dataclass(frozen=True)
class BenchCase:
    draft: str
    batch_size: int
    temperature: float


def dataset_prompts(name: str, tokenizer, num: int) -> list[list[int]]:
    from bench.datasets import humaneval, sharegpt

    if name == "humaneval":  # code completion: the raw prompt, no chat template
        return [tokenizer.encode(p.prompt) for p in humaneval()[:num]]
    if name == "sharegpt":  # training split only; >= 16000 is reserved for evaluation
        out = []
        for conv in sharegpt(split="train"):
            text = conv.first_user_text
            if text and len(text) < 2000:
                out.append(tokenizer.encode_chat([{"role": "user", "content": text}]))
            if len(out) == num:
                break
        return out
    raise ValueError(f"dataset: unknown {name!r} (sharegpt, humaneval)")


def engine_name(draft: str) -> str:
    return "tandem-plain" if draft == "none" else f"tandem-spec-{draft}"


def environment() -> dict:
    commit = os.environ.get("TANDEM_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    check=True).stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                   text=True).stdout.strip()
            commit += "-dirty" if dirty else ""
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"commit": commit, "gpu": gpu, "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__, "command": " ".join(["tandem", *sys.argv[1:]])}


def run_case(model: LoadedModel, config: EngineConfig, case: BenchCase, prompts: Sequence[Sequence[int]],
             max_tokens: int, seed: int) -> dict:
    cfg = dataclasses.replace(config, k=0 if case.draft == "none" else config.k)
    decoder = SpecDecoder(ModelRunner(model.model, cfg), model.tokenizer, cfg,
                          build_drafter(DraftSpec.parse(case.draft), model, cfg))
    params = [SamplingParams(temperature=case.temperature, max_tokens=max_tokens, ignore_eos=True, seed=seed + i)
              for i in range(len(prompts))]
    decoder.generate([list(prompts[0])], dataclasses.replace(params[0], max_tokens=8))  # warm-up
    tokens = rounds = committed = 0
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(0, len(prompts), case.batch_size):
        for o in decoder.generate(prompts[i:i + case.batch_size], params[i:i + case.batch_size]):
            tokens += len(o.new_token_ids)
            rounds += o.rounds
            committed += o.accepted + o.rounds
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return {"engine": engine_name(case.draft), "draft": case.draft, "k": cfg.k, "batch_size": case.batch_size,
            "temperature": case.temperature, "num_prompts": len(prompts), "max_tokens": max_tokens,
            "output_tokens": tokens, "elapsed_s": round(elapsed, 3),
            "tokens_per_s": round(tokens / elapsed, 2), "acceptance_length": round(committed / rounds, 3)}


def add_speedups(rows: list[dict]) -> list[dict]:
    plain = {(r["batch_size"], r["temperature"], r["dataset"]): r["tokens_per_s"]
             for r in rows if r["engine"] == "tandem-plain"}
    for r in rows:
        base = plain.get((r["batch_size"], r["temperature"], r["dataset"]))
        r["speedup_vs_plain"] = round(r["tokens_per_s"] / base, 3) if base else None
    return rows


def markdown(rows: list[dict]) -> str:
    cols = ["engine", "dataset", "batch_size", "temperature", "k", "tokens_per_s", "acceptance_length",
            "speedup_vs_plain"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
