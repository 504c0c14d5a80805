"""The whole stack on one machine as separate processes: gateway, verifier and (split mode) drafter.

With ``verifiers``/``drafters`` > 1 each runs several replicas (processes ``verifier``,
``verifier-1``, ..., ``drafter``, ``drafter-1``, ...) on consecutive ports, and the gateway is
given all their addresses.

The processes cannot outlive the stack's process or be confused with another stack's: each holds
the read end of the stack's lifeline (``rpc.lifetime.watch_parent``), so they stop when this
process ends however it ends; and ``start`` refuses ports that something already listens on.

Secure by default: the verifiers and drafters listen on 127.0.0.1 only, and speak mutual TLS with
credentials the stack makes for itself on start (``rpc.local_credentials``: a throwaway CA in a private
temporary directory, removed on stop), so a local process that does not hold them is refused. The
gateway listens on ``host`` (127.0.0.1 by default: this machine's processes, no API key); beyond
loopback it needs an API key, a generated one (``api_key``) unless a keys file is given. ``insecure``
is plaintext everywhere. Callers reach the services with ``channel(name)`` / ``blocking_channel(name)``
and the gateway with ``gateway`` (a ``GatewayAccess``: address, TLS, key).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from rpc.gateway_client import GatewayAccess
from rpc.lifetime import LIFELINE_FD
from rpc.ports import port_in_use
from rpc.stack_config import INTERNAL_HOST, StackConfig

if TYPE_CHECKING:
    from rpc.local_credentials import LocalCredentials

def _flags(**values) -> list[str]:
    out = []
    for name, value in values.items():
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        out += [flag] if value is True else ["--no-" + flag[2:]] if value is False else [flag, str(value)]
    return out


class Stack:
    """Start, health-check and stop the service processes; ``log_dir``: each one's output goes to ``NAME.log``
    there instead of this process's stdout and stderr."""

    def __init__(self, cfg: StackConfig, log_dir: Path | None = None) -> None:
        self.cfg = cfg
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self._lifeline: tuple[int, int] | None = None  # (read, write): the children inherit only the read end
        self.credentials: LocalCredentials | None = None  # made by start (make_credentials), removed by stop

    @property
    def gateway_address(self) -> str:
        return f"localhost:{self.cfg.port}"

    @property
    def api_key(self) -> str | None:
        """The API key the stack made for its gateway (it listens beyond loopback and was given no keys file)."""
        return self.credentials.api_key if self.credentials is not None else None

    @property
    def gateway(self) -> GatewayAccess:
        """How this machine reaches the stack's gateway: its address, TLS, and the key the stack made or else the
        first of its keys file (the stack's own calls: the demo, the benches)."""
        c = self.cfg
        key = self.api_key
        if key is None and c.api_keys_file:
            from rpc.auth import ApiKeys

            key = ApiKeys.first(c.api_keys_file)
        tls = c.api_tls_cert_file is not None
        server_name = None
        if tls:
            from rpc.tls import certificate_names

            server_name = next(iter(certificate_names(Path(c.api_tls_cert_file).read_bytes())), None)
        ca_file = (c.api_tls_ca_file or c.api_tls_cert_file) if tls else None
        return GatewayAccess(self.gateway_address, key, tls, ca_file, server_name)

    def names(self) -> list[str]:
        """The stack's processes: verifiers, drafters (split mode), the gateway (and its other processes)."""
        return [*self.cfg.names("verifier"), *self.cfg.names("drafter"), *self.cfg.names("gateway")]

    def make_credentials(self) -> LocalCredentials | None:
        """The stack's credentials, made the first time (``stop`` removes them); None where ``insecure``."""
        from rpc.local_credentials import LocalCredentials  # cryptography: only once a stack runs
        from rpc.tls import is_loopback

        c = self.cfg
        if not c.insecure and self.credentials is None:
            self.credentials = LocalCredentials.make(api_key=not c.api_keys_file and not is_loopback(c.host))
        return self.credentials

    def _security(self, name: str) -> dict[str, object]:
        """A process's TLS flags (and the gateway's client side)."""
        c = self.cfg
        credentials = self.make_credentials()
        out: dict[str, object] = {"insecure": True} if credentials is None else dict(credentials.flags(name))
        if name != "gateway":
            return {"host": INTERNAL_HOST, **out}
        keys = c.api_keys_file or (credentials.api_keys_file if credentials is not None else None)
        return {"host": c.host, **out, "api_keys_file": keys, "api_tls_cert_file": c.api_tls_cert_file,
                "api_tls_key_file": c.api_tls_key_file}

    def commands(self) -> dict[str, list[str]]:
        """Each process's command line (its TLS flags name the stack's credentials, made here if not yet)."""
        c = self.cfg
        base = [sys.executable, "-m", "cli.main"]
        engine = dict(model=c.model, device=c.device, dtype=c.dtype, k=c.k, max_k=c.max_k,
                      kv_cache_tokens=c.kv_cache_tokens)
        ports, mports = c.ports, c.metrics_ports
        cmds = {}
        drafters = c.names("drafter")
        for i, name in enumerate(c.names("verifier")):
            direct = f"localhost:{ports[drafters[i % len(drafters)]]}" if c.direct_draft and drafters else None
            cmds[name] = base + ["verifier"] + _flags(verifier_port=ports[name],
                                                      draft=c.draft if c.colocated else "none",
                                                      direct_drafter_address=direct,
                                                      metrics_port=mports.get(name), **engine,
                                                      **self._security(name))
        for name in c.names("drafter"):
            own = {**engine, "device": c.drafter_device or c.device}
            cmds[name] = base + ["drafter"] + _flags(drafter_port=ports[name], draft=c.draft,
                                                     metrics_port=mports.get(name), **own, **self._security(name))
        shared = c.gateways > 1
        for name in c.names("gateway"):
            cmds[name] = base + ["gateway"] + _flags(**{
                "gateway_port": c.port, "reuse_port": True if shared else None,
                "health_port": c.health_ports.get(name),
                "verifier_address": ",".join(f"localhost:{ports[n]}" for n in c.names("verifier")),
                "drafter_address": ",".join(f"localhost:{ports[n]}" for n in c.names("drafter") or ["drafter"]),
                "colocated": c.colocated or c.direct_draft, "model": c.model, "k": c.k, "max_k": c.max_k,
                "metrics_port": mports.get(name), **self._security("gateway"), **c.gateway_flags})
        return cmds

    def ports_in_use(self) -> list[str]:
        """The stack's ports (gRPC and metrics) that something already listens on, as "PORT (NAME)"."""
        names = self.names()
        wanted = sorted({(port, name.partition("-")[0] if name.startswith("gateway") else name)
                         for name, port in self.cfg.ports.items() if name in names})
        wanted += [(port, f"{name} metrics") for name, port in self.cfg.metrics_ports.items() if name in names]
        wanted += [(port, f"{name} health") for name, port in self.cfg.health_ports.items()]
        return [f"{port} ({name})" for port, name in sorted(wanted) if port_in_use(port)]

    def start(self) -> None:
        """Make the stack's credentials and start every service; a port already in use is a ValueError naming it,
        before anything starts."""
        busy = self.ports_in_use()
        if busy:
            raise ValueError(f"port: already in use: {', '.join(busy)}. Another tandem serve may be running; stop it "
                             f"or choose other ports (--port)")
        self.make_credentials()
        for name in self.names():
            self.start_one(name)

    def start_one(self, name: str) -> None:
        if self._lifeline is None:
            self._lifeline = os.pipe()  # both ends close-on-exec; pass_fds below hands on the read end alone
        read = self._lifeline[0]
        env = {**os.environ, **self.cfg.extra_env, LIFELINE_FD: str(read)}
        out = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_path(name), "ab")
        try:
            # a session of its own: a Ctrl-C in the terminal reaches this process, which stops the services in order
            self.procs[name] = subprocess.Popen(self.commands()[name], env=env, start_new_session=True,
                                                pass_fds=(read,), stdout=out, stderr=subprocess.STDOUT if out else None)
        finally:
            if out is not None:
                out.close()

    def log_path(self, name: str) -> Path | None:
        return None if self.log_dir is None else self.log_dir / f"{name}.log"

    def wait_ready(self, timeout_s: float = 600.0, stop: Callable[[], bool] = lambda: False) -> bool:
        """Wait until every service reports SERVING (True), or until ``stop()`` says to give up (False). A service
        that exits meanwhile is a RuntimeError, one still not SERVING after ``timeout_s`` a TimeoutError."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout_s
        for name in sorted(self.procs, key=lambda n: n.startswith("gateway")):  # the gateways wait for the others
            health = self.cfg.health_ports.get(name)  # one of several gateway processes: its own health port
            with (grpc.insecure_channel(f"localhost:{health}") if health else self.blocking_channel(name)) as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                while True:
                    if stop():
                        return False
                    for other, proc in self.procs.items():  # any of them: a verifier waits for its drafter
                        if proc.poll() is not None:
                            log = self.log_path(other)
                            raise RuntimeError(f"{other} exited with code {proc.returncode} while starting"
                                               + (f"; its log: {log}" if log else ""))
                    try:
                        if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                                health_pb2.HealthCheckResponse.SERVING:
                            break
                    except grpc.RpcError:
                        pass
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{name} did not become SERVING within {timeout_s:.0f} s")
                    time.sleep(0.25)
        return True

    def _internal(self, name: str) -> tuple[str, object | None]:
        """A verifier's or drafter's address and the credentials of the stack's own calls (None: plaintext)."""
        address = f"localhost:{self.cfg.ports[name]}"
        if self.credentials is None:
            return address, None
        return address, self.credentials.identity().channel_credentials()

    def channel(self, name: str, options: list | None = None):
        """A grpc.aio channel to one of the stack's processes ("gateway", "verifier", "drafter-1", ...), holding
        what it takes: mutual TLS with the stack's credentials for a verifier or drafter, ``gateway`` for the
        gateway (whose API key, if any, goes with each call: ``stack.gateway.metadata``)."""
        import grpc

        if name == "gateway":
            return self.gateway.channel(options)
        address, credentials = self._internal(name)
        if credentials is None:
            return grpc.aio.insecure_channel(address, options=options)
        return grpc.aio.secure_channel(address, credentials, options=options)

    def blocking_channel(self, name: str, options: list | None = None):
        """As ``channel``, a blocking grpc channel."""
        import grpc

        if name == "gateway":
            return self.gateway.blocking_channel(options)
        address, credentials = self._internal(name)
        if credentials is None:
            return grpc.insecure_channel(address, options=options)
        return grpc.secure_channel(address, credentials, options=options)

    def metrics(self, service: str) -> dict[str, float]:
        """Scrape a service process's Prometheus endpoint (needs cfg.metrics_port), e.g. "verifier-1"."""
        from rpc.metrics import scrape

        return scrape(self.cfg.metrics_ports[service])

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[name]
        if p.poll() is None:
            os.killpg(p.pid, sig)
            p.wait()

    def stop(self, timeout_s: float = 15.0) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if self._lifeline is not None:
            for fd in self._lifeline:
                os.close(fd)
            self._lifeline = None
        if self.credentials is not None:
            self.credentials.remove()
            self.credentials = None
