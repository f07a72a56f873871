"""Prometheus metrics of elastic gangs (label ``cause`` on resizes)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# A re-form takes tens of milliseconds; a gang waiting for a new task's start takes seconds.
_RENDEZVOUS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

# Why a generation formed (the ``cause`` label of peloton_elastic_resizes_total).
STARTED = "started"
CAPACITY_FREED = "capacity_freed"
PREEMPTED = "preempted"
TASK_FAILED = "task_failed"
LEFT = "left"
CAUSES = (STARTED, CAPACITY_FREED, PREEMPTED, TASK_FAILED, LEFT)


class ElasticMetrics:
    """Resizes by cause, rendezvous seconds, steps lost to rollbacks, and each running elastic
    gang's size (read at scrape time from ``sizes``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.resizes = Counter(
            "peloton_elastic_resizes",
            "New generations of elastic gangs, by why their membership changed.",
            ["cause"],
            registry=self.registry,
        )
        for cause in CAUSES:
            self.resizes.labels(cause)
        self.rendezvous_seconds = Histogram(
            "peloton_elastic_rendezvous_seconds",
            "From the end of an elastic gang's generation to the forming of the next.",
            buckets=_RENDEZVOUS_BUCKETS,
            registry=self.registry,
        )
        self.steps_lost = Counter(
            "peloton_elastic_steps_lost",
            "Training steps elastic gangs threw away when they restored their last commit "
            "after losing a rank.",
            registry=self.registry,
        )

    def watch(self, sizes: Callable[[], Mapping[str, int]]) -> None:
        """Export ``sizes()`` (ranks of each running elastic gang, by job id) as a gauge."""
        self.registry.register(_Sizes(sizes))


class _Sizes(Collector):
    def __init__(self, sizes: Callable[[], Mapping[str, int]]) -> None:
        self._sizes = sizes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "peloton_elastic_gang_size",
            "Ranks in the current generation of each running elastic gang.",
            labels=["job_id"],
        )
        for job_id, size in sorted(self._sizes().items()):
            gauge.add_metric([job_id], size)
        yield gauge
