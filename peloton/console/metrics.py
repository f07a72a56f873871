"""The console's metrics, in the daemon's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ConsoleMetrics:
    """``peloton_console_requests_total{route,code}`` and ``peloton_console_event_streams``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "peloton_console_requests",
            "Web console requests answered, by route and gRPC status code name.",
            ["route", "code"],
            registry=registry,
        )
        self.event_streams = Gauge(
            "peloton_console_event_streams",
            "Web console event streams (server-sent events) open now.",
            registry=registry,
        )
