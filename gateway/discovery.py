"""Where the replicas of a service are: address settings parsed once, host names resolved into replicas.

An address setting (``TANDEM_VERIFIER_ADDRESS``, ``TANDEM_DRAFTER_ADDRESS``) is one ``host:port``
or a comma-separated list of them. Every host name is resolved and each of its addresses is one
replica, so a Kubernetes headless Service (one A/AAAA record per ready pod) names them all; the
names are resolved again every ``TANDEM_DISCOVERY_INTERVAL_S`` seconds. A name with IPv4
addresses counts only those (a dual-stack pod, or ``localhost``, is one replica, not two); a name
with IPv6 addresses only counts those. An IP literal is one replica as it is.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
from dataclasses import dataclass
from typing import Awaitable, Callable

log = logging.getLogger("tandem.gateway")

_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")


@dataclass(frozen=True)
class Target:
    host: str   # a DNS name or an IP literal (IPv6 without brackets)
    port: int

    @property
    def is_ip(self) -> bool:
        return _is_ip(self.host)

    def __str__(self) -> str:
        return address(self.host, self.port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def address(host: str, port: int) -> str:
    """``host:port`` as gRPC dials it (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_targets(text: str) -> list[Target]:
    """``host:port[,host:port...]`` -> targets, or ValueError saying what is wrong (the caller names the field)."""
    entries = [e.strip() for e in text.split(",")]
    if not any(entries):
        raise ValueError("must name at least one host:port")
    out: list[Target] = []
    for e in entries:
        if not e:
            raise ValueError(f"{text!r} has an empty entry (a stray comma?)")
        host, sep, port = e.rpartition(":")
        if not sep or not host:
            raise ValueError(f"{e!r} is not host:port")
        if "/" in host:
            raise ValueError(f"{e!r}: give host:port, without a scheme or path")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
            if ":" not in host or not _is_ip(host):
                raise ValueError(f"{e!r}: [{host}] is not an IPv6 address")
        elif ":" in host:
            raise ValueError(f"{e!r}: write an IPv6 address in brackets, e.g. [::1]:50052")
        elif not _is_ip(host) and not _HOST.fullmatch(host):
            raise ValueError(f"{e!r}: {host!r} is not a host name or IP address")
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"{e!r}: port {port!r} is not a number in [1, 65535]")
        t = Target(host, int(port))
        if t in out:
            raise ValueError(f"{e!r} is listed twice")
        out.append(t)
    return out


Resolver = Callable[[str, int], Awaitable[list[str]]]


async def resolve_host(host: str, port: int) -> list[str]:
    """The replica addresses (``ip:port``) of a name: its IPv4 addresses, else its IPv6 ones.

    A name that does not exist (a headless Service without ready pods) has none; any other
    resolution failure raises OSError.
    """
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return []
        raise
    v4 = [i[4][0] for i in infos if i[0] == socket.AF_INET]
    v6 = [i[4][0].split("%")[0] for i in infos if i[0] == socket.AF_INET6]
    return sorted({address(ip, port) for ip in (v4 or v6)})


class Discovery:
    """The current replica addresses of a list of targets; a failed lookup keeps that name's last answer."""

    def __init__(self, targets: list[Target], resolver: Resolver = resolve_host) -> None:
        self.targets = targets
        self.resolver = resolver
        self._last: dict[Target, list[str]] = {t: [str(t)] for t in targets if t.is_ip}

    @property
    def dynamic(self) -> bool:
        """Whether any target is a name (worth resolving again)."""
        return any(not t.is_ip for t in self.targets)

    def name_of(self, address: str) -> str | None:
        """The name whose records gave ``address`` (None for an IP literal): the name a replica's TLS certificate
        is checked against, since the gateway dials the address itself."""
        for t, found in self._last.items():
            if not t.is_ip and address in found:
                return t.host
        return None

    async def addresses(self) -> list[str]:
        for t in self.targets:
            if t.is_ip:
                continue
            try:
                self._last[t] = await self.resolver(t.host, t.port)
            except OSError as exc:
                log.warning("could not resolve %s (%s): keeping its last %d addresses", t, exc,
                            len(self._last.get(t, [])))
        seen: dict[str, None] = {}
        for t in self.targets:
            for a in self._last.get(t, []):
                seen.setdefault(a, None)
        return list(seen)
