"""`tandem serve` and `tandem client` as a user runs them: same JSON as `tandem generate`; Ctrl-C stops all."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rpc.ports import free_block
from engine.config import SamplingParams
from tests.conftest import make_decoder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_serve_client_and_ctrl_c(smollm):
    """With its defaults: the gateway on 127.0.0.1 answers `tandem client` (no key: loopback), the verifier and
    drafter refuse a plaintext caller (mutual TLS with credentials of the run, removed when it stops)."""
    port = free_block(3)
    serve = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--device", "cpu",
                              "--kv-cache-tokens", "4096"], stdout=subprocess.PIPE, text=True)
    try:
        line, seen = "", []
        deadline = time.monotonic() + 300
        while "ready at" not in line:
            line = serve.stdout.readline()
            seen.append(line)
            assert line or serve.poll() is None, "tandem serve exited early"
            assert time.monotonic() < deadline, "tandem serve did not become ready"
        assert f"ready at 127.0.0.1:{port}" in line
        said = "".join(seen)
        assert "services  verifier, drafter on 127.0.0.1: mutual TLS" in said
        assert f"gateway   127.0.0.1:{port} over plaintext; clients need no API key (loopback" in said
        credentials = Path(said.split("credentials of this run in ")[1].split(" ")[0])
        assert (credentials / "ca.crt").exists()
        for internal in (port + 1, port + 2):  # verifier, drafter: mutual TLS only
            with grpc.insecure_channel(f"localhost:{internal}") as ch, pytest.raises(grpc.RpcError) as err:
                health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        pids = [int(p) for p in line.split("pid ")[1:] for p in [p.split(",")[0].split(")")[0]]]
        assert len(pids) == 3 and all(_alive(p) for p in pids)

        prompt = "Name a famous painter."
        proc = subprocess.run([sys.executable, "-m", "cli.main", "client", "--address", f"localhost:{port}",
                               "--prompt", prompt, "--chat", "--max-tokens", "16", "--json"],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        summary = json.loads(proc.stdout.strip().split("\n")[-1])
        ids = smollm.tokenizer.encode_chat([{"role": "user", "content": prompt}])
        ref = make_decoder(smollm, "ngram").generate([ids], SamplingParams(max_tokens=16))[0]
        assert summary["token_ids"] == ref.new_token_ids and summary["text"] == ref.text_delta
        for key in ("text", "token_ids", "finish_reason", "prompt_tokens", "output_tokens", "rounds", "accepted",
                    "drafted", "acceptance_length", "tokens_per_s", "time_to_first_token_s", "elapsed_s"):
            assert key in summary
        assert summary["prompt_tokens"] == len(ids) and summary["rounds"] >= 1

        serve.send_signal(signal.SIGINT)
        assert serve.wait(60) == 0
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in pids)
        assert not credentials.exists()
    finally:
        if serve.poll() is None:
            serve.kill()


def _pids(line: str) -> list[int]:
    """The service pids of a ``tandem serve: starting NAME (pid N, port P), ...`` line."""
    return [int(p.split(",")[0]) for p in line.split("pid ")[1:]]


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan waits for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _serve(port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--device", "cpu",
                             "--draft", "ngram", "--kv-cache-tokens", "2048"], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "TANDEM_GRACE_S": "1"})


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in pids if _running(p)]


def test_services_die_with_a_killed_serve_and_free_their_ports():
    from rpc.ports import port_in_use

    port = free_block(3)
    serve = _serve(port)
    said = []
    try:
        pids = _pids(serve.stdout.readline())
        assert len(pids) == 3
        deadline = time.monotonic() + 300
        while "ready at" not in (said[-1] if said else ""):
            said.append(serve.stdout.readline())
            assert serve.poll() is None and time.monotonic() < deadline, "tandem serve did not become ready"
        serve.kill()  # SIGKILL: no handler runs in tandem serve
        serve.wait()
        assert _gone_within(pids, 15) == []
        assert not any(port_in_use(p) for p in range(port, port + 3))  # a new stack can have them
    finally:
        if serve.poll() is None:
            serve.kill()
        # a killed serve cannot remove its throwaway credentials (a private 0700 directory): the test does
        credentials = "".join(said).split("credentials of this run in ")
        if len(credentials) > 1:
            shutil.rmtree(credentials[1].split(" ")[0], ignore_errors=True)


def test_sigterm_while_serve_starts_stops_everything():
    serve = _serve(free_block(3))
    try:
        pids = _pids(serve.stdout.readline())
        time.sleep(2.0)  # the services are loading
        serve.terminate()
        assert serve.wait(30) == 0
        assert _gone_within(pids, 15) == []
    finally:
        if serve.poll() is None:
            serve.kill()
