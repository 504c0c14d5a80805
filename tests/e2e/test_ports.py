"""A port something already listens on is an error that names it, for a service and for `tandem serve`; never a
port shared with another process (gRPC's SO_REUSEPORT would let a second server bind it and split the traffic)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from rpc.ports import free_block


def tandem(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=timeout)


def _listener(port: int, reuse_port: bool) -> socket.socket:
    s = socket.socket()
    if reuse_port:  # as a gRPC server binds by default: a second one that also sets it would share the port
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("0.0.0.0", port))
    s.listen()
    return s


def test_a_service_refuses_a_port_another_server_shares_out():
    port = free_block(2)
    with _listener(port, reuse_port=True):
        t0 = time.monotonic()
        proc = tandem("gateway", "--gateway-port", str(port), "--verifier-address", f"localhost:{port + 1}",
                      "--insecure")
    assert proc.returncode == 2, proc.stderr
    assert f"port {port} is already in use" in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 60  # it fails at once, not after waiting for its verifier


def test_serve_refuses_busy_ports_before_starting_anything():
    port = free_block(3)
    with _listener(port + 1, reuse_port=False):
        t0 = time.monotonic()
        proc = tandem("serve", "--port", str(port), "--device", "cpu")
    assert proc.returncode == 2, proc.stderr
    assert f"already in use: {port + 1} (verifier)" in proc.stderr
    assert "starting" not in proc.stdout  # no service was started
    assert time.monotonic() - t0 < 30
