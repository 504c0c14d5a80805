"""Warm-ups that leave nothing to compile: after a bench case's or a verifier's warm-up, its requests build no
kernel and capture no graph (bench/timing.py ``CompileClock``).

Each check runs in a process of its own, as a bench or a server starts: Triton keeps the kernels it compiled for the
life of a process, so in pytest's process an earlier test would have compiled them already. Before the warm-ups let
a request join running ones, a sampled row's first round beside a running chain compiled Triton's Philox kernel for
one row inside the timed passes (230 ms; the case read 1.04x plain where it reads 1.12x: bench/RESULTS.md).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_a_bench_case_compiles_nothing_in_its_timed_passes(tmp_path):
    """Continuous admission, sampled, the EAGLE head: the arrivals that join running rows are the path the old
    warm-up (its batch arriving together) missed."""
    cmd = [sys.executable, "-m", "cli.main", "bench", "--name", "warm", "--dataset", "humaneval", "--num-prompts", "12",
           "--batch-sizes", "4", "--drafts", "none,auto", "--baselines", "none", "--temperatures", "0.7",
           "--admission", "continuous", "--max-tokens", "32", "--attention", "torch", "--device", "cuda",
           "--out-dir", str(tmp_path)]
    subprocess.run(cmd, check=True, timeout=600)
    rows = json.loads((tmp_path / "warm.json").read_text())
    assert {r["engine"] for r in rows} == {"tandem-plain", "tandem-spec-auto"}
    for r in rows:
        assert (r["jit_compiles"], r["jit_kernels"], r["graphs_captured"]) == (0, [], 0), r["engine"]


VERIFIER = """
import dataclasses, json
from bench.timing import CompileClock
from engine.config import SamplingParams
from engine.factory import build_engine
from verifier_svc.main import warm_up
from verifier_svc.service import PrefillItem, VerifierEngine
from verifier_svc.settings import VerifierSettings

settings = VerifierSettings(device="cuda", draft="auto", attention="torch", engine_process=False)
built = build_engine(settings.model, settings.draft, settings.engine_config(), progress=False)
engine = VerifierEngine(built.decoder, settings.lease_s)
warm_up(engine)
greedy = SamplingParams(max_tokens=64, ignore_eos=True)
sampled = dataclasses.replace(greedy, temperature=0.9, seed=7)
with CompileClock() as clock:
    engine.prefill([PrefillItem("a", list(range(10, 40)), [], greedy)])
    for _ in range(3):
        engine.step(["a"], [None])
    engine.prefill([PrefillItem("b", list(range(50, 67)), [], sampled)])  # joins the running one
    for _ in range(4):
        engine.step(["a", "b"], [None, None])
    filtered = dataclasses.replace(sampled, top_k=40, top_p=0.8, seed=3)
    engine.prefill([PrefillItem("c", list(range(70, 91)), [], filtered)])  # top-k / top-p rows join them
    for _ in range(4):
        engine.step(["a", "b", "c"], [None] * 3)
print(json.dumps(clock.summary()))
"""

DRAFTER = """
import json
import torch
from bench.timing import CompileClock
from drafter_svc.main import build, warm_up
from drafter_svc.service import DraftItem
from drafter_svc.settings import DrafterSettings
from engine.config import SamplingParams

settings = DrafterSettings(device="cuda", draft="auto", attention="torch")
engine = build(settings, settings.engine_config(wire=True))
warm_up(engine)
greedy, sampled = SamplingParams(), SamplingParams(temperature=0.9, seed=7)
rows = (("a", greedy, list(range(10, 40))), ("b", sampled, list(range(50, 67))))
feats = lambda n: torch.randn(n, engine.feature_size, device="cuda")  # noqa: E731
with CompileClock() as clock:
    out = engine.draft([DraftItem(rid, 0, toks, 4, p, feats(len(toks) - 1), 0) for rid, p, toks in rows])
    for step in range(3):  # the rounds after: each row's newly committed tokens and their features
        starts = {rid: len(toks) + 2 * step for rid, _, toks in rows}
        out = engine.draft([DraftItem(rid, starts[rid], [5, 6], 4, p, feats(2), starts[rid] - 1)
                            for rid, p, _ in rows])
assert all(not isinstance(o, Exception) for o in out), out
print(json.dumps(clock.summary()))
"""


def _compiled(script: str) -> tuple[int, list, int]:
    out = subprocess.run([sys.executable, "-c", script], timeout=600, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-4000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    return summary["jit_compiles"], summary["jit_kernels"], summary["graphs_captured"]


def test_a_verifiers_first_requests_after_its_warm_up_compile_nothing():
    """A co-located verifier's first greedy request, a sampled one joining it and a top-k / top-p one joining both,
    right after ``warm_up``."""
    assert _compiled(VERIFIER) == (0, [], 0)


def test_a_drafter_services_first_two_row_calls_after_its_warm_up_compile_nothing():
    """The EAGLE head in a drafter service: a greedy row and a sampled one drafted in one call, with the target's
    features, as a split verifier's rounds send them, right after ``warm_up``."""
    assert _compiled(DRAFTER) == (0, [], 0)
