"""``tandem bench-serve`` and its load client against the real stack on loopback (CPU)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.serve_load import Load, run_load
from cli.main import main

pytestmark = pytest.mark.slow


def test_bench_serve_drives_a_colocated_stack_and_the_engine_in_process(tmp_path, capsys):
    code = main(["bench-serve", "--name", "t", "--out-dir", str(tmp_path), "--servers", "tandem-colocated",
                 "--concurrency", "1,3", "--num-prompts", "5", "--max-tokens", "6", "--draft", "ngram",
                 "--dataset", "sharegpt",
                 "--device", "cpu", "--kv-cache-tokens", "8192", "--client-processes", "2", "--in-process"])
    assert code == 0
    rows = json.loads((tmp_path / "t.json").read_text())
    served = [r for r in rows if r["server"] == "tandem-colocated"]
    inproc = [r for r in rows if r["server"] == "in-process"]
    assert [r["concurrency"] for r in served] == [1, 3] and [r["concurrency"] for r in inproc] == [1, 3]
    for r in served:
        assert r["errors"] == [] and r["completed"] == r["requests"] == 5
        assert r["output_tokens"] == 5 * 6  # EOS ignored: every request streams exactly max_tokens
        assert r["ttft_ms_p50"] > 0 and r["itl_ms_p50"] > 0 and r["acceptance_length"] >= 1
        assert r["client_processes"] == (1 if r["concurrency"] == 1 else 2) and r["client_cpu_s"] >= 0
        # the verifier's rows of this load alone, by reason: each prompt's prefill, then decoding rows (eager on
        # a CPU: no graphs, so no fused rounds either)
        assert r["rows.prefill"] == 5 and r["rows.fused_off"] >= 5 * (6 - 1) // 4 and "fused.run" not in r
        assert r["serve_s.round"] > 0  # the engine thread's time running rounds during this load
        assert r["serve_rounds.run"] >= 6 and 1 <= r["rows_per_round"] <= r["concurrency"]
        assert 0.5 < r["batch_mean"] <= r["concurrency"]  # over the rounds' time (a tick may run no row)
        # a request's time in the engine, and the client's, which holds it and the wire both ways
        assert r["serve_requests.finished"] == 5
        assert 0 <= r["engine_ms.queued"] and 0 < r["engine_ms.first"] < r["engine_ms.life"]
        assert r["engine_ms.queued"] + r["engine_ms.life"] < r["latency_ms_mean"]
        assert r["ttft_ms_mean"] < r["latency_ms_mean"] and r["itl_ms_mean"] > 0
        assert 0 < r["in_flight_mean"] <= r["concurrency"]
        # the ratio is written to three decimals: off by at most half the last one, whatever its size (a CPU's
        # served ratio can be 0.04, where 1 % is less than the rounding)
        assert r["served_vs_in_process"] == pytest.approx(
            r["tokens_per_s"] / next(i["tokens_per_s"] for i in inproc if i["concurrency"] == r["concurrency"]),
            rel=0, abs=5e-4 + 1e-9)
    assert "| tandem-colocated | False | 1 | 3 |" in (tmp_path / "t.md").read_text()


def test_bench_serve_runs_a_stack_per_tracing_setting(tmp_path, monkeypatch):
    """--tracing off,on: the same load on a stack without tracing and on one exporting its spans to a receiver the
    command runs; each row says which, with the services' CPU over the load and, traced, the spans received."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")  # the services' exporters send every 0.2 s
    code = main(["bench-serve", "--name", "t", "--out-dir", str(tmp_path), "--servers", "tandem-colocated",
                 "--tracing", "off,on", "--concurrency", "2", "--num-prompts", "3", "--max-tokens", "5",
                 "--dataset", "sharegpt",
                 "--draft", "ngram", "--device", "cpu", "--kv-cache-tokens", "8192", "--client-processes", "1"])
    assert code == 0
    rows = json.loads((tmp_path / "t.json").read_text())
    assert [r["tracing"] for r in rows] == [False, True]
    off, on = rows
    for r in rows:
        assert r["completed"] == 3 and r["cpu_s.gateway"] > 0 and r["gateway_cpu_ms_per_round"] > 0
    assert "spans" not in off
    assert on["spans"] >= on["serve_rounds.run"]  # a spec.round span per round, and the requests' own
    assert "| tandem-colocated | True | 1 | 2 |" in (tmp_path / "t.md").read_text()


class _VllmLikeStream(BaseHTTPRequestHandler):
    """vLLM's /v1/completions stream as its server writes it (SSE ``data:`` lines, token_ids per chunk with
    ``return_token_ids``, ``[DONE]``): the part of the peer's wire format the client parses."""

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        sent = 0
        while sent < body["max_tokens"]:
            n = min(2, body["max_tokens"] - sent)
            chunk = {"choices": [{"index": 0, "text": "x" * n, "token_ids": list(range(sent, sent + n))}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            sent += n
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


def test_openai_protocol_counts_streamed_tokens():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _VllmLikeStream)
    server.bodies = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        row = run_load(Load("openai", f"127.0.0.1:{server.server_port}", max_tokens=5, concurrency=2, processes=1),
                       [[1, 2, 3], [4, 5]])
    finally:
        server.shutdown()
    assert row["errors"] == [] and row["completed"] == 2 and row["output_tokens"] == 10
    # the request asks for exactly max_tokens, EOS ignored, streamed with token ids
    assert all(b["ignore_eos"] and b["min_tokens"] == 5 and b["stream"] and b["return_token_ids"]
               for b in server.bodies)
