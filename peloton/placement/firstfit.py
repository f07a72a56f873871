"""First-fit placement: each task of a gang, in rank order, on the first host it fits.

All or nothing: either every task gets a host or the result says why none was placed. Pure: it
reads a snapshot of the offer pool and returns agent ids; leasing is the launcher's job. This is
also the baseline the real placement engine is measured against.
"""

from __future__ import annotations

from collections.abc import Sequence

from peloton.core.constraints import matches
from peloton.core.gang import Gang, Placement
from peloton.core.offers import HostOffers, port_count
from peloton.core.resources import EXECUTOR_RESOURCES, Resources


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
