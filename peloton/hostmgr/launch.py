"""The ACCEPT operation for one host's share of a gang: LAUNCH_GROUP with a DEFAULT executor.

Pure: builds the v1 JSON (dicts) from what placement decided; the framework sends it.

A launch names its resources exactly as they were offered: a master takes only resources it
offered, with their role, reservations and allocation info, and refuses a task group otherwise
("Total resources ... required by task group and its executor are more than available"). An
offer may hold the same kind twice, reserved for peloton's role and unreserved; the launch takes
the reserved part first (it is there for this role, and what is unreserved is left for others).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from peloton.core.offers import LaunchTask, Lease
from peloton.core.resources import Resources

_MESOS_NAMES = (("cpu", "cpus"), ("mem_mb", "mem"), ("disk_mb", "disk"), ("gpu", "gpus"))
# Mesos compares scalars in fixed point, three decimals.
_EPSILON = 0.0005


@dataclass
class _Slot:
    entry: Mapping[str, Any]
    left: float


class OfferedResources:
    """What a lease's offers hold, entry by entry as offered; :meth:`take` hands amounts out as
    Resource messages naming the entries they came from."""

    def __init__(self, entries: Sequence[Mapping[str, Any]]) -> None:
        # Reserved entries first: a launch uses its role's reservations before the rest.
        ordered = sorted(entries, key=lambda e: not is_reserved(e))
        self._scalars = [_Slot(e, float(e["scalar"]["value"])) for e in ordered if "scalar" in e]
        self._ports = [e for e in ordered if e["name"] == "ports"]

    def take(self, amount: Resources, ports: Sequence[int] = ()) -> list[dict[str, Any]]:
        """Resource messages for ``amount`` (zero kinds left out) and ``ports``; ValueError if
        the offers do not hold them."""
        out: list[dict[str, Any]] = []
        for kind, name in _MESOS_NAMES:
            out.extend(self._take_scalar(name, amount.get(kind)))
        out.extend(self._take_ports(sorted(ports)))
        return out

    def _take_scalar(self, name: str, want: float) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for slot in self._scalars:
            if want <= _EPSILON:
                break
            if slot.entry["name"] != name or slot.left <= _EPSILON:
                continue
            got = min(slot.left, want)
            slot.left, want = slot.left - got, want - got
            out.append(_like(slot.entry, scalar={"value": round(got, 3)}))
        if want > _EPSILON:
            raise ValueError(f"the offers lack {round(want, 3):g} {name}")
        return out

    def _take_ports(self, ports: Sequence[int]) -> list[dict[str, Any]]:
        by_entry: dict[int, list[int]] = {}
        for port in ports:
            index = next(
                (
                    i
                    for i, e in enumerate(self._ports)
                    if any(r["begin"] <= port <= r["end"] for r in e["ranges"].get("range", []))
                ),
                None,
            )
            if index is None:
                raise ValueError(f"the offers lack port {port}")
            by_entry.setdefault(index, []).append(port)
        return [
            _like(self._ports[i], ranges={"range": _ranges(taken)})
            for i, taken in sorted(by_entry.items())
        ]


def is_reserved(resource: Mapping[str, Any]) -> bool:
    """Reserved for a role: the refined ``reservations`` stack, or the legacy ``role``."""
    return bool(resource.get("reservations")) or resource.get("role", "*") != "*"


def _like(entry: Mapping[str, Any], **value: Any) -> dict[str, Any]:
    """``entry`` (name, type, role, reservations, allocation_info...) holding ``value``."""
    out = {k: copy.deepcopy(v) for k, v in entry.items() if k not in ("scalar", "ranges")}
    out.update(value)
    return out


def _ranges(ports: Sequence[int]) -> list[dict[str, int]]:
    out: list[dict[str, int]] = []
    for p in ports:
        if out and out[-1]["end"] == p - 1:
            out[-1]["end"] = p
        else:
            out.append({"begin": p, "end": p})
    return out


def launch_group(
    lease: Lease,
    framework_id: str,
    executor_id: str,
    executor_resources: Resources,
    tasks: Sequence[LaunchTask],
) -> dict[str, Any]:
    """The LAUNCH_GROUP operation running ``tasks`` on the leased host as one task group.
    ValueError if the lease's offers do not hold the executor and the tasks."""
    offered = OfferedResources([e for o in lease.offers for e in o.entries])
    executor = {
        "type": "DEFAULT",
        "executor_id": {"value": executor_id},
        "framework_id": {"value": framework_id},
        # A real master rejects a default executor without disk.
        "resources": offered.take(executor_resources),
    }
    infos = [
        {
            "name": t.name,
            "task_id": {"value": t.task_id},
            "agent_id": {"value": lease.agent_id},
            "resources": offered.take(t.resources, t.ports),
            "command": {
                "shell": True,
                "value": t.command,
                "environment": {
                    "variables": [
                        {"name": k, "type": "VALUE", "value": v} for k, v in sorted(t.env.items())
                    ]
                },
            },
            "kill_policy": grace_policy(t.kill_grace_seconds),
        }
        for t in tasks
    ]
    return {
        "type": "LAUNCH_GROUP",
        "launch_group": {"executor": executor, "task_group": {"tasks": infos}},
    }


def grace_policy(seconds: int) -> dict[str, Any]:
    """A KillPolicy: SIGTERM, then SIGKILL after ``seconds``."""
    return {"grace_period": {"nanoseconds": int(seconds) * 1_000_000_000}}
