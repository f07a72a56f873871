"""What the console's JSON answers hold, built from snapshots the sources read: no I/O, no
clock, no locks (docs/console-api.md is the shape of every answer).

Who may see what is decided before: every builder takes ``may_view(pool) -> bool`` and leaves
out (or hides) what the caller may not view.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from peloton.core.hosts import HostState, HostView
from peloton.core.records import EventRecord, JobRecord, TaskRecord
from peloton.core.resources import KINDS
from peloton.core.states import TaskState
from peloton.resmgr.admission import PENDING_BEHIND, PENDING_RESERVED
from peloton.resmgr.manager import QueuedGang
from peloton.resmgr.metrics import PoolStatus
from peloton.resmgr.pool import PoolTree

Json = dict[str, Any]
MayView = Callable[[str], bool]

# The host attribute that names a host's rack.
RACK = "rack"


def when(value: datetime | None) -> str | None:
    """RFC 3339 in UTC (``2026-11-27T06:00:00.123456Z``), or None."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


# ---------------------------------------------------------------- jobs


def job_json(job: JobRecord) -> Json:
    """A job's row: what the job list and the job page show."""
    spec = job.spec
    return {
        "id": job.id,
        "name": spec.name,
        "pool": spec.pool,
        "owner": job.owner,
        "state": job.state.value,
        "goal": job.goal.value,
        "reason": job.reason,
        "message": job.message,
        "created_at": when(job.created_at),
        "updated_at": when(job.updated_at),
        "instances": spec.instances,
        "gpus_per_task": spec.task.resources.gpu,
        "task_counts": {s.value: n for s, n in sorted(job.task_counts.items()) if n},
        "labels": dict(spec.labels),
        "elastic": bool(spec.gang.max_instances),
    }


def task_json(task: TaskRecord, gpus: float, gpu_indices: Sequence[int] = ()) -> Json:
    """One task of the job page: its current attempt."""
    a = task.current
    return {
        "instance_id": task.instance_id,
        "state": task.state.value,
        "goal": task.goal.value,
        "attempt": a.attempt,
        "host": a.host,
        "agent_id": a.agent_id,
        "reason": a.reason,
        "message": a.message,
        "started_at": when(a.started_at),
        "ended_at": when(a.ended_at),
        "failures": task.failures,
        "gpus": gpus,
        "gpu_indices": list(gpu_indices),
    }


_FAILED = frozenset({TaskState.FAILED.value, TaskState.LOST.value})


def event_kind(event: EventRecord) -> str:
    """What the timeline draws an event as: ``job`` (the job's own state), ``preemption``,
    ``failure``, ``restart``, ``resize`` (an elastic gang grew or shrank) or ``attempt``."""
    if event.instance_id is None:
        return "job"
    reason = event.reason.lower()
    if "preempt" in reason or event.to_state == TaskState.PREEMPTING.value:
        return "preemption"
    if event.to_state in _FAILED:
        return "failure"
    if "restart" in reason:
        return "restart"
    if any(word in reason for word in ("resize", "grow", "shrink")):
        return "resize"
    return "attempt"


def event_json(event: EventRecord) -> Json:
    """One event of the job page's timeline."""
    return {
        "sequence": event.sequence,
        "time": when(event.time),
        "instance_id": event.instance_id,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "reason": event.reason,
        "message": event.message,
        "host": event.host,
        "attempt_id": event.attempt_id,
        "kind": event_kind(event),
    }


def job_hosts(tasks: Iterable[TaskRecord], racks: Mapping[str, str]) -> list[Json]:
    """The hosts a job's tasks are on (by hostname), each with its rack and instances."""
    on: dict[str, list[int]] = {}
    for task in tasks:
        if task.current.host:
            on.setdefault(task.current.host, []).append(task.instance_id)
    return [
        {"hostname": host, "rack": racks.get(host, ""), "instances": sorted(ids)}
        for host, ids in sorted(on.items())
    ]


# ---------------------------------------------------------------- the cluster


class Holding(NamedTuple):
    """GPUs one running attempt holds on a host; ``reported``: the host indices the task
    reported (GetTaskGpus), None where not known; ``since``: when the attempt started. (A
    tuple: the cluster page makes one per running task.)"""

    attempt_id: str
    agent_id: str
    job_id: str
    instance_id: int
    gpus: int
    reported: tuple[int, ...] | None = None
    since: datetime | None = None


@dataclass(frozen=True)
class Holder:
    """What a used GPU may show of the job that holds it (to callers who may view it)."""

    job_name: str
    pool: str


def assign_gpus(total: int, holdings: Sequence[Holding]) -> list[Holding | None]:
    """Which attempt holds each of a host's ``total`` GPUs: the indices an attempt reported
    where they are in range and not taken, else the lowest free ones; what does not fit (a
    stale count) is left out. Deterministic: attempts in id order."""
    slots: list[Holding | None] = [None] * total
    ordered = sorted(holdings, key=lambda h: h.attempt_id)
    missing: list[tuple[Holding, int]] = []
    for h in ordered:
        placed = 0
        for index in h.reported or ():
            if placed < h.gpus and 0 <= index < total and slots[index] is None:
                slots[index] = h
                placed += 1
        missing.append((h, h.gpus - placed))
    free = (i for i in range(total) if slots[i] is None)
    for h, count in missing:
        for _, index in zip(range(count), free, strict=False):
            slots[index] = h
    return slots


def _gpu_json(
    index: int,
    holding: Holding | None,
    state: HostState,
    holders: Mapping[str, Holder],
    may_view: MayView,
) -> Json:
    cell: Json = {
        "index": index,
        "state": "free",
        "job_id": None,
        "job_name": None,
        "instance_id": None,
        "pool": None,
        "since": None,
        "hidden": False,
    }
    if state == HostState.DOWN:
        cell["state"] = "lost"
    elif holding is not None:
        cell["state"] = "used"
        holder = holders.get(holding.job_id)
        if holder is None or not may_view(holder.pool):
            cell["hidden"] = True
        else:
            cell.update(
                job_id=holding.job_id,
                job_name=holder.job_name,
                instance_id=holding.instance_id,
                pool=holder.pool,
                since=when(holding.since),
            )
    elif state == HostState.DRAINING:
        cell["state"] = "draining"
    return cell


def host_json(
    view: HostView, holdings: Sequence[Holding], holders: Mapping[str, Holder], may_view: MayView
) -> Json:
    """One host of the cluster page, each of its GPUs with its holder (if the caller may view
    its job)."""
    record = view.record
    total = max(0, int(record.total.gpu))
    gpus = [
        _gpu_json(i, h, record.state, holders, may_view)
        for i, h in enumerate(assign_gpus(total, holdings))
    ]
    return {
        "hostname": record.hostname,
        "agent_id": record.agent_id,
        "state": record.state.value,
        "attributes": dict(record.attributes),
        "gpus_total": total,
        "gpus_free": sum(1 for g in gpus if g["state"] in ("free", "draining")),
        "cpus_total": record.total.cpu,
        "cpus_used": min(view.used.cpu, record.total.cpu),
        "mem_total_mb": record.total.mem_mb,
        "mem_used_mb": min(view.used.mem_mb, record.total.mem_mb),
        "gpus": gpus,
    }


def _summary(hosts: Sequence[Json]) -> Json:
    live = [h for h in hosts if h["state"] != HostState.DOWN.value]
    total = sum(h["gpus_total"] for h in live)
    used = sum(h["gpus_total"] - h["gpus_free"] for h in live)
    free = total - used
    # Free GPUs on hosts that already run something: a gang needing whole hosts cannot use them.
    scattered = sum(h["gpus_free"] for h in live if h["gpus_free"] < h["gpus_total"])
    states = [h["state"] for h in hosts]
    return {
        "hosts": len(hosts),
        "hosts_up": states.count(HostState.UP.value),
        "hosts_draining": states.count(HostState.DRAINING.value),
        "hosts_down": states.count(HostState.DOWN.value),
        "gpus_total": total,
        "gpus_used": used,
        "gpus_free": free,
        "utilization": used / total if total else 0.0,
        "fragmentation": scattered / free if free else 0.0,
    }


def cluster_json(
    hosts: Sequence[HostView],
    holdings: Sequence[Holding],
    holders: Mapping[str, Holder],
    may_view: MayView,
) -> Json:
    """The cluster page: its summary, and its hosts by rack (racks by name, hosts by
    hostname)."""
    by_agent: dict[str, list[Holding]] = {}
    for h in holdings:
        by_agent.setdefault(h.agent_id, []).append(h)
    built = [
        (
            v.record.attributes.get(RACK, ""),
            host_json(v, by_agent.get(v.record.agent_id, []), holders, may_view),
        )
        for v in sorted(hosts, key=lambda v: (v.record.hostname, v.record.agent_id))
    ]
    racks: dict[str, list[Json]] = {}
    for rack, host in built:
        racks.setdefault(rack, []).append(host)
    return {
        "summary": _summary([h for _, h in built]),
        "racks": [{"rack": r, "hosts": racks[r]} for r in sorted(racks)],
    }


def racks_of(hosts: Iterable[HostView]) -> dict[str, str]:
    """Each hostname's rack ("" without one)."""
    return {v.record.hostname: v.record.attributes.get(RACK, "") for v in hosts}


# ---------------------------------------------------------------- pools and queues


def _figure(value: float) -> float | None:
    """A pool figure for JSON: an unbounded limit is null."""
    return value if math.isfinite(value) else None


def pools_json(tree: PoolTree, statuses: Mapping[str, PoolStatus]) -> Json:
    """Every pool, parents before children, with its figures of the last cycle."""
    out = []
    for path, _ in tree.walk():
        status = statuses.get(path)
        config = tree.get(path) if path != "/" else None
        resources = {
            kind: {name: _figure(getattr(s, name)) for name in _KIND_FIGURES}
            for kind, s in (status.kinds.items() if status else ())
            if kind in KINDS
        }
        out.append(
            {
                "path": path,
                "parent": config.parent if config is not None else None,
                "children": tree.children(path),
                "owner": config.owner if config is not None else "",
                "queued_gangs": status.queued_gangs if status else 0,
                "oversized_gangs": status.oversized_gangs if status else 0,
                "resources": resources,
            }
        )
    return {"pools": out}


_KIND_FIGURES = (
    "reservation",
    "limit",
    "share",
    "entitlement",
    "allocation",
    "demand",
    "borrowed",
    "lent",
)


def _window(gang: QueuedGang) -> Json | None:
    """Where a gang stands against a reservation: it holds one, or waits behind one."""
    if gang.reason == PENDING_RESERVED:
        return {
            "kind": "reservation",
            "start": when(gang.reserved_start),
            "detail": gang.reserved_where or gang.message,
        }
    if gang.reason == PENDING_BEHIND:
        return {"kind": "backfill", "start": None, "detail": gang.message}
    return None


def queue_json(
    queues: Mapping[str, Sequence[QueuedGang]],
    jobs: Mapping[str, JobRecord],
    pending: Mapping[str, Sequence[int]],
    may_view: MayView,
) -> Json:
    """Each pool's waiting gangs in admission order, those of jobs the caller may not view (or
    that are gone) left out; ``pending``: each job's PENDING instances, which its gangs take in
    queue order."""
    taken: dict[str, int] = {}
    out = []
    for pool in sorted(queues):
        gangs = []
        for gang in queues[pool]:
            job = jobs.get(gang.job_id)
            first = taken.get(gang.job_id, 0)
            taken[gang.job_id] = first + gang.size
            if job is None or not may_view(job.spec.pool):
                continue
            gangs.append(
                {
                    "position": gang.position,
                    "job_id": job.id,
                    "job_name": job.spec.name,
                    "owner": job.owner,
                    "pool": pool,
                    "instances": list(pending.get(job.id, ())[first : first + gang.size]),
                    "tasks": gang.size,
                    "gpus": gang.total.gpu,
                    "reason": gang.reason,
                    "message": gang.message,
                    "waiting_since": when(gang.waiting_since),
                    "window": _window(gang),
                }
            )
        out.append({"path": pool, "gangs": gangs})
    return {"pools": out}
