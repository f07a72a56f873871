"""The job manager's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class JobMetrics:
    """Counters the job manager updates as jobs change (job and task state counts are read
    from the database at scrape time, in :mod:`peloton.server`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry or CollectorRegistry()
        self.gang_restarts = Counter(
            "peloton_gang_restarts",
            "Gangs restarted whole (new attempts of every task) after one of their tasks "
            "failed or was lost.",
            registry=registry,
        )
