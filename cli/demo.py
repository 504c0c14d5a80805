"""``tandem demo``: start the stack, stream a few answers with their acceptance stats, stop it."""

from __future__ import annotations

import argparse
import asyncio
import sys

from cli.serve import add_stack_args, stack_config
from rpc.stack import Stack

PROMPTS = [
    "Explain speculative decoding in three sentences.",
    "Write a Python function that checks whether a number is prime, then test it on 1, 2 and 9.",
    "List five tips for writing clear documentation.",
]


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="start the stack and stream a few answers through the gateway",
                       description="Start gateway, verifier and drafter (as `tandem serve`), send a few chat "
                                   "prompts concurrently through the gateway, print each answer with its "
                                   "acceptance stats, and shut everything down.")
    add_stack_args(p)
    p.add_argument("--max-tokens", type=int, default=96, help="new tokens per answer (default 96)")
    p.set_defaults(run=run)


async def _ask(address: str, prompt: str, max_tokens: int) -> dict:
    from rpc.gateway_client import stream
    from protos.tandem.v1 import gateway_pb2

    req = gateway_pb2.GenerateRequest()
    req.messages.messages.append(gateway_pb2.ChatMessage(role="user", content=prompt))
    req.sampling.max_tokens = max_tokens
    return await stream(address, req, timeout=600, out=None)


def run(args: argparse.Namespace) -> int:
    stack = Stack(stack_config(args))
    stack.start()
    try:
        stack.wait_ready()
        mode = "co-located" if args.colocated else "split"
        print(f"\n== tandem demo: {mode} mode, drafter {args.draft}, gateway at {stack.gateway_address}\n", flush=True)

        async def ask_all():
            return await asyncio.gather(*(_ask(stack.gateway_address, p, args.max_tokens) for p in PROMPTS))

        for prompt, s in zip(PROMPTS, asyncio.run(ask_all())):
            print(f"> {prompt}\n{s['text'].strip()}\n[{s['output_tokens']} tokens in {s['rounds']} rounds: "
                  f"acceptance length {s['acceptance_length']:.2f}, {s['accepted']}/{s['drafted']} drafts accepted, "
                  f"first token after {s['time_to_first_token_s']:.2f} s, {s['tokens_per_s']:.1f} tok/s]\n",
                  flush=True)
    except (RuntimeError, TimeoutError) as exc:
        print(f"tandem demo: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    return 0
