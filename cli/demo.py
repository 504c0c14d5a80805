"""``tandem demo``: start the stack, stream a few answers with their acceptance stats, stop it.

What a person reads: which model and drafter run where, then each answer as it is generated, token by token,
followed by its numbers. The services' own logs (model loading, INFO lines) go to files, named at the start,
unless ``--verbose``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from cli.serve import add_stack_args, stack_config
from rpc.stack import Stack

PROMPTS = [
    "Explain speculative decoding in three sentences.",
    "Write a Python function that checks whether a number is prime, then test it on 1, 2 and 9.",
    "List five tips for writing clear documentation.",
]


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="start the stack and stream a few answers through the gateway",
                       description="Start gateway, verifier and drafter (as `tandem serve`, on a free block of "
                                   "ports unless --port), stream a few chat answers through the gateway one after "
                                   "another, each followed by its stats (tokens, rounds, acceptance length, "
                                   "tokens/s), and shut everything down. The services' logs go to files (their "
                                   "directory is printed first) unless --verbose.")
    add_stack_args(p, default_port=None)
    p.add_argument("--max-tokens", type=int, default=96, help="new tokens per answer (default 96)")
    p.add_argument("--log-dir", type=Path,
                   help="where the services' logs go, one NAME.log each (default: a new tandem-demo-* directory in "
                        "the system's temporary directory)")
    p.add_argument("--verbose", action="store_true", help="the services' logs on this terminal instead of in files")
    p.set_defaults(run=run)


def _request(prompt: str, max_tokens: int):
    from protos.tandem.v1 import gateway_pb2

    req = gateway_pb2.GenerateRequest()
    req.messages.messages.append(gateway_pb2.ChatMessage(role="user", content=prompt))
    req.sampling.max_tokens = max_tokens
    return req


def _describe(args: argparse.Namespace, mode: str) -> list[str]:
    """What runs, in words: the target, the drafter, the device."""
    from engine.drafters.describe import describe_draft, model_name
    from engine.factory import default_device
    from engine.models.loader import load_model, model_source

    target = load_model(model_source(args.model), load_weights=False, progress=False)
    drafter = describe_draft(args.draft, target)
    where = args.device or default_device()
    return [f"  target   {model_name(target.source)} ({target.total_layers} layers), on {where}",
            f"  drafter  {drafter}" + (", inside the verifier" if mode == "co-located" else "")]


def _stats(s: dict) -> str:
    return (f"[{s['output_tokens']} tokens in {s['rounds']} rounds: acceptance length {s['acceptance_length']:.2f} "
            f"tokens a round, {s['accepted']}/{s['drafted']} drafts accepted; first token after "
            f"{s['time_to_first_token_s']:.2f} s, {s['tokens_per_s']:.1f} tokens/s]")


def _tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])


def run(args: argparse.Namespace) -> int:
    import grpc

    from rpc.gateway_client import stream

    mode = "co-located" if args.colocated else "split"
    cfg = stack_config(args)
    log_dir = None if args.verbose else (args.log_dir or Path(tempfile.mkdtemp(prefix="tandem-demo-")))
    stack = Stack(cfg, log_dir=log_dir)
    names = stack.names()
    print(f"tandem demo: the {mode} stack on this machine, one process per service", flush=True)
    for line in _describe(args, mode):
        print(line, flush=True)
    print("  services " + ", ".join(f"{n} :{cfg.ports[n]}" for n in sorted(names, key=cfg.ports.get)), flush=True)
    if log_dir is not None:
        print(f"  logs     {log_dir}/{{{','.join(names)}}}.log", flush=True)
    t0 = time.monotonic()
    stack.start()
    try:
        print("starting: each service loads the model and warms up ... ", end="", flush=True)
        stack.wait_ready()
        print(f"ready in {time.monotonic() - t0:.0f} s\n", flush=True)
        for prompt in PROMPTS:
            print(f"> {prompt}", flush=True)
            s = asyncio.run(stream(stack.gateway, _request(prompt, args.max_tokens), timeout=600,
                                   out=sys.stdout))
            print(f"\n{_stats(s)}\n", flush=True)
    except grpc.RpcError as exc:
        print(f"\ntandem demo: the gateway answered {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    except (RuntimeError, TimeoutError) as exc:
        print(f"\ntandem demo: {exc}", file=sys.stderr)
        failed = next((n for n, p in stack.procs.items() if p.poll() is not None), None)
        tail = _tail(stack.log_path(failed)) if failed else ""
        if tail:
            print(f"--- the end of {stack.log_path(failed)}:\n{tail}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    print("Acceptance length: the tokens one round commits, the drafts the target accepted plus one of its own.\n"
          "On a CPU speculative decoding buys about nothing (0.99-1.09x plain decoding on a 2-core machine); on a "
          "GPU the EAGLE head makes one request 1.5-1.65x as fast (README.md: \"What speculative decoding buys\"; "
          "docs/design.md: the words).")
    return 0
