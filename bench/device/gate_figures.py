"""The acceptance gate's figures on a GPU (engine/policy.py ``AcceptanceGate``): for each drafter, the replay times
the gate reads (a speculative round, a plain token, by rows bucket, greedy), timed at capture before any request,
then again after a few requests ran (the bench captures and times each case after the last case's requests), and
the verdicts the gate gives at 1, 4 and 16 rows for requests at 1.2, 1.6, 2.0 and 2.5 tokens a round.
Device recipe (run on the GPU machine after staging): ``python3 bench/device/gate_figures.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.assets import default_model_path  # noqa: E402
from engine.config import SamplingParams  # noqa: E402
from engine.drafters import DraftSpec, build_drafter  # noqa: E402
from engine.models.loader import load_model  # noqa: E402
from engine.rounds.graph_sampling import Mode  # noqa: E402
from engine.runner import ModelRunner  # noqa: E402
from engine.spec import SpecDecoder  # noqa: E402
from rpc.settings import EngineSettings  # noqa: E402


def figures(gate) -> str:
    return " ".join(f"{b}:{gate.spec_ms[(b, 0)]:.3f}/{gate.plain_ms[(b, 0)]:.3f}" for b in (1, 2, 4, 8, 16)
                    if (b, 0) in gate.spec_ms and (b, 0) in gate.plain_ms)


def main() -> None:
    model = load_model(default_model_path(), device="cuda", dtype=torch.bfloat16, progress=False)
    config = EngineSettings(device="cuda", attention="torch").engine_config()
    prompts = [model.tokenizer.encode_chat([{"role": "user", "content": f"Write a story about the number {i}."}])
               for i in range(4)]
    for draft in ("ngram", "auto"):
        dec = SpecDecoder(ModelRunner(model.model, config), model.tokenizer, config,
                          build_drafter(DraftSpec.parse(draft), model, config))
        gate = dec.fast.gate
        dec.capture_rounds(16, [Mode.GREEDY])
        print(draft, "at capture (spec round / plain token ms):", figures(gate))
        dec.generate(prompts, SamplingParams(max_tokens=64, ignore_eos=True))
        gate.spec_ms.clear()
        gate.plain_ms.clear()
        dec.capture_rounds(16, [Mode.GREEDY])
        print(draft, "after requests ran:", figures(gate))
        for rows in (1, 4, 16):
            print(draft, rows, "rows:", {tau: gate.speculate(rows, 0, [tau]) for tau in (1.2, 1.6, 2.0, 2.5)})


if __name__ == "__main__":
    main()
