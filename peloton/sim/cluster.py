"""The simulated cluster: hosts with total and used resources, offered to the placement engine
as :class:`~peloton.core.offers.HostOffers`.

Hosts come from a minicluster agents file (the minicluster's own parser,
:meth:`peloton.minicluster.spec.AgentSpec.load_file`: ``cpus``, ``mem``, ``disk``, ``gpus`` and
``ports`` of each agent's resources, its attributes such as ``rack`` and ``gpu_model``) or from
:func:`generate_hosts` (N identical hosts of G GPUs over racks and GPU models).

A gang placed on a host takes, as on a real agent, its tasks' resources plus the default
executor's share (:data:`~peloton.core.resources.EXECUTOR_RESOURCES`) once per host, and one
port per task plus one per named port; all of it comes back when the gang's tasks end. Taking
more than a host has is a bug of the simulator (or of placement) and raises
:class:`OverCommitted`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from peloton.core.offers import HostOffers
from peloton.core.resources import EPSILON, EXECUTOR_RESOURCES, KINDS, ZERO, Resources
from peloton.minicluster.spec import AgentSpec

# Ports of a generated host (a Mesos agent's default range is 31000-32000).
DEFAULT_PORTS = 1001


class OverCommitted(RuntimeError):
    """A host was asked for more than it has free."""


@dataclass(eq=False)
class SimHost:
    hostname: str
    agent_id: str
    total: Resources
    ports: int
    attributes: Mapping[str, str]
    used: Resources = ZERO
    used_ports: int = 0
    _offers: HostOffers | None = field(default=None, repr=False)

    @property
    def free(self) -> Resources:
        return self.total - self.used

    def offers(self) -> HostOffers:
        """What placement sees of this host now (cached until it changes)."""
        if self._offers is None:
            left = self.ports - self.used_ports
            self._offers = HostOffers(
                hostname=self.hostname,
                agent_id=self.agent_id,
                free=self.free,
                ports=((1, left),) if left > 0 else (),
                attributes=self.attributes,
            )
        return self._offers

    def empty(self) -> HostOffers:
        """The host with nothing running (for "can this gang ever fit")."""
        return HostOffers(
            self.hostname,
            self.agent_id,
            self.total,
            ((1, self.ports),) if self.ports else (),
            self.attributes,
        )

    def take(self, amount: Resources, ports: int) -> None:
        used, used_ports = self.used + amount, self.used_ports + ports
        left = self.total - used
        if any(left.get(k) < -1e-6 for k in KINDS) or used_ports > self.ports:
            raise OverCommitted(
                f"host {self.hostname}: taking {amount} and {ports} ports over-commits it "
                f"(total {self.total}, {self.ports} ports; used {self.used}, "
                f"{self.used_ports} ports)"
            )
        self.used, self.used_ports, self._offers = used, used_ports, None

    def give_back(self, amount: Resources, ports: int) -> None:
        used = self.used - amount
        self.used = Resources(*(0.0 if abs(v) < 1e-6 else v for _, v in used.items()))
        self.used_ports -= ports
        self._offers = None


@dataclass(frozen=True)
class Share:
    """What one gang holds on one host."""

    agent_id: str
    amount: Resources
    ports: int


class Cluster:
    """The simulated hosts, by agent id."""

    def __init__(self, hosts: Iterable[SimHost]) -> None:
        self.hosts = list(hosts)
        if not self.hosts:
            raise ValueError("the cluster has no hosts")
        self._by_id = {h.agent_id: h for h in self.hosts}
        if len(self._by_id) != len(self.hosts):
            raise ValueError("agent ids must be unique")
        self.total = sum((h.total for h in self.hosts), ZERO)
        self.total_gpus = self.total.gpu
        self.busy_gpus = 0.0
        self._totals = [h.empty() for h in self.hosts]
        self._held: dict[str, Sequence[Share]] = {}  # what each running job holds

    def copy(self) -> Cluster:
        """The same hosts with nothing running."""
        return Cluster(
            SimHost(h.hostname, h.agent_id, h.total, h.ports, h.attributes) for h in self.hosts
        )

    def snapshot(self) -> list[HostOffers]:
        """Every host's free resources now."""
        return [h.offers() for h in self.hosts]

    def free_hosts(self, ended: Collection[str] = ()) -> list[HostOffers]:
        """Every host with what is free on it, once the jobs ``ended`` have given theirs
        back (:class:`peloton.placement.check.FreeHosts`)."""
        hosts = self.snapshot()
        back: dict[str, tuple[Resources, int]] = {}
        for job in ended:
            for s in self._held.get(job, ()):
                amount, ports = back.get(s.agent_id, (ZERO, 0))
                back[s.agent_id] = (amount + s.amount, ports + s.ports)
        if not back:
            return hosts
        at = {h.agent_id: i for i, h in enumerate(hosts)}
        for agent_id, (amount, ports) in back.items():
            h = self._by_id[agent_id]
            left = h.ports - h.used_ports + ports
            hosts[at[agent_id]] = replace(
                hosts[at[agent_id]], free=h.free + amount, ports=((1, left),) if left > 0 else ()
            )
        return hosts

    def totals(self) -> list[HostOffers]:
        """Every host with its total resources, as if nothing ran."""
        return self._totals

    def take(
        self, job_id: str, hosts_by_rank: Sequence[str], per_task: Resources, ports_per_task: int
    ) -> list[Share]:
        """Take what job ``job_id``'s gang placed on ``hosts_by_rank`` (agent ids) holds; all
        or nothing."""
        tasks: dict[str, int] = {}
        for agent_id in hosts_by_rank:
            tasks[agent_id] = tasks.get(agent_id, 0) + 1
        shares = [
            Share(a, per_task.scale(n) + EXECUTOR_RESOURCES, ports_per_task * n)
            for a, n in tasks.items()
        ]
        done: list[Share] = []
        try:
            for s in shares:
                self._by_id[s.agent_id].take(s.amount, s.ports)
                done.append(s)
        except OverCommitted:
            self._give_back(done)
            raise
        self.busy_gpus += per_task.gpu * len(hosts_by_rank)
        self._held[job_id] = shares
        return shares

    def release(self, job_id: str) -> None:
        """Give back what job ``job_id``'s gang holds."""
        self._give_back(self._held.pop(job_id, ()))

    def _give_back(self, shares: Sequence[Share]) -> None:
        for s in shares:
            self._by_id[s.agent_id].give_back(s.amount, s.ports)
            self.busy_gpus -= s.amount.gpu
        if self.busy_gpus < EPSILON:
            self.busy_gpus = 0.0

    def gpu_models(self) -> set[str]:
        return {h.attributes.get("gpu_model", "") for h in self.hosts}

    def describe(self) -> str:
        """``64 hosts, 512 GPUs (A100), 8 racks``."""
        models = sorted(m for m in self.gpu_models() if m)
        racks = {h.attributes.get("rack", "") for h in self.hosts}
        named = f" ({', '.join(models)})" if models else ""
        return (
            f"{len(self.hosts)} hosts, {self.total_gpus:g} GPUs{named}, "
            f"{len(racks)} rack{'' if len(racks) == 1 else 's'}"
        )


def from_agents(agents: Sequence[AgentSpec]) -> Cluster:
    """Hosts of minicluster agent specs (every resource counted, reserved or not)."""
    hosts = []
    for i, agent in enumerate(agents):
        total = agent.total()
        ports = sum(e - b + 1 for _, rs in total.pools() for b, e in rs.ranges.get("ports", ()))
        attrs = {
            k: (str(int(v)) if isinstance(v, float) and v.is_integer() else str(v))
            for k, v in agent.attribute_map().items()
        }
        hosts.append(
            SimHost(
                hostname=agent.hostname,
                agent_id=f"{agent.hostname}-{i}",
                total=Resources(
                    cpu=total.scalar("cpus"),
                    mem_mb=total.scalar("mem"),
                    disk_mb=total.scalar("disk"),
                    gpu=total.scalar("gpus"),
                ),
                ports=ports,
                attributes=attrs,
            )
        )
    return Cluster(hosts)


def load_agents_file(path: str | Path) -> Cluster:
    """The cluster of a minicluster agents file (ValueError naming the file and entry)."""
    return from_agents(AgentSpec.load_file(path))


def generate_hosts(
    hosts: int,
    gpus_per_host: int = 8,
    racks: int = 1,
    gpu_models: Sequence[str] = ("A100",),
    cpus_per_gpu: float = 8.0,
    mem_mb_per_gpu: float = 65536.0,
) -> Cluster:
    """``hosts`` identical hosts ``gpu-rR-I``: ``gpus_per_host`` GPUs, ``cpus_per_gpu`` cpus and
    ``mem_mb_per_gpu`` MB of memory per GPU (at least 16 cpus and 64 GiB), 1 TB of disk and
    1001 ports each; spread over ``racks`` racks in contiguous blocks, and over ``gpu_models``
    in contiguous blocks too (so a model's hosts share racks as far as they can)."""
    if hosts < 1:
        raise ValueError(f"hosts: must be at least 1 (got {hosts})")
    if gpus_per_host < 0:
        raise ValueError(f"gpus per host: must not be negative (got {gpus_per_host})")
    if racks < 1:
        raise ValueError(f"racks: must be at least 1 (got {racks})")
    models = [m for m in gpu_models if m] or [""]
    total = Resources(
        cpu=max(16.0, cpus_per_gpu * gpus_per_host),
        mem_mb=max(65536.0, mem_mb_per_gpu * gpus_per_host),
        disk_mb=1_000_000.0,
        gpu=float(gpus_per_host),
    )
    out = []
    for i in range(hosts):
        rack = i * racks // hosts
        model = models[i * len(models) // hosts]
        attrs = {"rack": f"r{rack + 1}"}
        if model:
            attrs["gpu_model"] = model
        name = f"gpu-r{rack + 1}-{i + 1}"
        out.append(SimHost(name, name, total, DEFAULT_PORTS, attrs))
    return Cluster(out)
