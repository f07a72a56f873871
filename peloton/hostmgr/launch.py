"""The ACCEPT operation for one host's share of a gang: LAUNCH_GROUP with a DEFAULT executor.

Pure: builds the v1 JSON (dicts) from what placement decided; the framework sends it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from peloton.hostmgr.offers import Lease
from peloton.resources import Resources

_MESOS_NAMES = (("cpu", "cpus"), ("mem_mb", "mem"), ("disk_mb", "disk"), ("gpu", "gpus"))


@dataclass(frozen=True)
class LaunchTask:
    """One attempt to launch: its Mesos task id, name, command, environment, resources, ports."""

    task_id: str
    name: str
    command: str
    env: Mapping[str, str]
    resources: Resources
    ports: tuple[int, ...] = ()
    kill_grace_seconds: int = 30


def resources_json(
    amount: Resources, allocation_info: Mapping[str, Any] | None, ports: Sequence[int] = ()
) -> list[dict[str, Any]]:
    """Mesos Resource messages for ``amount`` (zero kinds left out) and ``ports``."""
    out: list[dict[str, Any]] = []
    for kind, name in _MESOS_NAMES:
        value = amount.get(kind)
        if value > 0:
            out.append({"name": name, "type": "SCALAR", "scalar": {"value": round(value, 6)}})
    if ports:
        out.append({"name": "ports", "type": "RANGES", "ranges": {"range": _ranges(sorted(ports))}})
    if allocation_info:
        for res in out:
            res["allocation_info"] = dict(allocation_info)
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
    """The LAUNCH_GROUP operation running ``tasks`` on the leased host as one task group."""
    alloc = lease.offers[0].allocation_info if lease.offers else None
    executor = {
        "type": "DEFAULT",
        "executor_id": {"value": executor_id},
        "framework_id": {"value": framework_id},
        # A real master rejects a default executor without disk.
        "resources": resources_json(executor_resources, alloc),
    }
    infos = [
        {
            "name": t.name,
            "task_id": {"value": t.task_id},
            "agent_id": {"value": lease.agent_id},
            "resources": resources_json(t.resources, alloc, t.ports),
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
