"""The resource manager's Prometheus metrics (labels ``pool`` and ``kind``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from peloton.core.resources import KINDS

# Admission waits range from instant to hours.
_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600)


@dataclass(frozen=True)
class KindStatus:
    """One pool's figures for one resource kind."""

    reservation: float
    limit: float
    share: float
    entitlement: float
    allocation: float
    demand: float
    borrowed: float
    lent: float


@dataclass(frozen=True)
class PoolStatus:
    path: str
    kinds: Mapping[str, KindStatus]
    queued_gangs: int
    # Queued gangs whose demand the usable entitlement leaves out (work conservation).
    oversized_gangs: int = 0


class PoolGauges(Collector):
    """Per-pool gauges, read from the resource manager's latest cycle at scrape time."""

    _GAUGES = (
        ("reservation", "Resources guaranteed to the pool."),
        ("limit", "Most the pool may use (+Inf: unlimited)."),
        ("entitlement", "What the pool may use now (hierarchical max-min share)."),
        ("allocation", "What the pool's admitted gangs hold."),
        ("demand", "Allocation plus queued gangs, capped by the limit."),
    )

    def __init__(self, statuses: Callable[[], Mapping[str, PoolStatus]]) -> None:
        self._statuses = statuses

    def collect(self) -> Iterator[GaugeMetricFamily]:
        statuses = self._statuses()
        for field, doc in self._GAUGES:
            family = GaugeMetricFamily(f"peloton_pool_{field}", doc, labels=["pool", "kind"])
            for path, status in statuses.items():
                for kind in KINDS:
                    family.add_metric([path, kind], getattr(status.kinds[kind], field))
            yield family
        queued = GaugeMetricFamily(
            "peloton_pool_queue_gangs", "Gangs waiting for admission.", labels=["pool"]
        )
        oversized = GaugeMetricFamily(
            "peloton_pool_queue_oversized_gangs",
            "Waiting gangs bigger than the pool's entitlement: they claim no capacity meanwhile.",
            labels=["pool"],
        )
        for path, status in statuses.items():
            queued.add_metric([path], status.queued_gangs)
            oversized.add_metric([path], status.oversized_gangs)
        yield queued
        yield oversized


class ResmgrMetrics:
    """Counters and histograms the resource manager updates as it works."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.admission_seconds = Histogram(
            "peloton_gang_admission_seconds",
            "Seconds from a gang's submission to its admission.",
            ["pool"],
            buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.preemptions = Counter(
            "peloton_preemptions",
            "Gangs preempted, by the victim's pool and why (reclaim: another pool takes back "
            "what it lent; priority: a higher-priority gang of the same pool).",
            ["pool", "cause"],
            registry=self.registry,
        )

    def watch(self, statuses: Callable[[], Mapping[str, PoolStatus]]) -> None:
        self.registry.register(PoolGauges(statuses))
