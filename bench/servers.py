"""The servers ``tandem bench-serve`` drives: Tandem's stack (co-located or split) and vLLM's OpenAI server.

Each is a context manager that starts the server as processes on this machine, waits until it
answers its health check and yields a ``Served`` (protocol and address for ``bench.serve_load``);
leaving it stops every process it started. vLLM runs from the staged peer
(``bench.peers.vllm.peer_env``) on the same weights as Tandem (``bench.peers.vllm.model_dir``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from bench.peers.vllm import ROOT, VLLM_ENGINES, model_dir, peer_env
from rpc.gateway_client import GatewayAccess

# tandem-split: the gateway runs each round (Draft, then Verify); tandem-split-direct: the verifier calls the
# drafter itself and runs the rounds (tandem serve --direct-draft)
TANDEM_SERVERS = ("tandem-colocated", "tandem-split", "tandem-split-direct")
SERVERS = TANDEM_SERVERS + tuple(VLLM_ENGINES)


@dataclass(frozen=True)
class Served:
    name: str
    protocol: str     # bench.serve_load.REQUEST key
    address: str
    model_name: str = "model"
    gateway: GatewayAccess | None = None  # Tandem: how to reach its gateway (TLS, API key)
    counters: Callable[[], dict[str, float]] | None = None  # Tandem: its verifier's round counters now
    tracing: bool = False  # Tandem: its services export spans (to a receiver of the bench's own)

    def counters_during(self, before: dict[str, float]) -> dict[str, float]:
        """The counters gained since ``before`` (a ``counters()`` reading): the verifier's rows by reason
        (``rows.<reason>``), fused rounds (``fused.run``, ``fused.launched_ahead``, ``fused.dropped``, ``fused.compacted``), the engine
        thread's seconds by phase (``serve_s.round``, ``serve_s.between``, ``serve_s.idle``) and rounds run
        (``serve_rounds.run``); each service process's CPU seconds (``cpu_s.<service>``); spans received
        (``spans``, tracing on). Derived: the mean rows a round ran (``rows_per_round``), the mean batch over the
        rounds' time (``batch_mean``), the gateway's CPU per round (``gateway_cpu_ms_per_round``) and a finished
        request's mean time in the engine by phase (``engine_ms.queued``, ``.first``, ``.life``: serving.Lifetimes)."""
        if self.counters is None:
            return {}
        gained = {key: round(value - before.get(key, 0.0), 4) for key, value in self.counters().items()
                  if value - before.get(key, 0.0)}
        rounds = gained.get("serve_rounds.run")
        if rounds:  # how full the rounds ran: what a served load's tokens/s follows (in process: the batch size)
            gained["rows_per_round"] = round(sum(v for k, v in gained.items() if k.startswith("rows.")) / rounds, 2)
            gateway = sum(v for k, v in gained.items() if k.startswith("cpu_s.gateway"))  # every gateway process
            gained["gateway_cpu_ms_per_round"] = round(1e3 * gateway / rounds, 4)
        if gained.get("serve_s.round"):  # the batch's mean over the rounds' time (rows_per_round weighs each round 1)
            gained["batch_mean"] = round(gained.get("serve_row_s", 0.0) / gained["serve_s.round"], 2)
        done = gained.get("serve_requests.finished")
        for phase in ("queued", "first", "life") if done else ():  # a request's mean time in the engine
            gained[f"engine_ms.{phase}"] = round(1e3 * gained.get(f"serve_request_s.{phase}", 0.0) / done, 3)
        return gained


@dataclass(frozen=True)
class ServerOptions:
    model: str | None
    draft: str
    k: int
    max_batch: int
    device: str | None = None
    drafter_device: str | None = None  # Tandem's split stacks: the drafter's own device (default: device)
    dtype: str | None = None
    attention: str = "auto"      # Tandem's services (TANDEM_ATTENTION)
    tracing: bool = False        # Tandem's services export their spans over OTLP (to a receiver the bench runs)
    gateways: int = 1            # Tandem's gateway processes (sharing its port)
    max_model_len: int = 4096
    work: Path = Path("/tmp/tandem-bench-serve")


@contextmanager
def start(name: str, opts: ServerOptions) -> Iterator[Served]:
    if name not in SERVERS:
        raise ValueError(f"servers: unknown {name!r} (choose from {', '.join(SERVERS)})")
    with (_tandem(name, opts) if name in TANDEM_SERVERS else _vllm(name, opts)) as served:
        yield served


@contextmanager
def _tandem(name: str, opts: ServerOptions) -> Iterator[Served]:
    from rpc.ports import free_block
    from rpc.stack import Stack, StackConfig

    from bench.otlp_receiver import OtlpReceiver

    with contextlib.ExitStack() as cleanup:
        env = {"TANDEM_ATTENTION": opts.attention}
        receiver = None
        if opts.tracing:  # every span of every service, as to a collector (each round's one spec.round among them)
            receiver = cleanup.enter_context(OtlpReceiver())
            env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_TRACES_EXPORTER="otlp")
        cfg = StackConfig(colocated=name == "tandem-colocated", gateways=opts.gateways,
                          direct_draft=name == "tandem-split-direct", draft=opts.draft, k=opts.k,
                          model=opts.model, device=opts.device, dtype=opts.dtype,
                          drafter_device=None if name == "tandem-colocated" else opts.drafter_device,
                          extra_env=env, gateway_flags={"max_batch_size": opts.max_batch})
        cfg = dataclasses.replace(cfg, port=free_block(cfg.block), metrics_port=free_block(cfg.block))
        stack = Stack(cfg)
        stack.start()
        cleanup.callback(stack.stop)
        stack.wait_ready()

        def counters() -> dict[str, float]:
            # first the spans the exporters still hold: sending them is part of the load's CPU
            spans = {} if receiver is None else {"spans": float(_settled(receiver))}
            return {**_round_counters(stack.metrics("verifier")), **_cpu_seconds(stack), **spans}

        yield Served(name, "grpc", stack.gateway_address, gateway=stack.gateway, counters=counters,
                     tracing=opts.tracing)


_COUNTERS = {"tandem_verifier_rows_total": "rows", "tandem_verifier_fused_rounds_total": "fused",
             "tandem_verifier_serve_seconds": "serve_s", "tandem_verifier_serve_rounds_total": "serve_rounds",
             "tandem_verifier_serve_requests_total": "serve_requests",
             "tandem_verifier_serve_request_seconds": "serve_request_s"}
_PLAIN = {"tandem_verifier_serve_row_seconds": "serve_row_s"}  # no label


def _round_counters(metrics: dict[str, float]) -> dict[str, float]:
    """``{'tandem_verifier_rows_total{reason="prefill"}': 3.0, ...}`` as ``{'rows.prefill': 3.0, ...}``."""
    out = {}
    for key, value in metrics.items():
        name, _, label = key.partition("{")
        if name in _PLAIN:
            out[_PLAIN[name]] = value
        elif name in _COUNTERS:
            out[_COUNTERS[name] + "." + label.split('"')[1]] = value
    return out


def _settled(receiver) -> int:
    """Spans received once the services' exporters have sent what they held when asked: a batch goes out every
    OTEL_BSP_SCHEDULE_DELAY ms (5,000 by default), so one whole period later (the services' periodic spans, health
    checks among them, keep coming: the count never stops growing)."""
    time.sleep(float(os.environ.get("OTEL_BSP_SCHEDULE_DELAY", "5000")) / 1e3 + 0.5)
    return len(receiver.spans)


def _cpu_seconds(stack) -> dict[str, float]:
    """Each service process's CPU time so far with that of the processes it started (the verifier's engine process),
    user + system from Linux /proc, as ``cpu_s.<service>``."""
    out = {}
    for name, proc in stack.procs.items():
        pids = [proc.pid, *_children(proc.pid)]
        seconds = [_cpu(pid) for pid in pids]
        if seconds[0] is not None:  # else gone, or not Linux
            out[f"cpu_s.{name}"] = sum(s for s in seconds if s is not None)
    return out


def _cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


@contextmanager
def _vllm(name: str, opts: ServerOptions) -> Iterator[Served]:
    from rpc.ports import free_block

    from engine.assets import default_model_path

    directory, load_format = model_dir(opts.model or str(default_model_path()), opts.work)
    port = free_block(1)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(directory),
           "--served-model-name", "model", "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
           "--load-format", load_format, "--max-num-seqs", str(opts.max_batch), "--max-model-len",
           str(opts.max_model_len), "--gpu-memory-utilization", "0.5", "--no-enable-prefix-caching"]
    method = VLLM_ENGINES[name]
    if method != "none":
        cmd += ["--speculative-config", json.dumps({"method": method, "num_speculative_tokens": opts.k,
                                                    "prompt_lookup_min": 1, "prompt_lookup_max": 4})]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=peer_env(), start_new_session=True)
    try:
        _wait_http(proc, f"http://127.0.0.1:{port}/health", timeout_s=900)
        yield Served(name, "openai", f"127.0.0.1:{port}")
    finally:
        _stop(proc)


def _wait_http(proc: subprocess.Popen, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"servers: {' '.join(proc.args[:3])} exited with code {proc.returncode} while starting")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"servers: {url} did not answer within {timeout_s:.0f} s")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
