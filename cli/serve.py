"""``tandem serve``: the whole stack on this machine, as separate processes; Ctrl-C (or SIGTERM) stops it all, and
the services also stop if this process is killed (``rpc.lifetime``)."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import time

from rpc.ports import free_block
from rpc.stack import Stack, StackConfig
from rpc.tls import is_loopback


def add_stack_args(p: argparse.ArgumentParser, default_port: int | None = 50051) -> None:
    """The stack's flags; ``default_port`` None: without --port, a free block of ports."""
    where = f"default {default_port}" if default_port else "default: the first of a free block of ports"
    p.add_argument("--port", type=int, default=default_port,
                   help=f"gateway port; the verifier takes PORT+1 and the drafter PORT+2 ({where}); a port in use "
                        "is an error")
    p.add_argument("--colocated", action="store_true",
                   help="no drafter service: the verifier drafts itself and runs whole rounds (Step)")
    p.add_argument("--direct-draft", action=argparse.BooleanOptionalAction, default=True,
                   help="split mode: each verifier calls its drafter itself and runs the rounds back to back, as "
                        "co-located serving does; the gateway never calls a drafter; verifier i drafts on drafter "
                        "i mod --drafters (default). --no-direct-draft: the gateway runs each round (Draft, then "
                        "Verify), any drafter replica serving any verifier, early drafts")
    p.add_argument("--draft", default="auto",
                   help="auto (the trained drafter shipped for the model, else ngram), ngram[:N], layerskip:N or a "
                        "drafter PATH (default auto)")
    p.add_argument("--model", help="target GGUF file, Hugging Face directory or synthetic:NAME (default SmolLM2)")
    p.add_argument("--device", help="cpu or cuda[:N] (default cuda when present)")
    p.add_argument("--drafter-device", help="split mode: the drafters' device (default --device), e.g. cuda:1, a "
                                            "GPU of their own")
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
    p.add_argument("--gateways", type=int, default=1,
                   help="gateway processes sharing its port (SO_REUSEPORT: the kernel spreads client connections "
                        "over them; each streams to every verifier). One gateway's Python streams a few tens of "
                        "thousands of tokens/s: more where many clients stream at once (default 1)")
    g = p.add_argument_group(
        "security", "The verifiers and drafters listen on 127.0.0.1 and speak mutual TLS with credentials made for "
                    "this run (a throwaway CA in a private temporary directory, removed on exit): a process without "
                    "them is refused. The gateway listens on --host: on loopback (the default) this machine's "
                    "processes may call it without a key; beyond, clients need an API key (--api-keys-file, or one "
                    "made and printed once).")
    g.add_argument("--host", default="127.0.0.1",
                   help="address the gateway listens on (default 127.0.0.1; 0.0.0.0: every interface, which needs "
                        "API keys)")
    g.add_argument("--api-keys-file", help="the gateway's API keys, one per line, optionally followed by the most "
                                           "calls each may have in flight (clients send 'authorization: Bearer KEY')")
    g.add_argument("--api-tls-cert-file", help="client-facing TLS: the gateway's certificate (PEM)")
    g.add_argument("--api-tls-key-file", help="client-facing TLS: its private key (PEM)")
    g.add_argument("--insecure", action="store_true",
                   help="plaintext with no authentication between the services, and a gateway beyond loopback "
                        "without API keys: only on a machine and network you trust")


def stack_config(args: argparse.Namespace) -> StackConfig:
    for name in ("verifiers", "drafters", "gateways"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name}: must be >= 1, got {getattr(args, name)}")
    if bool(args.api_tls_cert_file) != bool(args.api_tls_key_file):
        raise ValueError("--api-tls-cert-file, --api-tls-key-file: client-facing TLS needs both")
    if args.colocated and args.drafter_device:
        raise ValueError("--drafter-device: split mode only (a co-located verifier drafts itself)")
    direct = args.direct_draft and not args.colocated
    if direct and args.drafters > args.verifiers:
        raise ValueError(f"--drafters: {args.drafters} drafters for {args.verifiers} verifiers would leave some idle "
                         "(with --direct-draft each verifier calls one drafter); add verifiers or --no-direct-draft")
    cfg = StackConfig(colocated=args.colocated, direct_draft=direct, draft=args.draft, model=args.model,
                      device=args.device, drafter_device=args.drafter_device, dtype=args.dtype, k=args.k,
                      max_k=args.max_k,
                      kv_cache_tokens=args.kv_cache_tokens, metrics_port=args.metrics_port,
                      verifiers=args.verifiers, drafters=args.drafters, gateways=args.gateways, host=args.host,
                      insecure=args.insecure, api_keys_file=args.api_keys_file,
                      api_tls_cert_file=args.api_tls_cert_file, api_tls_key_file=args.api_tls_key_file)
    return dataclasses.replace(cfg, port=free_block(cfg.block) if args.port is None else args.port)


def security_lines(stack: Stack) -> list[str]:
    """How the stack is protected, in words (and the API key it made, the one time it is shown)."""
    c = stack.cfg
    if c.insecure:
        inside = "plaintext, no authentication (--insecure)"
    else:
        inside = f"mutual TLS, credentials of this run in {stack.credentials.directory} (removed on exit)"
    if c.api_keys_file:
        clients = f"need an API key of {c.api_keys_file}"
    elif stack.api_key:
        clients = (f"need this API key, shown once: {stack.api_key} (send 'authorization: Bearer KEY'; "
                   "tandem client --api-key KEY)")
    else:
        clients = "need no API key" + (" (loopback: this machine only)" if is_loopback(c.host) else
                                       " (--insecure: anyone who reaches it)")
    scheme = "TLS" if c.api_tls_cert_file else "plaintext"
    gateways = f" ({c.gateways} processes on the port)" if c.gateways > 1 else ""
    return [f"  services  {', '.join(n for n in stack.names() if not n.startswith('gateway'))} on 127.0.0.1: {inside}",
            f"  gateway   {c.host}:{c.port}{gateways} over {scheme}; clients {clients}"]


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
    for line in security_lines(stack):
        print(line, flush=True)
    try:
        if not stack.wait_ready(stop=lambda: stopping):
            print("tandem serve: stopped while starting", file=sys.stderr)
            return 0
        mode = "co-located" if args.colocated else "split" if args.direct_draft else "split, rounds run by the gateway"
        print(f"tandem serve: ready at {stack.cfg.host}:{stack.cfg.port} ({mode}; services: "
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
