"""``tandem bench`` results as a PNG: tokens/s per engine against batch size, one panel per
(dataset, temperature). Needs matplotlib (the dev extra), so the GPU machine writes JSON and the
plot is drawn wherever matplotlib is installed: ``tandem bench-plot bench/results/NAME.json``."""

from __future__ import annotations

import json
from pathlib import Path


def plot(rows: list[dict], out: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("batch_size") and r.get("tokens_per_s")]
    panels = sorted({(r["dataset"], r["temperature"]) for r in rows})
    if not panels:
        raise ValueError("plot: no rows with a batch size and tokens/s")
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (dataset, temp) in zip(axes[0], panels):
        mine = [r for r in rows if (r["dataset"], r["temperature"]) == (dataset, temp)]
        for engine in dict.fromkeys(r["engine"] for r in mine):
            pts = sorted((r["batch_size"], r["tokens_per_s"]) for r in mine if r["engine"] == engine)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=engine)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{dataset}, T={temp:g}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    if title:
        import textwrap

        fig.suptitle("\n".join(textwrap.wrap(title, 60 * len(panels))), fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_file(path: Path) -> Path:
    rows = json.loads(path.read_text())
    env = rows[0] if rows else {}
    title = f"{env.get('gpu') or env.get('cpu')}, commit {env.get('commit')}: {env.get('command', '')}"
    return plot(rows, path.with_suffix(".png"), title)
