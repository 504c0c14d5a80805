"""The engine on CUDA: flashinfer attention, and greedy equivalence in float32 and bfloat16.

Run on the GPU machine: ``python -m pytest -q tests/gpu`` (``TANDEM_REPORT`` names a JSON file
for the bf16 equivalence report). In float32 with the torch attention, speculative output
must equal plain greedy decoding exactly, as on the CPU. In bfloat16 with flashinfer, the
verify forward (k+1 tokens) and the decode forward (1 token) round differently, so a
sequence may leave the plain path where two tokens are nearly tied; the test reports the
fraction of identical sequences and asserts that every divergence is such a near-tie,
measured on the float32 model.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from engine.attention.base import AttentionMetadata
from engine.config import EngineConfig, SamplingParams
from engine.kv_cache import PagedKVCache
from engine.models.loader import load_model
from engine.runner import Chunk, ModelRunner
from tests.conftest import make_decoder

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

NEW_TOKENS = 64
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
CONFIGS = [("ngram", 1), ("ngram", 4), ("layerskip:4", 1), ("layerskip:4", 4)]
NEAR_TIE = 0.5  # float32 logit gap under which bf16 rounding can flip the argmax
TEXTS = [
    "Hi!", "List the first ten prime numbers, separated by commas.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Repeat after me exactly: the quick brown fox jumps over the lazy dog. The quick brown fox",
    "Translate to French: 'Good morning, how are you today?'",
    "Explain the difference between a process and a thread to a new programmer. Use an analogy "
    "from a restaurant kitchen, and finish with a short list of when to prefer each.",
    "Summarize the plot of Romeo and Juliet in five bullet points.",
    "What are the health benefits of drinking green tea? Please be specific and mention caveats.",
]


@pytest.fixture(scope="module")
def models(smollm_path):
    return {dt: load_model(smollm_path, device="cuda", dtype=getattr(torch, dt), progress=False)
            for dt in ("float32", "bfloat16")}


@pytest.fixture(scope="module")
def prompts(models):
    tok = models["float32"].tokenizer
    return [tok.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]


def test_flashinfer_matches_torch_reference():
    """Prefill (ragged), decode (1 token) and verify (k+1 tokens) on the same paged cache."""
    from engine.attention.flashinfer_backend import FlashInferAttention
    from engine.attention.torch_ref import TorchAttention

    torch.manual_seed(0)
    hq, hkv, d, bs = 9, 3, 64, 16
    cache = PagedKVCache(1, hkv, d, num_tokens=4096, block_size=bs, dtype=torch.bfloat16, device="cuda")
    ref, fi = TorchAttention(cache, hq), FlashInferAttention(cache, hq, torch.device("cuda"))
    lens = {"a": 70, "b": 5, "c": 33}
    data = {s: [torch.randn(n, h, d, device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv)]
            for s, n in lens.items()}
    pos = {s: 0 for s in lens}
    for step in ({"a": 40, "b": 3, "c": 17}, {"a": 1, "b": 1, "c": 1}, {"a": 5, "c": 5}, {"a": 24, "b": 1, "c": 10}):
        alloc = cache.allocator
        slots, q, k, v = [], [], [], []
        for s, n in step.items():
            alloc.extend(s, pos[s] + n)
            slots += alloc.slots(s, pos[s], pos[s] + n)
            for dst, src in zip((q, k, v), data[s]):
                dst.append(src[pos[s]:pos[s] + n])
        meta = AttentionMetadata(q_lens=tuple(step.values()), kv_lens=tuple(pos[s] + n for s, n in step.items()),
                                 block_tables=tuple(tuple(alloc.block_table(s)) for s in step),
                                 slot_mapping=torch.tensor(slots, device="cuda"))
        outs = []
        for backend in (ref, fi):
            backend.plan(meta)
            outs.append(backend.forward(0, torch.cat(q), torch.cat(k), torch.cat(v)).float())
        torch.testing.assert_close(outs[1], outs[0], atol=2e-2, rtol=2e-2)
        for s, n in step.items():
            pos[s] += n


def _generate(models, dtype, draft, k, prompts, **overrides):
    dec = make_decoder(models[dtype], draft, k=k, kv_cache_tokens=16384, device="cuda", dtype=dtype, **overrides)
    return [o.new_token_ids for o in dec.generate(prompts, GREEDY)]


@pytest.mark.parametrize("draft, k", CONFIGS)
def test_float32_torch_attention_is_exact(models, prompts, draft, k):
    plain = _generate(models, "float32", "none", 0, prompts, attention="torch")
    spec = _generate(models, "float32", draft, k, prompts, attention="torch")
    assert spec == plain


def _gap_fp32(model32, prompt, prefix, a, b):
    runner = ModelRunner(model32.model, EngineConfig(device="cuda", attention="torch", kv_cache_tokens=4096))
    logits = runner.forward([Chunk("g", prompt + prefix)])[0]
    return abs(logits[a].item() - logits[b].item())


def test_bfloat16_flashinfer_equivalence_report(models, prompts):
    plain = _generate(models, "bfloat16", "none", 0, prompts)
    report = {"new_tokens": NEW_TOKENS, "prompts": len(prompts), "configs": []}
    worst = 0.0
    for draft, k in CONFIGS:
        spec = _generate(models, "bfloat16", draft, k, prompts)
        divergences = []
        for i, (p, s) in enumerate(zip(plain, spec)):
            j = next((j for j, (x, y) in enumerate(zip(p, s)) if x != y), None)
            if j is None:
                continue
            gap = _gap_fp32(models["float32"], prompts[i], p[:j], p[j], s[j])
            worst = max(worst, gap)
            divergences.append({"prompt": i, "first_divergence": j, "plain": p[j], "spec": s[j],
                                "fp32_logit_gap": round(gap, 4)})
        identical = len(prompts) - len(divergences)
        report["configs"].append({"draft": draft, "k": k, "identical": identical,
                                  "fraction_identical": identical / len(prompts), "divergences": divergences})
    print(json.dumps(report, indent=1))
    if os.environ.get("TANDEM_REPORT"):
        with open(os.environ["TANDEM_REPORT"], "w") as f:
            json.dump(report, f, indent=1)
    assert math.isfinite(worst) and worst < NEAR_TIE, f"a divergence is not a near-tie: {worst}"
