"""``tandem``: entry point. Each subcommand lives in its own module with ``add_parser`` and ``run``."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module (imported lazily so `tandem --help` stays fast)
COMMANDS = {
    "generate": "cli.generate",
    "fetch": "cli.fetch",
    "bench": "cli.bench",
    "bench-plot": "cli.bench_plot",
    "bench-services": "cli.bench_services",
    "bench-serve": "cli.bench_serve",
    "eval-draft": "cli.eval_draft",
    "export-hf": "cli.export_hf",
    "train-draft": "cli.train_draft",
    "serve": "cli.serve",
    "client": "cli.client",
    "demo": "cli.demo",
    "certs": "cli.certs",
    "verifier": "cli.services",
    "drafter": "cli.services",
    "gateway": "cli.services",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tandem",
        description="Tandem: speculative decoding. A small drafter proposes tokens, the target model "
                    "verifies them in one pass; the output is exactly the target's.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in dict.fromkeys(COMMANDS.values()):  # a module may add several subcommands
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (ValueError, FileNotFoundError) as exc:  # validation errors name the field
        print(f"tandem {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
