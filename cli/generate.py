"""``tandem generate``: one prompt through the in-process speculative engine."""

from __future__ import annotations

import argparse
import json
import sys
import time

from cli.options import add_engine_args, add_sampling_args, engine_settings, sampling_params


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate", help="generate text for one prompt with speculative decoding",
        description="Generate text for one prompt in this process. Without --chat the prompt is "
                    "tokenized as raw text; with --chat it is one user message rendered through the "
                    "model's chat template. The text streams to stdout; --json adds one JSON object "
                    "(text, token_ids, rounds, acceptance_length, tokens_per_s, ...) as the last line.")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--chat", action="store_true", help="render the prompt as a user message (chat template)")
    p.add_argument("--system", help="system message (with --chat)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    add_engine_args(p)
    add_sampling_args(p)
    p.set_defaults(run=run)


def encode_prompt(tokenizer, prompt: str, chat: bool, system: str | None = None) -> list[int]:
    if not chat:
        if system:
            raise ValueError("system: only meaningful with --chat")
        return tokenizer.encode(prompt)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return tokenizer.encode_chat(messages)


def run(args: argparse.Namespace) -> int:
    from engine.factory import build_engine

    settings = engine_settings(args)
    params = sampling_params(args)
    config = settings.engine_config()
    engine = build_engine(settings.model, settings.draft, config)
    dec = engine.decoder
    prompt_ids = encode_prompt(engine.target.tokenizer, args.prompt, args.chat, args.system)
    start = time.perf_counter()
    dec.add_request(prompt_ids, params, request_id="cli")
    token_ids: list[int] = []
    text = ""
    first_token_s = None
    final = None
    while dec.has_unfinished():
        for out in dec.step():
            if out.new_token_ids and first_token_s is None:
                first_token_s = time.perf_counter() - start
            token_ids += out.new_token_ids
            text += out.text_delta
            sys.stdout.write(out.text_delta)
            sys.stdout.flush()
            final = out
    elapsed = time.perf_counter() - start
    sys.stdout.write("\n")
    summary = {
        "text": text,
        "token_ids": token_ids,
        "finish_reason": final.finish_reason.value if final and final.finish_reason else None,
        "prompt_tokens": len(prompt_ids),
        "output_tokens": len(token_ids),
        "rounds": final.rounds if final else 0,
        "accepted": final.accepted if final else 0,
        "drafted": final.drafted if final else 0,
        "acceptance_length": round(final.acceptance_length, 4) if final else 0.0,
        "tokens_per_s": round(len(token_ids) / elapsed, 2) if elapsed > 0 else 0.0,
        "time_to_first_token_s": round(first_token_s or 0.0, 4),
        "elapsed_s": round(elapsed, 4),
        "draft": str(engine.draft),
        "k": config.k,
        "device": config.device,
        "dtype": config.dtype,
    }
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
    else:
        print(f"[{summary['output_tokens']} tokens, {summary['rounds']} rounds, acceptance length "
              f"{summary['acceptance_length']:.2f}, {summary['tokens_per_s']:.1f} tok/s, draft {summary['draft']}]",
              file=sys.stderr)
    return 0
