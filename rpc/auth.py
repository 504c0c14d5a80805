"""Who may call the gateway: API keys from a file, checked per call by a server interceptor, with per-key limits.

A client sends ``authorization: Bearer <key>`` in its call metadata. The keys file (``api_keys_file``) has one key
per line, optionally followed by the most calls that key may have in flight at once::

    # key                                  concurrent calls (optional)
    3f9c2d0e6a8b4c51a7d2e9f0b1c3d5e7
    team-b-7d41c8a2f06e49b3             8

Blank lines and ``#`` comments are skipped. A call without the metadata, with another scheme than Bearer or with a
key not in the file ends UNAUTHENTICATED, saying which; a call past its key's limit ends RESOURCE_EXHAUSTED. Keys
are compared by their SHA-256 digests, never echoed. ``grpc.health.v1.Health`` stays open (load balancers and
Kubernetes probes carry no key); reflection needs a key like every other method.

Without a keys file the gateway serves whoever reaches it, which ``check_open`` allows only where that is this
machine alone (a loopback address) or ``api_open`` (or ``insecure``, plaintext everywhere) says so.
"""

from __future__ import annotations

import hashlib
import inspect
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from rpc.tls import is_loopback, read_file

HEALTH_PREFIX = "/grpc.health.v1.Health/"
SCHEME = "bearer"


@dataclass(frozen=True)
class Key:
    line: int          # where it is in the file (logs name a key by its line, never by itself)
    limit: int | None  # calls in flight at once (None: no limit)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class ApiKeys:
    """The keys of a keys file, by digest."""

    def __init__(self, keys: dict[bytes, Key], source: str = "") -> None:
        self.keys = keys
        self.source = source

    @classmethod
    def parse(cls, text: str, source: str = "api_keys_file") -> ApiKeys:
        keys: dict[bytes, Key] = {}
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split()
            if len(fields) > 2:
                raise ValueError(f"{source}: line {n}: expected KEY [LIMIT], got {len(fields)} fields")
            key, limit = fields[0], None
            if len(key) < 16:
                raise ValueError(f"{source}: line {n}: a key must have at least 16 characters, this one has "
                                 f"{len(key)}")
            if len(fields) == 2:
                if not fields[1].isdigit() or int(fields[1]) < 1:
                    raise ValueError(f"{source}: line {n}: the limit must be a whole number >= 1, got "
                                     f"{fields[1]!r}")
                limit = int(fields[1])
            digest = _digest(key)
            if digest in keys:
                raise ValueError(f"{source}: line {n}: the key of line {keys[digest].line} again")
            keys[digest] = Key(n, limit)
        if not keys:
            raise ValueError(f"{source}: holds no key (one per line, optionally followed by a limit)")
        return cls(keys, source)

    @classmethod
    def load(cls, path: str) -> ApiKeys:
        return cls.parse(read_file("api_keys_file", path).decode(errors="replace"), f"api_keys_file {path}")

    @staticmethod
    def first(path: str) -> str | None:
        """The first key of a keys file (what a stack's own calls to its gateway use), None if it has none."""
        for raw in read_file("api_keys_file", path).decode(errors="replace").splitlines():
            line = raw.split("#", 1)[0].split()
            if line:
                return line[0]
        return None

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, metadata) -> tuple[bytes, Key]:
        """The key a call's metadata names, or PermissionError saying why none (the caller's UNAUTHENTICATED)."""
        values = [v for k, v in (metadata or ()) if k == "authorization"]
        if not values:
            raise PermissionError("authorization: missing; send the metadata 'authorization: Bearer <API key>'")
        if len(values) > 1:
            raise PermissionError("authorization: sent more than once")
        value = values[0] if isinstance(values[0], str) else values[0].decode(errors="replace")
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() != SCHEME or not token.strip():
            raise PermissionError("authorization: expected 'Bearer <API key>'")
        digest = _digest(token.strip())
        key = self.keys.get(digest)
        if key is None:
            raise PermissionError("authorization: the API key is not valid")
        return digest, key


def check_open(settings) -> ApiKeys | None:
    """The gateway's keys (``api_keys_file``), or None where it may serve anyone: a ValueError where it would
    serve anyone beyond this machine without ``api_open`` (or ``insecure``) saying so."""
    if settings.api_keys_file:
        return ApiKeys.load(settings.api_keys_file)
    if not (settings.api_open or settings.insecure or is_loopback(settings.host)):
        raise ValueError(f"api_keys_file: not set, and the gateway would listen on {settings.host}, beyond this "
                         "machine: clients must authenticate. Give a keys file (one API key per line; clients send "
                         "'authorization: Bearer <key>'), listen on a loopback host (127.0.0.1), or set api_open to "
                         "serve anyone who reaches it")
    return None


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call but health without a valid key (UNAUTHENTICATED), and past its key's limit
    (RESOURCE_EXHAUSTED); counts each key's calls in flight."""

    def __init__(self, keys: ApiKeys) -> None:
        self.keys = keys
        self.in_flight: Counter[bytes] = Counter()

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if handler is None or method.startswith(HEALTH_PREFIX):
            return handler
        metadata = details.invocation_metadata
        for kind, make in (("unary_unary", grpc.unary_unary_rpc_method_handler),
                           ("unary_stream", grpc.unary_stream_rpc_method_handler),
                           ("stream_unary", grpc.stream_unary_rpc_method_handler),
                           ("stream_stream", grpc.stream_stream_rpc_method_handler)):
            behavior = getattr(handler, kind)
            if behavior is not None:
                return make(self._guard(behavior, metadata), request_deserializer=handler.request_deserializer,
                            response_serializer=handler.response_serializer)
        return handler

    async def _admit(self, metadata, context: grpc.aio.ServicerContext) -> bytes:
        """The caller's key, counted in flight; aborts the call where there is none or it is at its limit."""
        try:
            digest, key = self.keys.find(metadata)
        except PermissionError as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        if key.limit is not None and self.in_flight[digest] >= key.limit:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"api key (line {key.line} of the keys file): its limit of {key.limit} concurrent "
                                f"call{'s' if key.limit != 1 else ''} is reached")
        self.in_flight[digest] += 1
        return digest

    def _done(self, digest: bytes) -> None:
        self.in_flight[digest] -= 1
        if self.in_flight[digest] <= 0:
            del self.in_flight[digest]

    def _guard(self, behavior: Callable, metadata) -> Callable:
        if inspect.isasyncgenfunction(behavior):
            async def streamed(request, context):
                digest = await self._admit(metadata, context)
                try:
                    async for response in behavior(request, context):
                        yield response
                finally:
                    self._done(digest)
            return streamed

        async def unary(request, context):
            digest = await self._admit(metadata, context)
            try:
                result = behavior(request, context)
                return await result if inspect.isawaitable(result) else result
            finally:
                self._done(digest)
        return unary
