"""First-fit placement: each task of a gang, in rank order, on the first host it fits.

All or nothing: either every task gets a host or the result says why none was placed. Pure: it
reads a snapshot of the offer pool and returns hostnames; leasing is the launcher's job. This is
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
    """Whether a host's attributes satisfy every constraint (ops: in, not_in, eq, exists)."""
    for c in constraints:
        value = attributes.get(c.attribute)
        if c.op == "exists":
            ok = value is not None
        elif c.op in ("in", "eq"):
            ok = value is not None and value in c.values
        elif c.op == "not_in":
            ok = value is None or value not in c.values
        else:
            ok = False
        if not ok:
            return False
    return True


def place(gang: Gang, hosts: Sequence[HostOffers]) -> Placement:
    """Put every task of ``gang`` on a host of ``hosts`` (first fit, in the given order)."""
    task = gang.spec.task
    ports = len(task.ports)
    eligible = [h for h in hosts if matches(task.constraints, h.attributes)]
    free = {h.hostname: h.free for h in eligible}
    free_ports = {h.hostname: port_count(h.ports) for h in eligible}
    used: set[str] = set()
    out: list[str] = []
    for _ in gang.instances:
        chosen = None
        for h in eligible:
            need = gang.per_task if h.hostname in used else gang.per_task + EXECUTOR_RESOURCES
            if need.fits_in(free[h.hostname]) and ports <= free_ports[h.hostname]:
                chosen = h.hostname
                free[chosen] = free[chosen] - need
                free_ports[chosen] -= ports
                used.add(chosen)
                break
        if chosen is None:
            return Placement(None, _why(gang, len(out), len(hosts), len(eligible)))
        out.append(chosen)
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
