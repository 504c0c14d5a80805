"""Prometheus endpoint shared by the services."""

from __future__ import annotations

import urllib.request
from typing import Callable, Mapping

from prometheus_client import REGISTRY, CollectorRegistry, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily


def serve_metrics(port: int | None, host: str = "0.0.0.0") -> int | None:
    """Start /metrics on ``port`` (0: any free port); returns the port, or None when off."""
    if port is None:
        return None
    server, _ = start_http_server(port, addr=host)
    return server.server_port


def engine_gauges(service: str, stats: Callable[[], dict[str, int]]) -> None:
    """Gauges read from the engine on every scrape: running requests and KV blocks in use."""
    for key, doc in (("running", "requests holding KV"), ("kv_blocks_used", "KV cache blocks in use"),
                     ("kv_blocks_total", "KV cache blocks in all")):
        Gauge(f"tandem_{service}_{key}", f"{service}: {doc}").set_function(lambda key=key: stats()[key])


class _ReadCounter:
    """A counter family whose values the engine keeps (a plain dict of counts by label), read at each scrape: the
    engine's thread does no telemetry work of its own and nothing syncs a GPU."""

    def __init__(self, name: str, doc: str, label: str, read: Callable[[], Mapping[str, int]]) -> None:
        self.name, self.doc, self.label, self.read = name, doc, label, read

    def collect(self):
        family = CounterMetricFamily(self.name, self.doc, labels=[self.label])
        for value, count in sorted(self.read().items()):
            family.add_metric([value], count)
        yield family


def engine_counter(name: str, doc: str, label: str, read: Callable[[], Mapping[str, int]],
                   registry: CollectorRegistry = REGISTRY) -> None:
    """A counter ``{name}_total{{label=...}}`` read from the engine on every scrape (``read``: counts by label
    value, a copy the scrape thread may iterate)."""
    registry.register(_ReadCounter(name, doc, label, read))


def scrape(port: int, host: str = "127.0.0.1") -> dict[str, float]:
    """Read a /metrics page into {'name{labels}': value}."""
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out
