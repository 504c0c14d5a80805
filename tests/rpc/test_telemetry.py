"""Tracing plumbing, checked against a real OTLP/gRPC receiver.

The trace test runs three processes: this one hosts the receiver, a grpc.aio echo server and a client
each run in their own subprocess with their own `setup_tracing`, and both export to the receiver. The
global tracer provider can be set once per process, so nothing here installs one in pytest's process.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from rpc.interceptors import (
    DeadlineClientInterceptor,
    TracingClientInterceptor,
    TracingServerInterceptor,
    channel_interceptors,
)
from rpc.telemetry import exporters_from_env, resource_from_env
from bench.otlp_receiver import OtlpReceiver, ReceivedSpan

ROOT = Path(__file__).resolve().parents[2]

# A grpc.aio server with tracing: prints its port, serves until SIGTERM, then flushes its spans.
ECHO_SERVER = textwrap.dedent('''
    import asyncio, signal, sys
    import grpc
    from rpc.interceptors import TracingServerInterceptor
    from rpc.telemetry import setup_tracing, shutdown_tracing, tracer

    work = tracer("test.echo")

    async def unary(request, context):
        tenant = dict(context.invocation_metadata()).get("x-tenant", "")
        with work.start_as_current_span("echo.work", attributes={"tenant": tenant}):
            await asyncio.sleep(0.01)
        return request

    async def count(request, context):
        for i in range(int(request)):
            with work.start_as_current_span("echo.chunk", attributes={"index": i}):
                await asyncio.sleep(0.1)
            yield str(i).encode()

    async def fail(request, context):
        await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")

    async def main():
        assert setup_tracing("echo-server-default") is not None
        server = grpc.aio.server(interceptors=[TracingServerInterceptor()])
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("tandem.test.Echo", {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Count": grpc.unary_stream_rpc_method_handler(count),
            "Fail": grpc.unary_unary_rpc_method_handler(fail)})])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print("PORT", port, flush=True)
        await stop.wait()
        await server.stop(1.0)

    try:
        asyncio.run(main())
    finally:
        shutdown_tracing()
''')

# The client: a parent span around a unary call, a stream and a failing call; prints what it saw as JSON.
ECHO_CLIENT = textwrap.dedent('''
    import asyncio, json, sys, time
    import grpc
    from opentelemetry import trace
    from rpc.interceptors import DeadlineClientInterceptor, TracingClientInterceptor, channel_interceptors
    from rpc.telemetry import setup_tracing, shutdown_tracing, tracer

    async def main(port):
        out = {}
        interceptors = channel_interceptors(DeadlineClientInterceptor(10.0), TracingClientInterceptor())
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", interceptors=interceptors) as channel:
            with tracer("test.client").start_as_current_span("test.parent") as parent:
                ctx = parent.get_span_context()
                out["trace_id"], out["parent_id"] = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
                out["reply"] = (await channel.unary_unary("/tandem.test.Echo/Unary")(
                    b"hello", metadata=(("x-tenant", "acme"),))).decode()
                out["stream_before_ns"] = time.time_ns()
                out["chunks"] = [c.decode() async for c in channel.unary_stream("/tandem.test.Echo/Count")(b"3")]
                out["stream_after_ns"] = time.time_ns()
                try:
                    await channel.unary_unary("/tandem.test.Echo/Fail")(b"")
                except grpc.aio.AioRpcError as err:
                    out["fail_code"] = err.code().name
            linked = trace.Link(ctx, {"why": "test"})
            with tracer("test.client").start_as_current_span(
                    "test.linked", links=[linked], attributes={"ints": [1, 2], "ratio": 0.5, "flag": True}):
                pass
        return out

    assert setup_tracing("test-client") is not None
    result = asyncio.run(main(int(sys.argv[1])))
    shutdown_tracing()
    print(json.dumps(result))
''')


def _env(**otel: str) -> dict[str, str]:
    """This process's environment without OTEL_* settings, plus `otel`, with the repo importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(otel)
    return env


def _start_server(script: Path, env: dict[str, str], timeout: float = 20.0) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("PORT "):
        proc.kill()
        raise AssertionError(f"echo server did not start: {line!r}\n{proc.communicate()[1]}")
    return proc, int(line.split()[1])


def _one(spans: list[ReceivedSpan], name: str, kind: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name and s.kind == kind]
    assert len(found) == 1, f"expected one {kind} {name!r}, got {found}"
    return found[0]


def test_trace_crosses_processes(tmp_path: Path) -> None:
    (tmp_path / "server.py").write_text(ECHO_SERVER)
    (tmp_path / "client.py").write_text(ECHO_CLIENT)
    with OtlpReceiver() as rx:
        server, port = _start_server(tmp_path / "server.py", _env(
            OTEL_EXPORTER_OTLP_ENDPOINT=rx.endpoint, OTEL_SERVICE_NAME="test-server"))
        try:
            client = subprocess.run([sys.executable, str(tmp_path / "client.py"), str(port)], env=_env(
                OTEL_EXPORTER_OTLP_ENDPOINT=rx.endpoint), capture_output=True, text=True, timeout=60)
            assert client.returncode == 0, client.stderr
        finally:
            server.send_signal(signal.SIGTERM)
            _, server_err = server.communicate(timeout=20)
        assert server.returncode == 0, server_err
        for stderr in (client.stderr, server_err):      # no export failures, no context detach errors
            assert "Traceback" not in stderr and "Failed to" not in stderr, stderr
        seen = json.loads(client.stdout.splitlines()[-1])
        assert seen["reply"] == "hello" and seen["chunks"] == ["0", "1", "2"] and seen["fail_code"] == "NOT_FOUND"

        # Both processes have exited: their spans must already be here (flushed at shutdown, well
        # before the 5 s batch delay), so the wait is short.
        spans = rx.wait_for(lambda got: sum(s.name == "echo.chunk" for s in got) == 3
                            and any(s.name == "test.linked" for s in got), timeout=3.0)

    trace_id = seen["trace_id"]
    parent = _one(spans, "test.parent", "INTERNAL")
    assert (parent.span_id, parent.parent_span_id, parent.service_name) == (seen["parent_id"], "", "test-client")

    for method, code in (("Unary", 0), ("Count", 0), ("Fail", 5)):
        name = f"tandem.test.Echo/{method}"
        client_span, server_span = _one(spans, name, "CLIENT"), _one(spans, name, "SERVER")
        assert client_span.parent_span_id == parent.span_id
        assert server_span.parent_span_id == client_span.span_id
        assert client_span.trace_id == server_span.trace_id == trace_id
        assert (client_span.service_name, server_span.service_name) == ("test-client", "test-server")
        for s in (client_span, server_span):
            assert s.attributes == {"rpc.system": "grpc", "rpc.service": "tandem.test.Echo",
                                    "rpc.method": method, "rpc.grpc.status_code": code}
            assert s.status_code == ("UNSET" if code == 0 else "ERROR")
    assert "no such thing" in _one(spans, "tandem.test.Echo/Fail", "SERVER").status_message

    # The servicer's own spans are children of the server span; metadata set by the caller survives.
    work = _one(spans, "echo.work", "INTERNAL")
    assert work.parent_span_id == _one(spans, "tandem.test.Echo/Unary", "SERVER").span_id
    assert (work.trace_id, work.service_name, work.attributes) == (trace_id, "test-server", {"tenant": "acme"})

    # The stream spans cover the whole stream: client ⊇ server ⊇ every chunk.
    stream_client = _one(spans, "tandem.test.Echo/Count", "CLIENT")
    stream_server = _one(spans, "tandem.test.Echo/Count", "SERVER")
    chunks = sorted((s for s in spans if s.name == "echo.chunk"), key=lambda s: s.attributes["index"])
    assert all(c.parent_span_id == stream_server.span_id and c.trace_id == trace_id for c in chunks)
    assert seen["stream_before_ns"] <= stream_client.start_ns <= stream_server.start_ns <= chunks[0].start_ns
    assert chunks[-1].end_ns <= stream_server.end_ns <= stream_client.end_ns <= seen["stream_after_ns"]
    assert stream_server.end_ns - stream_server.start_ns >= 0.3e9

    # The receiver decodes links and typed attributes.
    linked = _one(spans, "test.linked", "INTERNAL")
    assert linked.links == [(trace_id, parent.span_id)] and linked.parent_span_id == ""
    assert linked.attributes == {"ints": [1, 2], "ratio": 0.5, "flag": True}
    assert {s.trace_id for s in spans if s.name != "test.linked"} == {trace_id}


# The global provider can be set once per process: each scenario that installs one runs in its own.
SETUP_CHECKS = textwrap.dedent('''
    import json, os
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from rpc.telemetry import setup_tracing, shutdown_tracing, tracer

    out = {"off": setup_tracing("svc") is None,
           "off_global_is_sdk": isinstance(trace.get_tracer_provider(), TracerProvider)}
    os.environ["OTEL_TRACES_EXPORTER"] = "zipkin"
    try:
        setup_tracing("svc")
    except ValueError as err:
        out["unknown"] = str(err)
    os.environ["OTEL_TRACES_EXPORTER"] = "console"
    first, second = setup_tracing("svc"), setup_tracing("other")
    out["same_provider"] = first is second and trace.get_tracer_provider() is first
    out["service"] = first.resource.attributes["service.name"]
    with tracer("check").start_as_current_span("console.span"):
        pass
    shutdown_tracing()
    shutdown_tracing()
    print("RESULT", json.dumps(out), flush=True)
''')


def test_setup_tracing_in_fresh_processes(tmp_path: Path) -> None:
    (tmp_path / "checks.py").write_text(SETUP_CHECKS)
    run = subprocess.run([sys.executable, str(tmp_path / "checks.py")], env=_env(), capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "Overriding" not in run.stderr, run.stderr       # the provider was set once
    result = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["off"] and not result["off_global_is_sdk"]      # no endpoint: nothing installed
    assert "OTEL_TRACES_EXPORTER" in result["unknown"] and "zipkin" in result["unknown"]
    assert result["same_provider"] and result["service"] == "svc"
    # The console exporter printed the span once: the second setup_tracing added no processor.
    assert run.stdout.count('"name": "console.span"') == 1, run.stdout


def test_exporters_from_env() -> None:
    assert exporters_from_env({}) == []
    assert exporters_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4317"}) == ["otlp"]
    assert exporters_from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://jaeger:4317"}) == ["otlp"]
    assert exporters_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}) == []
    assert exporters_from_env({"OTEL_TRACES_EXPORTER": "console"}) == ["console"]
    assert exporters_from_env({"OTEL_TRACES_EXPORTER": "none",
                               "OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4317"}) == []
    assert exporters_from_env({"OTEL_TRACES_EXPORTER": "OTLP, console,otlp"}) == ["otlp", "console"]
    assert exporters_from_env({"OTEL_SDK_DISABLED": "true",
                               "OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4317"}) == []
    assert exporters_from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == ["otlp"]
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER"):
        exporters_from_env({"OTEL_TRACES_EXPORTER": "jaeger"})
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        exporters_from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})


def test_resource_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(var, raising=False)
    assert resource_from_env("tandem-verifier").attributes["service.name"] == "tandem-verifier"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci,service.name=from-attrs")
    attrs = resource_from_env("tandem-verifier").attributes
    assert (attrs["service.name"], attrs["deployment.environment"]) == ("tandem-verifier", "ci")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "verifier-b")
    attrs = resource_from_env("tandem-verifier").attributes
    assert (attrs["service.name"], attrs["deployment.environment"]) == ("verifier-b", "ci")


# ----------------------------------------------------------------------------------- deadlines, in-process


async def _sleep(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    await asyncio.sleep(float(request))
    return dict(context.invocation_metadata()).get("x-tenant", "").encode()


async def _ticks(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    for _ in range(int(request)):
        await asyncio.sleep(0.1)
        yield b"tick"


async def _with_echo_server(body: Callable[[grpc.aio.Channel], Awaitable[None]]) -> None:
    """Run `body(channel)` against an in-process traced server, through the client interceptors."""
    server = grpc.aio.server(interceptors=[TracingServerInterceptor()])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("tandem.test.Slow", {
        "Sleep": grpc.unary_unary_rpc_method_handler(_sleep),
        "Ticks": grpc.unary_stream_rpc_method_handler(_ticks)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        interceptors = channel_interceptors(DeadlineClientInterceptor(0.3), TracingClientInterceptor())
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", interceptors=interceptors) as channel:
            await body(channel)
    finally:
        await server.stop(None)


def test_default_deadline() -> None:
    async def body(channel: grpc.aio.Channel) -> None:
        sleep, ticks = channel.unary_unary("/tandem.test.Slow/Sleep"), channel.unary_stream("/tandem.test.Slow/Ticks")
        start = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await sleep(b"2.0")
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - start < 1.5
        # An explicit timeout wins; metadata passes the tracing interceptor (tracing is off here).
        assert await sleep(b"0.5", timeout=5.0, metadata=(("x-tenant", "acme"),)) == b"acme"
        # Streams get the default deadline too (channel_interceptors registers it for them).
        with pytest.raises(grpc.aio.AioRpcError) as err:
            _ = [t async for t in ticks(b"10")]
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert [t async for t in ticks(b"5", timeout=5.0)] == [b"tick"] * 5
        call = ticks(b"2", timeout=5.0)        # the call object keeps its read() API
        assert [await call.read(), await call.read(), await call.read()] == [b"tick", b"tick", grpc.aio.EOF]
        assert await call.code() == grpc.StatusCode.OK

    asyncio.run(_with_echo_server(body))


def test_channel_interceptors_splits_multi_kind() -> None:
    deadline, tracing = DeadlineClientInterceptor(1.0), TracingClientInterceptor()
    split = channel_interceptors(deadline, tracing)
    assert [type(i).__name__ for i in split] == ["_UnaryUnaryOnly", "_UnaryStreamOnly"] * 2
    assert [i.inner for i in split] == [deadline, deadline, tracing, tracing]
    with pytest.raises(ValueError):
        DeadlineClientInterceptor(0)
