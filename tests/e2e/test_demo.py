"""`tandem demo` as a person reads it: what runs where, then each answer streamed as it is generated with its
stats; the services' logs in files; a free block of ports (the default 50051 may be taken)."""

from __future__ import annotations

import contextlib
import os
import re
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

from cli.demo import PROMPTS


def _chunks(proc: subprocess.Popen, timeout: float) -> list[tuple[float, bytes]]:
    """Everything the process writes to stdout, as it arrives: (time, bytes) per read."""
    out, deadline = [], time.monotonic() + timeout
    fd = proc.stdout.fileno()
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            data = os.read(fd, 65536)
            if not data:
                return out
            out.append((time.monotonic(), data))
    proc.kill()
    raise AssertionError("tandem demo did not finish:\n" + b"".join(d for _, d in out).decode(errors="replace"))


def test_demo_streams_answers_and_keeps_the_logs_in_files(tmp_path):
    with contextlib.suppress(OSError), socket.socket() as held:
        held.bind(("0.0.0.0", 50051))  # the default port busy (if it is free): the demo must not need it
        held.listen()
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", "demo", "--device", "cpu", "--max-tokens", "16",
                                 "--kv-cache-tokens", "4096", "--log-dir", str(tmp_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        chunks = _chunks(proc, 600)
    err = proc.stderr.read().decode()
    assert proc.wait() == 0, err
    out = b"".join(d for _, d in chunks).decode()

    # what runs: the drafter named for what it is, the ports, where the logs are
    assert "drafter  an EAGLE head trained for SmolLM2-135M-Instruct, 5.2M parameters" in out
    ports = [int(p) for p in re.findall(r":(\d+)", out.split("services", 1)[1].splitlines()[0])]
    assert len(ports) == 3
    assert f"logs     {tmp_path}/{{verifier,drafter,gateway}}.log" in out
    for name in ("gateway", "verifier", "drafter"):
        assert "INFO" in (tmp_path / f"{name}.log").read_text()  # the services' logs are there ...
    assert "load SmolLM2" in (tmp_path / "verifier.log").read_text()
    assert "INFO" not in out + err and "load SmolLM2" not in out + err  # ... and not on the terminal

    # every answer, each followed by its stats
    stats = re.findall(r"\[(\d+) tokens in (\d+) rounds: acceptance length ([\d.]+) tokens a round, "
                       r"\d+/\d+ drafts accepted; first token after [\d.]+ s, ([\d.]+) tokens/s\]", out)
    assert len(stats) == len(PROMPTS)
    assert all(0 < int(n) <= 16 for n, _, _, _ in stats)
    assert all(float(tau) >= 1.0 for _, _, tau, _ in stats)
    for prompt in PROMPTS:
        assert f"> {prompt}" in out

    # the first answer arrived in pieces, as it was generated, before its stats
    seen, pieces = "", []
    for t, data in chunks:
        before = seen
        seen += data.decode(errors="replace")
        if f"> {PROMPTS[0]}\n" in seen and "[" not in seen.split(f"> {PROMPTS[0]}\n", 1)[1]:
            if f"> {PROMPTS[0]}\n" in before:
                pieces.append(t)
    assert len(pieces) >= 2 and pieces[-1] - pieces[0] > 0.05, "the answer came in one piece"
