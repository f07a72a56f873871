"""First-fit placement: each task of a gang, in rank order, on the first host it fits.

All or nothing: either every task gets a host or the result says why none was placed. Pure: it
reads a snapshot of the offer pool and returns agent ids; leasing is the launcher's job. This is
also the baseline the real placement engine is measured against.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from peloton.gang import Gang
from peloton.hostmgr.offers import HostOffers, port_count
from peloton.resources import Resources
from peloton.v1 import job_pb2

# What the Mesos default executor of one task group declares besides its tasks (real masters
# require cpus, mem and disk on it); charged once per host a gang uses.
EXECUTOR_RESOURCES = Resources(cpu=0.1, mem_mb=32.0, disk_mb=32.0)


@dataclass(frozen=True)
class Placement:
    """Hostnames by rank (``hosts[i]`` runs ``gang.instances[i]``), or None and a reason."""

    hosts: tuple[str, ...] | None
    reason: str = ""


def matches(constraints: Sequence[job_pb2.Constraint], attributes: Mapping[str, str]) -> bool:
    """Whether a host's attributes satisfy every constraint (AND); an ``any_of`` item holds when
    any of its branches does (OR). Leaf ops: in, not_in, eq, exists."""
    for c in constraints:
        if c.any_of:
            ok = any(matches((branch,), attributes) for branch in c.any_of)
        else:
            ok = _holds(c, attributes.get(c.attribute))
        if not ok:
            return False
    return True


def _holds(leaf: job_pb2.Constraint, value: str | None) -> bool:
    if leaf.op == "exists":
        return value is not None
    if leaf.op in ("in", "eq"):
        return value is not None and value in leaf.values
    if leaf.op == "not_in":
        return value is None or value not in leaf.values
    return False


def place(gang: Gang, hosts: Sequence[HostOffers]) -> Placement:
    """Put every task of ``gang`` on a host of ``hosts`` (first fit, in the given order).

    One pass: the tasks of a gang are identical and a host's free resources only shrink, so a
    host that could not take task k can't take task k+1 either; hosts are looked at only until
    the gang is placed (a few, on a big idle cluster).
    """
    task = gang.spec.task
    ports = gang.ports_per_task
    free: dict[str, Resources] = {}
    free_ports: dict[str, int] = {}
    out: list[str] = []
    i = 0
    for _ in gang.instances:
        while i < len(hosts):
            h = hosts[i]
            name = h.agent_id
            if name not in free:
                if not matches(task.constraints, h.attributes):
                    i += 1
                    continue
                free[name], free_ports[name] = h.free, port_count(h.ports)
            need = gang.per_task if name in out else gang.per_task + EXECUTOR_RESOURCES
            if need.fits_in(free[name]) and ports <= free_ports[name]:
                free[name] = free[name] - need
                free_ports[name] -= ports
                out.append(name)
                break
            i += 1
        else:
            eligible = sum(1 for h in hosts if matches(task.constraints, h.attributes))
            return Placement(None, _why(gang, len(out), len(hosts), eligible))
    return Placement(tuple(out))


def _why(gang: Gang, placed: int, offered: int, eligible: int) -> str:
    r = gang.per_task
    ask = f"cpu {r.cpu:g}, mem_mb {r.mem_mb:g}, disk_mb {r.disk_mb:g}, gpu {r.gpu:g}"
    if offered == 0:
        return f"no host offers free resources; {gang.size} tasks need {ask} each"
    if eligible == 0:
        return f"none of {offered} offered hosts matches the task constraints"
    return (
        f"only {placed} of {gang.size} tasks ({ask} each) fit on the {eligible} offered hosts "
        f"that match the constraints"
    )
