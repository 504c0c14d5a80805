"""The transformers baselines of ``tandem bench``, on the same weights as the target.

Engines: ``hf-eager`` (``generate`` with the dynamic cache), ``hf-static-compile`` (the static
cache, which transformers compiles on CUDA), ``hf-prompt-lookup`` (prompt-lookup decoding,
transformers' own n-gram speculation; batch size 1 only). EOS is ignored (``min_new_tokens``)
so every engine produces the same number of tokens. Time to first token and inter-token
latency come from a streamer at batch size 1 (transformers streams only single sequences).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Sequence

import torch

from bench.timing import TokenClock, now_synced, peak_memory_mib, reset_peak_memory
from engine.assets import cache_dir

HF_ENGINES = ("hf-eager", "hf-static-compile", "hf-prompt-lookup")


def load_hf(path: Path, device: str, dtype: torch.dtype):
    """transformers' LlamaForCausalLM on a GGUF file (its own dequantization, through ``hf_directory``) or a
    Hugging Face directory."""
    from transformers import AutoModelForCausalLM

    directory = hf_directory(path) if path.is_file() else path
    return AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype).to(device).eval()


def hf_directory(gguf: Path) -> Path:
    """transformers' own float32 dequantization of ``gguf``, saved once per machine as a Hugging Face directory
    in the tandem cache (per GGUF file and transformers version): transformers reads a GGUF's metadata in Python,
    20-50 s on a CPU, and loads the saved safetensors in well under a second. A lower dtype loaded from it rounds
    the same float32 values transformers would have rounded."""
    import transformers
    from transformers import AutoModelForCausalLM

    saved = cache_dir() / "hf-reference" / f"{gguf.stem}-{gguf.stat().st_size}-transformers-{transformers.__version__}"
    if not (saved / "model.safetensors").is_file():
        print(f"tandem: converting {gguf.name} for transformers once (kept in {saved.parent})", file=sys.stderr)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        model.hf_quantizer = None  # its weights are plain float32 tensors now: saved as such
        model.config.quantization_config = None
        tmp = saved.with_name(f"{saved.name}.{os.getpid()}.tmp")
        model.save_pretrained(tmp)
        try:
            tmp.rename(saved)  # atomic: a process converting at the same time keeps its own copy
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return saved


class _Clock:
    """A transformers streamer that timestamps each new token of the one sequence it streams."""

    def __init__(self, clock: TokenClock, request_id: str) -> None:
        self.clock, self.request_id, self.prompt_seen = clock, request_id, False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # the first call carries the prompt
            self.prompt_seen = True
            return
        self.clock.tokens(self.request_id, value.numel(), now_synced())

    def end(self) -> None:
        pass


def _kwargs(engine: str, temperature: float, max_tokens: int) -> dict:
    kw = dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=temperature > 0)
    if temperature > 0:
        kw.update(temperature=temperature, top_k=0, top_p=1.0)
    if engine == "hf-static-compile":
        kw["cache_implementation"] = "static"
    elif engine == "hf-prompt-lookup":
        kw["prompt_lookup_num_tokens"] = 10
    return kw


@torch.inference_mode()
def run_hf_case(hf, engine: str, prompts: Sequence[Sequence[int]], batch_size: int, temperature: float,
                max_tokens: int, seed: int, pad_id: int) -> dict | None:
    """One transformers configuration over the prompts; None where it does not apply (prompt lookup, bs > 1)."""
    if engine == "hf-prompt-lookup" and batch_size > 1:
        return None
    device = next(hf.parameters()).device
    kw = _kwargs(engine, temperature, max_tokens)
    clock = TokenClock()

    def batch(idx: list[int], stream: bool):
        width = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(idx):  # left padding
            ids[row, width - len(prompts[i]):] = torch.tensor(list(prompts[i]))
            mask[row, width - len(prompts[i]):] = 1
        torch.manual_seed(seed + idx[0])
        streamer = _Clock(clock, f"hf-{idx[0]}") if stream else None
        if stream:
            clock.arrive(f"hf-{idx[0]}", now_synced())
        out = hf.generate(input_ids=ids.to(device), attention_mask=mask.to(device), pad_token_id=pad_id,
                          streamer=streamer, **kw)
        return (out.shape[1] - width) * len(idx)

    batch([0], False)  # warm-up (and, for the static cache, its compilation)
    reset_peak_memory()
    tokens = 0
    start = now_synced()
    for i in range(0, len(prompts), batch_size):
        tokens += batch(list(range(i, min(i + batch_size, len(prompts)))), stream=batch_size == 1)
    elapsed = now_synced() - start
    return {"engine": engine, "draft": None, "k": None, "batch_size": batch_size, "temperature": temperature,
            "num_prompts": len(prompts), "max_tokens": max_tokens, "output_tokens": tokens,
            "elapsed_s": round(elapsed, 3), "tokens_per_s": round(tokens / elapsed, 2), "acceptance_length": None,
            **clock.summary(), "peak_memory_mib": peak_memory_mib()}


