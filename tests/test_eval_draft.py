"""``tandem eval-draft`` through the real CLI entry (``cli.main.main``) on the real SmolLM2 model.

The CLI loads its target through ``engine.models.loader.load_model``; here that call is
answered with the session's already-loaded model (same file, cpu, float32) after checking
the CLI asked for exactly that, so the test does not pay a second ~20 s load.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.eval_draft import markdown
from cli.main import main

pytestmark = pytest.mark.slow

BASE = ["--device", "cpu", "--num-prompts", "2", "--max-tokens", "16", "--k", "2", "--dataset", "sharegpt",
        "--kv-cache-tokens", "4096"]
DRAFTS = ["--draft", "ngram", "--draft", "layerskip:2"]
REPEATED = ("acceptance_length", "accepted_per_draft", "rounds", "rounds_total", "accepted", "drafted", "tokens",
            "accepted_histogram", "acceptance_length_all_rounds")


@pytest.fixture
def eval_draft(smollm, smollm_path, monkeypatch):
    import engine.models.loader as loader

    def load(path, device="cpu", dtype=torch.float32, **_):
        assert Path(path) == smollm_path and str(device) == "cpu" and dtype == torch.float32
        return smollm

    monkeypatch.setattr(loader, "load_model", load)
    return lambda *args: main(["eval-draft", *args])


def test_every_case_gets_a_row_and_sampled_cases_repeat_exactly(eval_draft, tmp_path, capsys):
    out = tmp_path / "grid.json"
    assert eval_draft(*BASE, *DRAFTS, "--temperature", "0,0.7", "--out", str(out)) == 0
    rows = json.loads(out.read_text())
    by_case = {(r["drafter"], r["dataset"], r["temperature"], r["k"]): r for r in rows}
    assert len(by_case) == len(rows) == 4
    assert set(by_case) == {(d, "sharegpt", t, 2) for d in ("ngram", "layerskip:2") for t in (0.0, 0.7)}
    for r in rows:
        assert 1 <= r["acceptance_length"] <= r["k"] + 1
        assert r["rounds"] > 0 and r["rounds_total"] >= r["rounds"]
        assert 0 <= r["accepted_per_draft"] <= 1
        assert r["acceptance_length"] == round((r["accepted"] + r["rounds"]) / r["rounds"], 4)
        assert r["accepted"] == sum(j * n for j, n in enumerate(r["accepted_histogram"]))
        assert sum(r["accepted_histogram"]) == r["rounds"] and len(r["accepted_histogram"]) == r["k"] + 1
        assert r["num_prompts"] == 2 and r["max_tokens"] == 16 and 0 < r["tokens"] <= 32
        env = r["environment"]
        assert env["device"] == "cpu" and env["dtype"] == "float32" and env["commit"]

    printed = capsys.readouterr().out
    table = markdown(rows)
    assert table in printed and table in out.with_suffix(".md").read_text()
    assert "| drafter | dataset | T=0 k=2 | T=0.7 k=2 |" in table
    assert "| ngram | sharegpt |" in table and "| layerskip:2 | sharegpt |" in table

    # a sampled case again (drafter and target both draw from seeded streams), in a run of its own:
    # the drafter is built afresh instead of reused after the greedy case
    again = tmp_path / "again.json"
    assert eval_draft(*BASE, "--draft", "layerskip:2", "--temperature", "0.7", "--out", str(again)) == 0
    [r] = json.loads(again.read_text())
    first = by_case[("layerskip:2", "sharegpt", 0.7, 2)]
    assert {key: r[key] for key in REPEATED} == {key: first[key] for key in REPEATED}


def test_a_case_leaves_no_state_in_the_shared_target_or_drafter(smollm):
    from bench.eval_draft import EvalCase, run_case
    from engine.config import EngineConfig
    from engine.drafters import DraftSpec, build_drafter
    from engine.runner import ModelRunner

    config = EngineConfig(kv_cache_tokens=2048, k=3, max_k=8)
    runner = ModelRunner(smollm.model, config)
    drafter = build_drafter(DraftSpec.parse("layerskip:2"), smollm, config)
    prompts = [smollm.tokenizer.encode(p) for p in ("def add(a, b):", "The capital of France is")]
    row = run_case(runner, smollm.tokenizer, config, drafter, EvalCase("layerskip:2", "raw", 0.7, 3), prompts,
                   max_tokens=4, batch_size=1)
    assert row["rounds"] > 0 and row["num_prompts"] == 2 and row["batch_size"] == 1
    assert runner.allocator.free_blocks == runner.allocator.num_blocks
    assert drafter.runner.allocator.free_blocks == drafter.runner.allocator.num_blocks


@pytest.mark.parametrize("args, flag", [
    (["--k", "0"], "--k"), (["--k", "2,x"], "--k"), (["--dataset", "mmlu"], "--dataset"),
    (["--temperature", "-1"], "--temperature"), (["--draft", "none"], "--draft"),
    (["--draft", "layerskip:x"], "--draft"), (["--num-prompts", "0"], "--num-prompts"),
])
def test_bad_flags_exit_nonzero_naming_the_flag(args, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["eval-draft", *args])
    assert exc.value.code != 0
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err and "Traceback" not in err


def test_help_explains_flags_and_the_definition(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["eval-draft", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "mean of (accepted + 1) over the rounds in which the drafter proposed at least one token" in text
    for flag in ("--model", "--draft", "--dataset", "--k", "--temperature", "--num-prompts", "--max-tokens",
                 "--batch-size", "--device", "--dtype", "--attention", "--name", "--out", "--seed"):
        assert flag in text


def test_held_out_prompts_and_table_layout(smollm):
    from bench.datasets import SHAREGPT_EVAL_START, held_out_prompts, humaneval, sharegpt

    first = next(c for c in sharegpt(split="eval") if c.first_user_text and len(c.first_user_text) < 2000)
    assert first.index >= SHAREGPT_EVAL_START
    [ids] = held_out_prompts("sharegpt", smollm.tokenizer, 1)
    assert ids == smollm.tokenizer.encode_chat([{"role": "user", "content": first.first_user_text}])
    assert held_out_prompts("humaneval", smollm.tokenizer, 2) == [smollm.tokenizer.encode(p.prompt)
                                                                  for p in humaneval()[:2]]

    row = {"drafter": "ngram", "dataset": "humaneval", "acceptance_length": 2.5, "accepted_per_draft": 0.375}
    table = markdown([{**row, "temperature": 0.0, "k": 4}, {**row, "drafter": "x", "temperature": 0.7, "k": 2,
                                                          "acceptance_length": None, "accepted_per_draft": None}])
    assert table.splitlines() == [
        "| drafter | dataset | T=0 k=4 | T=0.7 k=2 |",
        "|---|---|---:|---:|",
        "| ngram | humaneval | 2.50 (0.38) | – |",
        "| x | humaneval | – | – (–) |",
    ]
