"""Tandem beside its peers: one table per (model, dataset, temperature) from ``tandem bench`` result files.

    python -m bench.compare bench/results/A.json bench/results/B.json ... [--out FILE.md]

Rows of several runs (e.g. Tandem's and vLLM's, made in separate calls of one GPU run) are
grouped by model, dataset, temperature and batch size. ``tandem_vs_peer`` is a Tandem row's
tokens/s over its counterpart: plain over vLLM plain; speculative over vLLM's best speculative
row of that cell (the fastest of its n-gram methods), the yardstick the issue sets.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

COLS = ("engine", "tokens_per_s", "tandem_vs_peer", "acceptance_length", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50",
        "itl_ms_p99", "peak_memory_mib")


def _is_spec(row: dict) -> bool:
    return row["engine"].startswith("tandem-spec") or row["engine"].startswith("vllm-")


def add_peer_ratios(rows: list[dict]) -> None:
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        cells[(r.get("model"), r.get("dataset"), r.get("temperature"), r.get("batch_size"))].append(r)
    for cell in cells.values():
        plain = [r["tokens_per_s"] for r in cell if r["engine"] == "vllm"]
        spec = [r["tokens_per_s"] for r in cell if r["engine"].startswith("vllm-")]
        for r in cell:
            if not r["engine"].startswith("tandem"):
                continue
            peer = max(spec, default=None) if _is_spec(r) else max(plain, default=None)
            r["tandem_vs_peer"] = round(r["tokens_per_s"] / peer, 3) if peer else None


def tables(rows: list[dict]) -> str:
    rows = [r for r in rows if "error" not in r and "batch_size" in r]
    add_peer_ratios(rows)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r.get("model"), r.get("dataset"), r.get("temperature"))].append(r)
    out = []
    for (model, dataset, temperature), group in groups.items():
        gpus = sorted({str(r.get("gpu")) for r in group})
        commits = sorted({str(r.get("commit")) for r in group})
        out.append(f"### {model}, {dataset}, temperature {temperature}\n\n"
                   f"GPU {', '.join(gpus)}; commit {', '.join(commits)}\n")
        out.append("| batch | " + " | ".join(COLS) + " |")
        out.append("|" + "---|" * (len(COLS) + 1))
        for r in sorted(group, key=lambda r: (r["batch_size"], not r["engine"].startswith("tandem"),
                                              _is_spec(r), r["engine"])):
            out.append(f"| {r['batch_size']} | " + " | ".join(str(r.get(c)) for c in COLS) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", help="tandem bench result files (JSON lists of rows)")
    p.add_argument("--out", help="write the markdown here too")
    args = p.parse_args(argv)
    rows = [r for f in args.files for r in json.loads(Path(f).read_text())]
    text = tables(rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
