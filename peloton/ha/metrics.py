"""The leader election's Prometheus metrics."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# A renewal is one short transaction; slower than a second is a database in trouble.
_RENEW_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class LeaderMetrics:
    """``peloton_leader`` (read from ``leads`` at scrape), leader changes, renew latency."""

    def __init__(self, registry: CollectorRegistry, leads: Callable[[], bool]) -> None:
        self.leader = Gauge(
            "peloton_leader",
            "1 while this daemon is the leader (schedules), else 0.",
            registry=registry,
        )
        self.leader.set_function(lambda: 1.0 if leads() else 0.0)
        self.changes = Counter(
            "peloton_leader_changes",
            "Times this daemon became or stopped being the leader.",
            registry=registry,
        )
        self.renew_seconds = Histogram(
            "peloton_leader_lease_renew_seconds",
            "Latency of asking the database for the leader lease (acquire or renew), seconds.",
            buckets=_RENEW_BUCKETS,
            registry=registry,
        )
