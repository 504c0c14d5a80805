"""What a service's CUDA graphs cost at startup, by kind: ``python -m bench.capture_cost`` (cuda only).

A co-located verifier's engine (``--draft auto``, the default settings, ``--attention torch``) captures its prefill
graphs, its round graphs in the greedy and sampled modes, then in the filtered (top-k / top-p) mode; a drafter
service's EAGLE head its prompt catch-ups, then its catch-ups over 2 .. k + 1 committed tokens
(``PrefillGraphs.capture_chunks``). Each line: graphs built, seconds (the first kind also compiles the kernels they
share), and the CUDA memory reserved meanwhile."""

from __future__ import annotations

import time

import torch

from drafter_svc.main import build
from drafter_svc.settings import DrafterSettings
from engine.factory import build_engine
from engine.rounds.graph_sampling import Mode
from verifier_svc.settings import VerifierSettings


def clock(what, fn):
    torch.cuda.synchronize()
    m0, t0 = torch.cuda.memory_reserved(), time.perf_counter()
    n = fn()
    torch.cuda.synchronize()
    print(f"{what}: {n} graphs, {time.perf_counter() - t0:.2f} s, "
          f"{(torch.cuda.memory_reserved() - m0) / 2**20:.0f} MiB reserved", flush=True)


def main() -> None:
    settings = VerifierSettings(device="cuda", draft="auto", attention="torch", engine_process=False)
    dec = build_engine(settings.model, settings.draft, settings.engine_config(), progress=False).decoder
    clock("verifier prefills", dec.capture_prefills)
    clock("verifier rounds, greedy + sampled", lambda: dec.capture_rounds(modes=(Mode.GREEDY, Mode.SAMPLED)))
    clock("verifier rounds, filtered", lambda: dec.capture_rounds(modes=(Mode.FILTERED,)))
    ds = DrafterSettings(device="cuda", draft="auto", attention="torch")
    d = build(ds, ds.engine_config(wire=True)).drafter
    pg, width = d.runner.prefill_graphs, d.head.config.hidden_size
    clock("drafter prompts", lambda: pg.capture_prompts(features=width))
    clock("drafter catch-up chunks", lambda: pg.capture_chunks(8, features=width))


if __name__ == "__main__":
    main()
