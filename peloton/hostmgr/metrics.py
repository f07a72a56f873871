"""The host manager's Prometheus metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from peloton.core.resources import KINDS, Resources

HOST_STATES = ("UP", "DRAINING", "DOWN")


class ClusterGauges(Collector):
    """``peloton_hosts{state}`` and ``peloton_cluster_resources{kind,state}``, read at scrape
    time from the host manager's in-memory view (which the database mirrors)."""

    def __init__(
        self,
        hosts: Callable[[], Mapping[str, int]],
        resources: Callable[[], Mapping[str, Resources]],
    ) -> None:
        self._hosts, self._resources = hosts, resources

    def collect(self) -> Iterator[GaugeMetricFamily]:
        by_state = self._hosts()
        hosts = GaugeMetricFamily("peloton_hosts", "Known Mesos agents by state.", labels=["state"])
        for state in HOST_STATES:
            hosts.add_metric([state], by_state.get(state, 0))
        yield hosts
        res = GaugeMetricFamily(
            "peloton_cluster_resources",
            "Cluster resources of hosts that are up: total, used by peloton's tasks, free.",
            labels=["kind", "state"],
        )
        for state, amount in self._resources().items():
            for kind in KINDS:
                res.add_metric([kind, state], amount.get(kind))
        yield res


class HostmgrMetrics:
    """Counters and gauges the host manager updates as things happen."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.connected = Gauge(
            "peloton_mesos_connected",
            "1 while subscribed to a Mesos master, else 0.",
            registry=registry,
        )
        self.subscribe_refusals = Counter(
            "peloton_mesos_subscribe_refusals",
            "SUBSCRIBE calls the Mesos master refused, by reason: unauthenticated (401: no or "
            "a wrong secret), forbidden (403), invalid (400), error (an ERROR event instead of "
            "SUBSCRIBED), other.",
            ["reason"],
            registry=registry,
        )
        self.offers_held = Gauge(
            "peloton_offers_held", "Mesos offers held by the offer pool.", registry=registry
        )
        self.offers_received = Counter(
            "peloton_offers_received", "Mesos offers received.", registry=registry
        )
        self.offers_declined = Counter(
            "peloton_offers_declined",
            "Mesos offers declined (every offer not launched on is declined, never dropped).",
            registry=registry,
        )
        self.tasks_launched = Counter(
            "peloton_tasks_launched",
            "Mesos tasks sent in LAUNCH_GROUP operations.",
            registry=registry,
        )
        self.status_updates = Counter(
            "peloton_status_updates",
            "Mesos task status updates received, by Mesos state.",
            ["state"],
            registry=registry,
        )

    def watch(self, collector: Collector) -> None:
        self.registry.register(collector)
