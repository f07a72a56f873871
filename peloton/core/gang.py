"""A gang: the tasks of one job attempt-set that are admitted, placed and launched as one unit.

This is the currency between components: jobmgr builds a :class:`Gang` from a job when its tasks
need to run, resmgr queues and admits it against its pool, placement puts every task of it on a
host or none, hostmgr launches each host's share as one Mesos task group.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from peloton.core.resources import Resources
from peloton.v1 import job_pb2


@dataclass(frozen=True)
class Gang:
    """One job's tasks that must start together."""

    job_id: str
    pool: str
    priority: int
    preemptible: bool
    # When the gang was (re)submitted; ties in priority are served oldest first.
    submitted_at: datetime
    # Instance ids of the tasks in the gang, ascending; rank i is instances[i].
    instances: tuple[int, ...]
    # Resources of one task (every task of a job asks for the same).
    per_task: Resources
    # The job's spec, for placement (constraints, ports, command, env).
    spec: job_pb2.JobSpec
    # When the resource manager admitted it (epoch seconds; 0: unknown), for placement latency.
    admitted_at: float = 0.0

    @property
    def size(self) -> int:
        return len(self.instances)

    @property
    def ports_per_task(self) -> int:
        """Host ports each task takes: one for the gang's own use (its ``PELOTON_PEERS``
        address, where the collective runtime listens) and one per named port."""
        return 1 + len(self.spec.task.ports)

    @property
    def total(self) -> Resources:
        """What the whole gang needs: per-task resources times the number of tasks."""
        return self.per_task.scale(self.size)

    @property
    def kill_grace_seconds(self) -> int:
        p = self.spec.preemption
        return p.kill_grace_seconds if p.HasField("kill_grace_seconds") else 30

    @classmethod
    def of_job(
        cls,
        job_id: str,
        spec: job_pb2.JobSpec,
        instances: tuple[int, ...],
        at: datetime,
        admitted_at: float = 0.0,
    ) -> Gang:
        """The gang of ``instances`` of a job whose spec has its defaults filled in."""
        return cls(
            job_id=job_id,
            pool=spec.pool,
            priority=spec.priority,
            preemptible=spec.preemption.preemptible,
            submitted_at=at,
            instances=tuple(sorted(instances)),
            per_task=Resources.from_proto(spec.task.resources),
            spec=spec,
            admitted_at=admitted_at,
        )


class AdmittedGangs(Protocol):
    """Where placement takes gangs from: resmgr's admitted gangs that are not yet placed.

    A gang keeps its admission (its pool allocation) from the moment it is taken until resmgr is
    told it ended or was preempted; placement only borrows it to find hosts.
    """

    def take_admitted(self, limit: int) -> Sequence[Gang]:
        """Up to ``limit`` admitted gangs, highest priority first; each is handed out once."""
        ...

    def return_admitted(self, returned: Sequence[tuple[Gang, str]]) -> None:
        """Placement could not place these gangs now, each ``(gang, reason)``; offer them again
        later. The reason says why (e.g. ``needs 2 hosts with 4 free GPUs; 1 has``) and becomes
        the job's pending reason (a round's gangs come back together: their reasons are written
        at once)."""
        ...


@dataclass(frozen=True)
class Placement:
    """Hostnames by rank (``hosts[i]`` runs ``gang.instances[i]``), or None and a reason."""

    hosts: tuple[str, ...] | None
    reason: str = ""


class PlacementCheck(Protocol):
    """Whether the cluster's hosts hold gangs now (the placement engine on the host manager's
    offers): what placement-aware admission asks before it admits a gang."""

    def round(self, placed_first: Sequence[Gang]) -> Callable[[Gang], str | None]:
        """A check for one admission cycle: it answers None for a gang that fits (its hosts are
        then taken for the rest of the cycle) or why not, on the hosts as they are once
        ``placed_first`` (admitted earlier, not yet placed) have taken theirs."""
        ...

    def where(self, gang: Gang, ended: Collection[str], placed_first: Sequence[Gang]) -> str | None:
        """Where ``gang`` would run on the hosts as they will be once the jobs ``ended`` have
        ended and ``placed_first`` have taken theirs (``on 2 hosts in rack r1``), or None if
        no set of hosts would take it then."""
        ...
