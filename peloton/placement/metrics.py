"""Placement's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Seconds: a round over an idle cluster takes milliseconds; a gang may wait minutes for room.
_ROUND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_GANG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

# Why a round could not place a gang (the label of peloton_placement_failures_total).
NO_FIT = "no_fit"  # no set of offered hosts holds it now; it waits
INFEASIBLE = "infeasible"  # it fits no set of hosts even on an empty cluster; the job fails
HOST_TAKEN = "host_taken"  # a chosen host was leased by someone else meanwhile
LAUNCH = "launch"  # recording or launching failed (e.g. Mesos disconnected, an offer rescinded)
FAILURE_REASONS = (NO_FIT, INFEASIBLE, HOST_TAKEN, LAUNCH)


class PlacementMetrics:
    """Counters, histograms and gauges the launcher updates every round."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry or CollectorRegistry()
        self.rounds = Counter(
            "peloton_placement_rounds",
            "Placement rounds that had admitted gangs to place.",
            registry=registry,
        )
        self.round_seconds = Histogram(
            "peloton_placement_seconds",
            "Duration of one placement round in seconds: placing and leasing its gangs (each "
            "is then recorded and launched on a launch worker while the next rounds go on; "
            "peloton_gang_placement_seconds ends at the launch).",
            buckets=_ROUND_BUCKETS,
            registry=registry,
        )
        self.gang_seconds = Histogram(
            "peloton_gang_placement_seconds",
            "Seconds from a gang's admission by the resource manager to its launch.",
            buckets=_GANG_BUCKETS,
            registry=registry,
        )
        self.failures = Counter(
            "peloton_placement_failures",
            "Gangs a placement round could not launch, by reason: no_fit (no offered hosts "
            "hold it now), infeasible (no hosts ever could), host_taken, launch.",
            ["reason"],
            registry=registry,
        )
        for reason in FAILURE_REASONS:
            self.failures.labels(reason)
        self.gpu_fragmentation = Gauge(
            "peloton_gpu_fragmentation",
            "Free GPUs on hosts that cannot hold the largest waiting per-task GPU request, as "
            "a fraction of all free GPUs (0 when nothing waits or no GPU is free).",
            registry=registry,
        )
