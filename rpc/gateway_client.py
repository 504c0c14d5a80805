"""A client of the gateway's ``Generate``: how to reach the gateway (``GatewayAccess``: its address, TLS, API key)
and one streamed answer with its summary (``tandem client``, the demo, ``bench.services``)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class GatewayAccess:
    """Where the gateway is and what it takes: TLS (``tls``; ``ca_file`` the CA its certificate is checked against,
    else the system's roots; ``server_name`` the name checked, else the address's host) and an API key, sent as
    ``authorization: Bearer <key>`` with every call (``metadata``)."""

    address: str
    api_key: str | None = None
    tls: bool = False
    ca_file: str | None = None
    server_name: str | None = None

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()

    def _secure(self) -> tuple[object, list[tuple[str, object]]] | None:
        if not (self.tls or self.ca_file):
            return None
        import grpc

        roots = Path(self.ca_file).read_bytes() if self.ca_file else None
        options = [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
        return grpc.ssl_channel_credentials(root_certificates=roots), options

    def channel(self, options: list | None = None):
        """A grpc.aio channel to the gateway (use as ``async with``)."""
        import grpc

        secure = self._secure()
        if secure is None:
            return grpc.aio.insecure_channel(self.address, options=options)
        credentials, name = secure
        return grpc.aio.secure_channel(self.address, credentials, options=[*(options or []), *name])

    def blocking_channel(self, options: list | None = None):
        """A blocking grpc channel to the gateway."""
        import grpc

        secure = self._secure()
        if secure is None:
            return grpc.insecure_channel(self.address, options=options)
        credentials, name = secure
        return grpc.secure_channel(self.address, credentials, options=[*(options or []), *name])


def access(gateway: GatewayAccess | str) -> GatewayAccess:
    """An address alone is a plaintext gateway that needs no key."""
    return gateway if isinstance(gateway, GatewayAccess) else GatewayAccess(gateway)


async def stream(gateway: GatewayAccess | str, request, timeout: float, out=sys.stdout) -> dict:
    """Call Generate and stream the text to ``out``; returns the summary dict."""
    from protos.tandem.v1 import gateway_pb2_grpc
    from rpc import convert, tensors

    gateway = access(gateway)
    start = time.perf_counter()
    first = None
    ids: list[int] = []
    text = ""
    last = None
    async with gateway.channel() as ch:
        async for resp in gateway_pb2_grpc.GatewayStub(ch).Generate(request, timeout=timeout,
                                                                     metadata=gateway.metadata):
            new = tensors.token_ids(resp.token_ids, "token_ids")
            if new and first is None:
                first = time.perf_counter() - start
            ids += new
            text += resp.text
            if out is not None:
                out.write(resp.text)
                out.flush()
            last = resp
    elapsed = time.perf_counter() - start
    u = last.usage
    return {"text": text, "token_ids": ids,
            "finish_reason": (convert.finish_from_pb(last.finish_reason).value
                              if convert.finish_from_pb(last.finish_reason) else None),
            "prompt_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens, "rounds": u.rounds,
            "accepted": u.accepted_tokens, "drafted": u.draft_tokens,
            "acceptance_length": round(u.acceptance_length, 4),
            "tokens_per_s": round(len(ids) / elapsed, 2) if elapsed > 0 else 0.0,
            "time_to_first_token_s": round(first or 0.0, 4), "elapsed_s": round(elapsed, 4),
            "request_id": last.request_id, "address": gateway.address}
