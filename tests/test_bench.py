"""``tandem bench`` end to end on the CPU (tiny sizes): every engine gets a row with the contract's fields."""

from __future__ import annotations

import json

import pytest

from bench.load import arrival_times
from bench.timing import CompileClock, GcClock, TokenClock, percentile
from cli.main import main


def test_percentile_and_token_clock():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    c = TokenClock()
    c.arrive("a", 0.0)
    c.tokens("a", 1, 0.5)   # first token after 0.5 s
    c.tokens("a", 3, 0.8)   # a round of 3 tokens 0.3 s later: three gaps of 0.1 s
    c.tokens("a", 0, 9.0)   # nothing committed: no gap
    s = c.summary()
    assert s["ttft_ms_p50"] == 500.0 and s["itl_ms_p50"] == pytest.approx(100.0)


def test_cli_lists_the_baselines_bench_runs():
    from bench.hf import HF_ENGINES
    from bench.peers.vllm import VLLM_ENGINES
    from cli.bench import HF_ENGINES as CLI_ENGINES
    from cli.bench import VLLM_ENGINES as CLI_VLLM

    assert CLI_ENGINES == HF_ENGINES and CLI_VLLM == tuple(VLLM_ENGINES)


def test_vllm_baseline_without_vllm_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TANDEM_PEER_PYTHONPATH", raising=False)
    code = main(["bench", "--name", "x", "--dataset", "humaneval", "--num-prompts", "1", "--batch-sizes", "1",
                 "--drafts", "none", "--baselines", "vllm-ngram", "--temperatures", "0", "--device", "cpu",
                 "--out-dir", str(tmp_path)])
    assert code == 2
    assert "baselines: vLLM is not installed" in capsys.readouterr().err


def test_vllm_gets_the_same_weights(tmp_path, smollm_path):
    """A GGUF is exported once as a Hugging Face directory; a synthetic model is a config-only directory with
    vLLM's dummy weights."""
    from bench.peers.vllm import model_dir

    d, fmt = model_dir(str(smollm_path), tmp_path)
    assert fmt == "auto" and (d / "model.safetensors").is_file() and (d / "tokenizer.json").is_file()
    stamp = (d / "model.safetensors").stat().st_mtime_ns
    assert model_dir(str(smollm_path), tmp_path)[0] == d and (d / "model.safetensors").stat().st_mtime_ns == stamp
    d, fmt = model_dir("synthetic:llama-3.1-8b", tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    assert fmt == "dummy" and not (d / "model.safetensors").exists()
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (4096, 32, 128256)


def test_compare_sets_tandem_against_the_matching_peer_row():
    from bench.compare import add_peer_ratios

    cell = {"model": "m", "dataset": "d", "temperature": 0.0, "batch_size": 4}
    rows = [{**cell, "engine": e, "tokens_per_s": v} for e, v in
            (("tandem-plain", 300.0), ("tandem-spec-auto", 600.0), ("vllm", 200.0), ("vllm-ngram", 150.0),
             ("vllm-ngram-gpu", 400.0), ("hf-eager", 10.0))]
    rows.append({**cell, "batch_size": 1, "engine": "tandem-plain", "tokens_per_s": 9.0})  # no peer in its cell
    add_peer_ratios(rows)
    got = {(r["engine"], r["batch_size"]): r.get("tandem_vs_peer") for r in rows}
    # plain against vLLM plain, speculative against vLLM's fastest speculative row
    assert got[("tandem-plain", 4)] == 1.5 and got[("tandem-spec-auto", 4)] == 1.5
    assert got[("tandem-plain", 1)] is None and got[("vllm", 4)] is None


def test_poisson_arrivals_are_seeded_and_increasing():
    a = arrival_times(50, rate=10.0, seed=1)
    assert a == arrival_times(50, rate=10.0, seed=1) and all(x < y for x, y in zip(a, a[1:]))
    assert 2.0 < a[-1] < 10.0  # mean gap 0.1 s


def test_gc_clock_counts_the_collections_inside_it_and_only_those():
    import gc

    with GcClock() as clock:
        gc.collect()             # a full collection
        gc.collect(0)
    gc.collect()                 # outside: not counted
    assert clock.count[2] == 1 and clock.count[0] >= 1 and clock.ms > 0
    assert clock.summary() == {"gc_collections": sum(clock.count), "gc_full": 1, "gc_ms": round(clock.ms, 2)}
    assert clock._callback not in gc.callbacks


def test_compile_clock_holds_tritons_jit_hooks_only_while_entered():
    from triton import knobs

    with CompileClock() as clock:
        assert (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook) == (clock._before, clock._after)
        with pytest.raises(RuntimeError, match="hooks are taken"):
            CompileClock().__enter__()  # one clock at a time: a second would lose the first's counts
    assert (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook) == (None, None)
    assert clock.summary() == {"jit_compiles": 0, "jit_ms": 0.0, "jit_kernels": [], "graphs_captured": 0}


def test_bench_writes_rows_table_and_plot(tmp_path):
    code = main(["bench", "--name", "cpu-smoke", "--dataset", "sharegpt", "--num-prompts", "2", "--batch-sizes", "1,2",
                 "--drafts", "none,ngram", "--baselines", "hf-eager,hf-prompt-lookup", "--temperatures", "0",
                 "--max-tokens", "4", "--arrival-rate", "50", "--round-token-budgets", "0,16", "--device", "cpu",
                 "--out-dir", str(tmp_path)])
    assert code == 0
    rows = json.loads((tmp_path / "cpu-smoke.json").read_text())
    fixed = [r for r in rows if r.get("scenario") != "poisson"]
    engines = {(r["engine"], r["batch_size"]) for r in fixed}
    # prompt lookup runs at batch size 1 only (transformers' limit)
    assert engines == {("tandem-plain", 1), ("tandem-spec-ngram", 1), ("hf-eager", 1), ("hf-prompt-lookup", 1),
                       ("tandem-plain", 2), ("tandem-spec-ngram", 2), ("hf-eager", 2)}
    for r in fixed:
        for key in ("engine", "batch_size", "dataset", "temperature", "tokens_per_s", "acceptance_length",
                    "speedup_vs_plain", "commit", "command"):
            assert key in r
        assert r["tokens_per_s"] > 0 and r["output_tokens"] == 4 * 2
        assert r["speedup_vs_plain"] is not None
    plain = [r for r in fixed if r["engine"] == "tandem-plain"]
    assert all(r["speedup_vs_plain"] == 1.0 and r["acceptance_length"] == 1.0 for r in plain)
    assert all(r["ttft_ms_p50"] > 0 and r["round_ms"] >= r["verify_ms"] > 0 for r in plain)
    assert all(isinstance(r["gc_full"], int) and r["gc_ms"] >= 0 for r in fixed if r["engine"].startswith("tandem"))
    # nothing compiled or captured in the timed passes (on the CPU nothing is; tests/gpu/test_gpu_warm_up.py on a GPU)
    assert all((r["jit_compiles"], r["graphs_captured"]) == (0, 0) for r in fixed if r["engine"].startswith("tandem"))
    # the loaded model's ~300k objects left out of the timed passes' collections, as a server leaves them
    assert all(r["gc_frozen"] > 100_000 for r in fixed if r["engine"].startswith("tandem"))
    load = [r for r in rows if r.get("scenario") == "poisson"]
    assert {(r["engine"], r["max_round_tokens"]) for r in load} == {
        ("tandem-plain", None), ("tandem-plain", 16), ("tandem-spec-ngram", None), ("tandem-spec-ngram", 16)}
    assert all(r["output_tokens"] == 8 and r["ttft_ms_p50"] > 0 for r in load)
    assert "| engine |" in (tmp_path / "cpu-smoke.md").read_text()
    assert (tmp_path / "cpu-smoke.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_admits_prompts_continuously(tmp_path):
    """--admission continuous: the next prompt arrives as soon as one finishes (a server's batch refilling); every
    prompt still streams all its tokens, each row's speedup is against plain decoding admitted the same way, and an
    unknown admission is refused."""
    code = main(["bench", "--name", "cont", "--dataset", "sharegpt", "--num-prompts", "5", "--batch-sizes", "2",
                 "--drafts", "none,ngram", "--baselines", "none", "--temperatures", "0", "--max-tokens", "6",
                 "--admission", "waves,continuous", "--device", "cpu", "--out-dir", str(tmp_path)])
    assert code == 0
    rows = json.loads((tmp_path / "cont.json").read_text())
    assert [(r["admission"], r["engine"]) for r in rows] == [
        ("waves", "tandem-plain"), ("waves", "tandem-spec-ngram"),
        ("continuous", "tandem-plain"), ("continuous", "tandem-spec-ngram")]
    assert all(r["output_tokens"] == 5 * 6 for r in rows)
    assert [r["speedup_vs_plain"] for r in rows if r["engine"] == "tandem-plain"] == [1.0, 1.0]
    assert "| continuous |" in (tmp_path / "cont.md").read_text()
    assert main(["bench", "--name", "x", "--admission", "all-at-once", "--baselines", "none", "--device", "cpu",
                 "--out-dir", str(tmp_path)]) != 0
    assert main(["bench", "--name", "x", "--min-seconds", "-1", "--baselines", "none", "--device", "cpu",
                 "--out-dir", str(tmp_path)]) != 0


def test_wave_tail_is_each_waves_slowest_request_over_its_mean():
    from bench.run import wave_tail

    assert wave_tail([[64, 64], [64]]) == 1.0                   # plain: every request as many rounds as the others
    assert wave_tail([[40, 60], [50, 50]]) == pytest.approx((60 + 50) / (50 + 50))
    assert wave_tail([[30, 30, 30, 90]]) == 2.0                 # one slow request holds a wave of four
    assert wave_tail([]) is None and wave_tail([[]]) is None


def test_speedups_by_total_and_by_median_pass_are_against_the_matching_plain_row():
    from bench.run import add_speedups

    cell = {"batch_size": 64, "temperature": 0.0, "dataset": "d"}
    median = {"tokens_per_s_pass_median": 110.0}
    rows = add_speedups([{**cell, **median, "engine": "tandem-plain", "tokens_per_s": 100.0},
                         {**cell, **median, "engine": "tandem-spec-auto", "tokens_per_s": 95.0},
                         {**cell, "batch_size": 4, "engine": "tandem-spec-auto", "tokens_per_s": 9.0}])
    assert [(r["speedup_vs_plain"], r.get("speedup_pass_median")) for r in rows] == [(1.0, 1.0), (0.95, 1.0),
                                                                                      (None, None)]


def test_min_seconds_runs_the_prompts_again_until_the_time_has_passed(smollm):
    """--min-seconds: the same prompts, waves and seeds again until that long has passed; every pass streams all
    its tokens, the row says how many passes ran, and each wave's tail counts its own requests."""
    from bench.run import BenchCase, run_case
    from engine.config import EngineConfig

    texts = ("Count from one to twenty.", "Write a poem about the sea.", "List three colors.")
    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]
    config = EngineConfig(kv_cache_tokens=8192)
    once = run_case(smollm, config, BenchCase("ngram", 2, 0.0), prompts, 12, 0)
    assert once["passes"] == 1 and once["output_tokens"] == 3 * 12 and once["wave_tail"] >= 1.0
    again = run_case(smollm, config, BenchCase("ngram", 2, 0.0), prompts, 12, 0, min_seconds=2.5 * once["elapsed_s"])
    assert again["passes"] >= 2 and again["elapsed_s"] >= 2.5 * once["elapsed_s"]
    assert again["output_tokens"] == again["passes"] * 3 * 12
    assert again["acceptance_length"] == once["acceptance_length"]  # greedy: each pass the same rounds
    assert again["wave_tail"] == once["wave_tail"]
    # one pass: its median pass is the whole run; repeated: one pass's rate, near the run's (the same work each)
    assert once["tokens_per_s_pass_median"] == pytest.approx(once["tokens_per_s"], rel=1e-2)
    assert again["tokens_per_s_pass_median"] == pytest.approx(again["tokens_per_s"], rel=0.5)
    plain = run_case(smollm, config, BenchCase("none", 2, 0.0), prompts, 12, 0)
    assert plain["wave_tail"] == 1.0
    cont = run_case(smollm, config, BenchCase("none", 2, 0.0, "continuous"), prompts, 12, 0)
    assert cont["wave_tail"] is None and cont["passes"] == 1


def test_bench_imports_nothing_from_cli():
    """Dependencies point one way: the CLI drives the benches, never the reverse."""
    import ast
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench"
    upward = []
    for f in bench.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            upward += [f"{f.name}: {n}" for n in names if n == "cli" or n.startswith("cli.")]
    assert upward == []


def test_continuous_admission_keeps_the_batch_full_where_waves_do_not(smollm, monkeypatch):
    """The real engine, observed: before every round, how many requests are in flight while prompts are still to
    come. Waves leave a row empty once one request of a wave finishes before its partner (n-gram drafts accept
    differently); continuous admission fills it at once, so the batch stays full until the prompts run out."""
    import bench.run as bench_run
    from bench.run import BenchCase, run_case
    from engine.config import EngineConfig

    texts = ("Count from one to twenty.", "Write a poem about the sea.", "List three colors.", "Say hi.", "Why?")
    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]
    real = bench_run._timed_decoder
    seen: dict[str, list[int]] = {}

    def observed(*args, **kwargs):
        dec, timer = real(*args, **kwargs)
        step, add = dec.step, dec.add_request
        admitted = []

        def counting_add(prompt, params, request_id=None, output_ids=()):
            admitted.append(request_id)
            return add(prompt, params, request_id, output_ids)

        def counting_step():
            if any(a and a.startswith("bench-") for a in admitted) and len(admitted) < len(prompts) + 2:
                seen[mode].append(len(dec.requests) + len(dec.waiting))  # prompts still to come (+2: warm-up)
            return step()

        dec.step, dec.add_request = counting_step, counting_add
        return dec, timer

    monkeypatch.setattr(bench_run, "_timed_decoder", observed)
    config = EngineConfig(kv_cache_tokens=8192)
    for mode in ("waves", "continuous"):
        seen[mode] = []
        row = run_case(smollm, config, BenchCase("ngram", 2, 0.0, mode), prompts, 24, 0)
        assert row["output_tokens"] == 5 * 24
    assert seen["continuous"] and set(seen["continuous"]) == {2}
    assert min(seen["waves"]) == 1  # a row of a wave sat empty while prompts waited

