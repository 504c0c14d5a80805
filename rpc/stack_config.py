"""A stack's shape (``StackConfig``): which services run, how many of each, with what, and where each listens: its
gRPC, metrics and health ports laid out from the gateway's port (``rpc.stack.Stack`` runs it)."""

from __future__ import annotations

from dataclasses import dataclass, field

# where the verifiers and drafters of a stack listen, whatever the gateway's host
INTERNAL_HOST = "127.0.0.1"


@dataclass
class StackConfig:
    port: int = 50051                # the gateway's
    verifier_port: int | None = None  # default port + 1 (replica i: + i)
    drafter_port: int | None = None   # default after the verifiers' (port + 2 with one verifier)
    colocated: bool = False
    direct_draft: bool = False        # split mode: each verifier calls its drafter and runs the rounds (Serve)
    draft: str = "auto"
    model: str | None = None
    device: str | None = None
    drafter_device: str | None = None  # the drafters' (default: device), e.g. cuda:1 for a GPU of their own
    dtype: str | None = None
    k: int | None = None
    max_k: int | None = None
    kv_cache_tokens: int | None = None
    metrics_port: int | None = None  # gateway; then the verifiers', then the drafters' (verifier +1, drafter +2)
    extra_env: dict[str, str] = field(default_factory=dict)
    gateway_flags: dict[str, object] = field(default_factory=dict)
    verifiers: int = 1               # replicas
    drafters: int = 1                # replicas (split mode)
    gateways: int = 1                # processes sharing the gateway's port (SO_REUSEPORT: the kernel spreads the
                                     # client connections over them), each with a Serve stream to every verifier
    host: str = INTERNAL_HOST        # the gateway's; beyond loopback it needs API keys (one is made, see Stack)
    insecure: bool = False           # plaintext between the services and no credentials made
    api_keys_file: str | None = None  # the gateway's client API keys (rpc/auth.py)
    api_tls_cert_file: str | None = None  # the gateway's client-facing TLS
    api_tls_key_file: str | None = None
    api_tls_ca_file: str | None = None    # what the stack checks that certificate against (default: the file itself)

    def names(self, service: str) -> list[str]:
        n = {"verifier": self.verifiers, "gateway": self.gateways}.get(service, 0 if self.colocated else self.drafters)
        return [service if i == 0 else f"{service}-{i}" for i in range(n)]

    def _offsets(self) -> dict[str, int]:
        """Each service process's place after the gateway's port (and metrics port): the gateway, the verifiers,
        the drafters, the other gateway processes (their metrics ports; they share the gateway's gRPC port)."""
        out = {"gateway": 0}
        for i, name in enumerate(self.names("verifier")):
            out[name] = 1 + i
        drafters = self.names("drafter")
        for i, name in enumerate(drafters):
            out[name] = 1 + self.verifiers + i
        for i, name in enumerate(self.names("gateway")[1:]):
            out[name] = 1 + self.verifiers + len(drafters) + i
        return out

    @property
    def ports(self) -> dict[str, int]:
        out = {name: self.port + off for name, off in self._offsets().items()}
        out.setdefault("drafter", self.port + 1 + self.verifiers)
        for service, base in (("verifier", self.verifier_port), ("drafter", self.drafter_port)):
            if base is not None:
                out.update({name: base + i for i, name in enumerate(self.names(service) or [service])})
        out.update({name: self.port for name in self.names("gateway")})
        return out

    @property
    def health_ports(self) -> dict[str, int]:
        """With several gateway processes: each one's own plaintext grpc.health.v1 port (the shared port answers
        from whichever process the kernel picks), after every other port of the stack."""
        if self.gateways < 2:
            return {}
        first = self.port + len(self._offsets())
        return {name: first + i for i, name in enumerate(self.names("gateway"))}

    @property
    def block(self) -> int:
        """How many consecutive ports from ``port`` the stack takes (verifiers and drafters at their defaults)."""
        return len(self._offsets()) + len(self.health_ports)

    @property
    def metrics_ports(self) -> dict[str, int]:
        return {} if self.metrics_port is None else {n: self.metrics_port + o for n, o in self._offsets().items()}
