"""Prometheus metrics: one registry per daemon, served on its own HTTP port at /metrics."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# RPC latency buckets, seconds: sub-millisecond reads up to slow bulk creates.
_RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class StateCounts(Collector):
    """A gauge per state, counted from the database at scrape time (the database is the truth)."""

    def __init__(
        self, name: str, doc: str, count: Callable[[], Mapping[str, int]], states: list[str]
    ) -> None:
        self._name, self._doc, self._count, self._states = name, doc, count, states

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self._name, self._doc, labels=["state"])
        try:
            counts = self._count()
        except Exception:  # a scrape must not fail because the database blinked
            log.exception("counting %s for metrics failed", self._name)
            return
        for state in self._states:
            family.add_metric([state], counts.get(state, 0))
        yield family


class Metrics:
    """Every metric the daemon exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.grpc_requests = Counter(
            "peloton_grpc_requests",
            "gRPC requests handled, by method and status code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.grpc_seconds = Histogram(
            "peloton_grpc_request_seconds",
            "gRPC request latency in seconds, by method.",
            ["method"],
            buckets=_RPC_BUCKETS,
            registry=self.registry,
        )

    def add_collector(self, collector: Collector) -> None:
        self.registry.register(collector)

    def serve(
        self,
        host: str,
        port: int,
        *,
        certfile: str = "",
        keyfile: str = "",
        client_cafile: str = "",
    ) -> WSGIServer:
        """Serve /metrics in a background thread; returns the server (port 0: any). With
        ``certfile`` and ``keyfile`` over HTTPS, and with ``client_cafile`` only to scrapers
        that show a certificate that CA signed."""
        server, _thread = start_http_server(
            port,
            addr=host,
            registry=self.registry,
            certfile=certfile or None,
            keyfile=keyfile or None,
            client_cafile=client_cafile or None,
            client_auth_required=bool(client_cafile),
        )
        if certfile:
            # The library's accepting thread would run each TLS handshake itself, so one client
            # that connects and sends nothing would hold every scrape up: each connection's own
            # thread runs it instead (on its first read), and a failed one is logged, not
            # printed with a traceback.
            server.socket.do_handshake_on_connect = False  # type: ignore[attr-defined]
            server.handle_error = _connection_failed  # type: ignore[method-assign,assignment]
        return server


def _connection_failed(_request: object, client_address: tuple[Any, ...]) -> None:
    """A scrape connection that failed (a TLS handshake refused, a client gone); called by the
    server while the exception is handled."""
    error = sys.exc_info()[1]
    log.info("metrics connection failed", extra={"client": client_address[0], "error": str(error)})
