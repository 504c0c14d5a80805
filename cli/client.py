"""``tandem client``: stream one answer from a gateway; prints the same JSON as ``tandem generate``."""

from __future__ import annotations

import argparse
import json
import os
import sys

from cli.options import add_sampling_args, sampling_params
from rpc.gateway_client import GatewayAccess, stream


def add_parser(sub) -> None:
    p = sub.add_parser(
        "client", help="stream an answer from a running gateway",
        description="Send one prompt to a Tandem gateway and stream the answer. Takes the same prompt, "
                    "sampling and --json flags as `tandem generate` and prints the same JSON summary.")
    p.add_argument("--address", default="localhost:50051", help="gateway host:port (default localhost:50051)")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    p.add_argument("--system", help="system message (with --chat)")
    p.add_argument("--k", type=int, help="draft tokens per round for this request (default: the server's)")
    p.add_argument("--timeout", type=float, default=600.0, help="deadline of the call in seconds (default 600)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    g = p.add_argument_group("gateway access", "what the gateway takes (tandem serve prints it)")
    g.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY") or None,
                   help="API key, sent as 'authorization: Bearer KEY' (default $TANDEM_API_KEY; none: no key)")
    g.add_argument("--tls", action="store_true", help="TLS, the gateway's certificate checked against the system's "
                                                      "roots (implied by --tls-ca-file)")
    g.add_argument("--tls-ca-file", help="TLS, the gateway's certificate checked against this CA (PEM)")
    g.add_argument("--tls-server-name", help="the name the gateway's certificate must hold (default: the host of "
                                             "--address), e.g. through a port-forward")
    add_sampling_args(p)
    p.set_defaults(run=run)


def build_request(args: argparse.Namespace):
    from protos.tandem.v1 import gateway_pb2
    from rpc import convert

    params = sampling_params(args)
    req = gateway_pb2.GenerateRequest(sampling=convert.sampling_to_pb(params))
    if args.k is not None:
        req.sampling.k = args.k
    if args.chat:
        msgs = ([gateway_pb2.ChatMessage(role="system", content=args.system)] if args.system else [])
        msgs.append(gateway_pb2.ChatMessage(role="user", content=args.prompt))
        req.messages.messages.extend(msgs)
    else:
        if args.system:
            raise ValueError("system: only meaningful with --chat")
        req.text = args.prompt
    return req


def run(args: argparse.Namespace) -> int:
    import asyncio

    import grpc

    gateway = GatewayAccess(args.address, args.api_key, args.tls or bool(args.tls_ca_file), args.tls_ca_file,
                            args.tls_server_name)
    try:
        summary = asyncio.run(stream(gateway, build_request(args), args.timeout))
    except grpc.aio.AioRpcError as exc:
        print(f"tandem client: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    sys.stdout.write("\n")
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
    else:
        print(f"[{summary['output_tokens']} tokens, {summary['rounds']} rounds, acceptance length "
              f"{summary['acceptance_length']:.2f}, {summary['tokens_per_s']:.1f} tok/s]", file=sys.stderr)
    return 0
