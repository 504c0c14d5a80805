"""``tandem serve``: the whole stack on this machine, as separate processes; Ctrl-C (or SIGTERM) stops it all, and
the services also stop if this process is killed (``rpc.lifetime``)."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from rpc.stack import Stack, StackConfig, free_block


def add_stack_args(p: argparse.ArgumentParser, default_port: int | None = 50051) -> None:
    """The stack's flags; ``default_port`` None: without --port, a free block of ports."""
    where = f"default {default_port}" if default_port else "default: the first of a free block of ports"
    p.add_argument("--port", type=int, default=default_port,
                   help=f"gateway port; the verifier takes PORT+1 and the drafter PORT+2 ({where}); a port in use "
                        "is an error")
    p.add_argument("--colocated", action="store_true",
                   help="no drafter service: the verifier drafts itself and runs whole rounds (Step)")
    p.add_argument("--draft", default="auto",
                   help="auto (the trained drafter shipped for the model, else ngram), ngram[:N], layerskip:N or a "
                        "drafter PATH (default auto)")
    p.add_argument("--model", help="target GGUF file, Hugging Face directory or synthetic:NAME (default SmolLM2)")
    p.add_argument("--device", help="cpu or cuda[:N] (default cuda when present)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="weights and KV dtype (default float32 on cpu, bfloat16 on cuda)")
    p.add_argument("--k", type=int, help="default draft tokens per round")
    p.add_argument("--max-k", type=int, help="largest k a request may ask for")
    p.add_argument("--kv-cache-tokens", type=int, help="KV capacity of the verifier and the drafter")
    p.add_argument("--metrics-port", type=int,
                   help="Prometheus port of the gateway (verifier +1, drafter +2); default off")
    p.add_argument("--verifiers", type=int, default=1,
                   help="verifier replicas, on consecutive ports after the gateway's (default 1); the gateway "
                        "pins each request to one and balances new ones by load")
    p.add_argument("--drafters", type=int, default=1, help="drafter replicas in split mode (default 1)")


def stack_config(args: argparse.Namespace) -> StackConfig:
    for name in ("verifiers", "drafters"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name}: must be >= 1, got {getattr(args, name)}")
    port = args.port
    if port is None:
        port = free_block(1 + args.verifiers + (0 if args.colocated else args.drafters))
    return StackConfig(port=port, colocated=args.colocated, draft=args.draft, model=args.model,
                       device=args.device, dtype=args.dtype, k=args.k, max_k=args.max_k,
                       kv_cache_tokens=args.kv_cache_tokens, metrics_port=args.metrics_port,
                       verifiers=args.verifiers, drafters=args.drafters)


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="run gateway, verifier and drafter on this machine",
                       description="Start the gateway, the verifier and (split mode) the drafter as separate "
                                   "processes, wait until all report SERVING, and stop them all on Ctrl-C. "
                                   "Settings not given as flags come from TANDEM_* variables.")
    add_stack_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    stack = Stack(stack_config(args))
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    stack.start()
    print("tandem serve: starting " + ", ".join(f"{n} (pid {p.pid}, port {stack.cfg.ports[n]})"
                                                for n, p in stack.procs.items()), flush=True)
    try:
        if not stack.wait_ready(stop=lambda: stopping):
            print("tandem serve: stopped while starting", file=sys.stderr)
            return 0
        mode = "co-located" if args.colocated else "split"
        print(f"tandem serve: ready at {stack.gateway_address} ({mode}; services: "
              + ", ".join(f"{n} pid {p.pid}" for n, p in stack.procs.items()) + "). Ctrl-C stops.", flush=True)
        while not stopping:
            for name, p in stack.procs.items():
                if p.poll() is not None and not name.startswith("drafter"):
                    print(f"tandem serve: {name} exited with code {p.returncode}; stopping", file=sys.stderr)
                    stopping = True
            time.sleep(0.5)
    except (RuntimeError, TimeoutError) as exc:
        print(f"tandem serve: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    return 0
