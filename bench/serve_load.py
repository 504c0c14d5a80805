"""A serving load whose client is not the bottleneck: separate client processes, streaming calls.

The shape of vLLM's ``benchmark_serving``: prompts (token ids) are sent either at a fixed
concurrency (each stream sends its next prompt when its last one ends) or as a Poisson
process at ``rate`` requests/s; every request streams, and each response chunk is
timestamped with the number of tokens in it. Two protocols speak to the two kinds of server:
``grpc`` (Tandem's gateway: ``Gateway.Generate`` with a token-id prompt) and ``openai``
(``/v1/completions`` with ``stream`` and ``return_token_ids``, as vLLM's server answers it).

The clients are ``processes`` spawned processes, each running its share of the streams, gRPC ones as
tasks of one event loop (grpc.aio) over a connection each (up to ``CONNECTIONS`` a process, as separate
clients would have them), HTTP ones on threads; their CPU time is measured, so a report can show the
client had room to spare.
Timestamps are ``time.monotonic()``, one clock for every process on the machine.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import random
import resource
import threading
import time
from queue import Empty
from dataclasses import dataclass, field

from bench.timing import percentile
from rpc.gateway_client import GatewayAccess


@dataclass(frozen=True)
class Load:
    protocol: str                  # "grpc" or "openai"
    address: str                   # host:port
    max_tokens: int
    temperature: float = 0.0
    concurrency: int = 1           # streams at once (rate is None)
    rate: float | None = None      # Poisson arrivals, requests/s (None: fixed concurrency)
    processes: int = 2
    seed: int = 0
    timeout_s: float = 600.0
    model_name: str = "model"      # openai: the served model's name
    gateway: GatewayAccess | None = None  # grpc: the gateway's TLS and API key (None: plaintext, no key, at address)


@dataclass
class Result:
    index: int
    sent: float
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (monotonic time, tokens in it)
    acceptance_length: float | None = None
    error: str | None = None


# ---- one request per protocol -------------------------------------------------------------------------------

def _generate_request(load: Load, prompt: list[int], index: int):
    from protos.tandem.v1 import gateway_pb2
    from rpc import tensors

    req = gateway_pb2.GenerateRequest(token_ids=tensors.encode(prompt, "int32"))
    req.sampling.max_tokens = load.max_tokens
    req.sampling.ignore_eos = True
    req.sampling.temperature = load.temperature
    if load.temperature > 0:
        req.sampling.seed = load.seed + index
    return req


def _grpc_response(res: Result, resp) -> None:
    n = resp.token_ids.shape[0] if resp.token_ids.shape else 0
    if n:
        res.chunks.append((time.monotonic(), n))
    if resp.HasField("usage") and resp.usage.rounds:
        res.acceptance_length = resp.usage.acceptance_length


async def _grpc_request(load: Load, req, index: int, stub) -> Result:
    """One Generate stream of a request built before the load started, on the process's event loop (grpc.aio: no
    thread per stream, no GIL hand-offs per message; what lets a few client processes keep up with tens of
    thousands of tokens/s)."""
    import grpc

    res = Result(index, time.monotonic())
    try:
        metadata = load.gateway.metadata if load.gateway is not None else ()
        async for resp in stub.Generate(req, timeout=load.timeout_s, metadata=metadata):
            _grpc_response(res, resp)
    except grpc.RpcError as exc:
        res.error = f"{exc.code().name}: {exc.details()}"
    return res


def _openai_request(load: Load, prompt: list[int], index: int, _channel) -> Result:
    import http.client

    host, port = load.address.rsplit(":", 1)
    body = {"model": load.model_name, "prompt": prompt, "max_tokens": load.max_tokens, "min_tokens": load.max_tokens,
            "ignore_eos": True, "temperature": load.temperature, "stream": True, "return_token_ids": True}
    res = Result(index, time.monotonic())
    conn = http.client.HTTPConnection(host, int(port), timeout=load.timeout_s)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            res.error = f"HTTP {resp.status}: {resp.read(300).decode(errors='replace')}"
            return res
        while line := resp.readline():
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or []
            n = sum(len(c.get("token_ids") or ()) for c in choices)
            if n:
                res.chunks.append((time.monotonic(), n))
    except (OSError, http.client.HTTPException, ValueError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return res


REQUEST = {"openai": _openai_request}  # on threads; grpc streams run on an event loop (_grpc_streams)
CONNECTIONS = 16  # a client process's gRPC connections at most (its streams share them round-robin)


# ---- client processes ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Gate:
    """Every client process starts sending at one moment, once all of them are connected: a process that came up
    late would otherwise leave the load short of its concurrency at the start (and alone at the end)."""

    ready: object   # multiprocessing Queue: one item per process ready to send
    go: object      # multiprocessing Event: set once every process is ready
    start: object   # multiprocessing Value('d'): the monotonic time the load starts at, set before ``go``

    def wait(self) -> float:
        """This process is ready; block until every one is -> the start time."""
        self.ready.put(1)
        self.go.wait()
        return self.start.value


def _client(load: Load, prompts: list[list[int]], mine: list[int], gate: _Gate, offsets: list[float] | None,
            streams: int, out) -> None:
    """One client process: its requests ``mine`` on ``streams`` concurrent streams (fixed concurrency), or each at
    its Poisson offset from the start; grpc on one event loop, openai on threads."""
    queue = list(mine)
    width = streams if offsets is None else len(mine)
    if load.protocol == "grpc":
        import asyncio

        results, cpu = asyncio.run(_grpc_streams(load, prompts, queue, gate, offsets, width))
    else:
        results, cpu = _threads(load, prompts, queue, gate, offsets, width)
    out.put(([vars(r) for r in results], cpu))


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _grpc_streams(load: Load, prompts: list[list[int]], queue: list[int], gate: _Gate,
                        offsets: list[float] | None, width: int) -> tuple[list[Result], float]:
    import asyncio

    from protos.tandem.v1 import gateway_pb2_grpc

    gateway = load.gateway or GatewayAccess(load.address)
    results: list[Result] = []
    # every request built (and what that imports, loaded) before the gate: the timed region only sends
    requests = {i: _generate_request(load, prompts[i], i) for i in queue}
    # a connection per stream, as separate clients have (up to CONNECTIONS a process): where several gateway
    # processes share the port, the kernel spreads connections, not streams, over them
    options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.use_local_subchannel_pool", 1)]
    async with contextlib.AsyncExitStack() as channels:
        stubs = []
        for _ in range(max(1, min(width, CONNECTIONS))):
            channel = await channels.enter_async_context(gateway.channel(options=options))
            await channel.channel_ready()
            stubs.append(gateway_pb2_grpc.GatewayStub(channel))

        start_at = await asyncio.to_thread(gate.wait)  # every process connected (the loop goes on serving gRPC)

        async def stream(stub) -> None:
            while queue:
                i = queue.pop(0)
                if offsets is not None:
                    await asyncio.sleep(max(0.0, start_at + offsets[i] - time.monotonic()))
                results.append(await _grpc_request(load, requests[i], i, stub))

        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        before = _cpu_s()  # the CPU of the run itself, not of imports and connecting
        await asyncio.gather(*(stream(stubs[j % len(stubs)]) for j in range(width)))
        return results, _cpu_s() - before


def _threads(load: Load, prompts: list[list[int]], queue: list[int], gate: _Gate, offsets: list[float] | None,
             width: int) -> tuple[list[Result], float]:
    results, lock = [], threading.Lock()
    start_at = gate.wait()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                i = queue.pop(0)
            if offsets is not None:
                time.sleep(max(0.0, start_at + offsets[i] - time.monotonic()))
            r = REQUEST[load.protocol](load, prompts[i], i, None)
            with lock:
                results.append(r)

    while time.monotonic() < start_at:
        time.sleep(0.001)
    before = _cpu_s()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(width)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, _cpu_s() - before


def run_load(load: Load, prompts: list[list[int]]) -> dict:
    """Send every prompt once under ``load``; the summary row (tokens/s, TTFT, ITL, acceptance, client CPU)."""
    n = len(prompts)
    procs = max(1, min(load.processes, n, load.concurrency if load.rate is None else n))
    offsets = None
    if load.rate is not None:
        rng = random.Random(load.seed)
        offsets, t = [], 0.0
        for _ in range(n):
            offsets.append(t)
            t += rng.expovariate(load.rate)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    gate = _Gate(ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0))
    workers = []
    for p in range(procs):
        mine = list(range(p, n, procs))
        streams = load.concurrency // procs + (p < load.concurrency % procs)
        workers.append(ctx.Process(target=_client, args=(load, prompts, mine, gate, offsets, streams, out)))
    for w in workers:
        w.start()
    for _ in workers:  # every client started and connected before the first send
        try:
            gate.ready.get(timeout=120)
        except Empty:
            for w in workers:
                w.kill()
            raise RuntimeError("bench: a load client process did not come up in 120 s") from None
    gate.start.value = time.monotonic() + 0.05
    gate.go.set()
    results, cpu_s = [], 0.0
    for _ in workers:
        rs, cpu = out.get()
        results += [Result(**r) for r in rs]
        cpu_s += cpu
    for w in workers:
        w.join()
    return summarize(load, results, cpu_s, procs)


def summarize(load: Load, results: list[Result], cpu_s: float, procs: int) -> dict:
    ok = [r for r in results if r.error is None and r.chunks]
    ttft, itl, latency = [], [], []
    for r in ok:
        ttft.append(r.chunks[0][0] - r.sent)
        latency.append(r.chunks[-1][0] - r.sent)
        for (t0, _), (t1, n) in zip(r.chunks, r.chunks[1:]):
            itl.extend([(t1 - t0) / n] * n)
    tokens = sum(n for r in ok for _, n in r.chunks)
    begin = min((r.sent for r in results), default=0.0)
    end = max((r.chunks[-1][0] for r in ok), default=begin)
    wall = max(end - begin, 1e-9)
    acc = [r.acceptance_length for r in ok if r.acceptance_length]
    ms = lambda xs, q: None if not xs else round(percentile(xs, q) * 1e3, 3)  # noqa: E731
    mean_ms = lambda xs: None if not xs else round(sum(xs) / len(xs) * 1e3, 3)  # noqa: E731
    return {"protocol": load.protocol, "concurrency": None if load.rate else load.concurrency, "rate": load.rate,
            "temperature": load.temperature, "max_tokens": load.max_tokens, "requests": len(results),
            "completed": len(ok), "errors": sorted({r.error for r in results if r.error})[:5],
            "output_tokens": tokens, "elapsed_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2),
            "requests_per_s": round(len(ok) / wall, 3), "ttft_ms_p50": ms(ttft, 50), "ttft_ms_p99": ms(ttft, 99),
            "itl_ms_p50": ms(itl, 50), "itl_ms_p99": ms(itl, 99),
            # means: what a closed loop's throughput follows (concurrency / mean latency requests a second)
            "ttft_ms_mean": mean_ms(ttft), "itl_ms_mean": mean_ms(itl), "latency_ms_mean": mean_ms(latency),
            # the requests in flight on average over the run (at most the concurrency: less while it ramps and drains)
            "in_flight_mean": round(sum(latency) / wall, 2),
            "acceptance_length": round(sum(acc) / len(acc), 3) if acc else None,
            "client_processes": procs, "client_cpu_s": round(cpu_s, 2),
            # of the client processes' available CPU over the run: near 100% would mean the client limits the number
            "client_cpu_pct": round(100 * cpu_s / (wall * procs), 1)}
