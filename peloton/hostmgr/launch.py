"""The ACCEPT operation for one host's share of a gang: LAUNCH_GROUP with a DEFAULT executor,
its tasks in containers from images where their spec asks for one.

Pure: builds the v1 JSON (dicts) from what placement decided; the framework sends it.

A launch names its resources exactly as they were offered: a master takes only resources it
offered, with their role, reservations and allocation info, and refuses a task group otherwise
("Total resources ... required by task group and its executor are more than available"). An
offer may hold the same kind twice, reserved for peloton's role and unreserved; the launch takes
the reserved part first (it is there for this role, and what is unreserved is left for others).
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from peloton.core.containers import (
    DEFAULT_RUNTIME_IMAGE,
    RUNTIME_DIR,
    RUNTIME_DIR_ENV,
    ContainerLaunch,
    Mount,
    runs_in_shell,
)
from peloton.core.offers import LaunchTask, Lease
from peloton.core.resources import Resources
from peloton.hostmgr.sandbox import GPU_REPORT

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
    """``entry`` (name, type, role, reservations, allocation_info...) holding ``value``. The
    nested values are the offer's, shared, not copied: a launch only serializes them (a deep
    copy of each was a tenth of building a gang's TaskInfos)."""
    out = {k: v for k, v in entry.items() if k not in ("scalar", "ranges")}
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


def offered_by(lease: Lease) -> OfferedResources:
    """What the lease's offers hold, to be handed out to the operations of one ACCEPT."""
    return OfferedResources([e for o in lease.offers for e in o.entries])


def launch_group(
    lease: Lease,
    framework_id: str,
    executor_id: str,
    executor_resources: Resources,
    tasks: Sequence[LaunchTask],
    runtime_image: str = DEFAULT_RUNTIME_IMAGE,
    resources: OfferedResources | None = None,
) -> dict[str, Any]:
    """The LAUNCH_GROUP operation running ``tasks`` on the leased host as one task group.
    ``runtime_image`` is what containers with runtime "peloton" mount. ``resources``: what is
    left of the lease's offers where the same ACCEPT launches other groups on the host (they
    take from it in turn); None: all of them. ValueError if they do not hold the executor and
    the tasks."""
    offered = offered_by(lease) if resources is None else resources
    executor: dict[str, Any] = {
        "type": "DEFAULT",
        "executor_id": {"value": executor_id},
        "framework_id": {"value": framework_id},
        # A real master rejects a default executor without disk.
        "resources": offered.take(executor_resources),
    }
    shm_mb = sum(t.container.shm_mb for t in tasks if t.container is not None)
    if shm_mb:
        # The executor's container owns the /dev/shm its containerized tasks share
        # (SHARE_PARENT): the gang's ranks on this host meet there.
        executor["container"] = {
            "type": "MESOS",
            "linux_info": {"ipc_mode": "PRIVATE", "shm_size": shm_mb},
        }
    infos = [_task_info(lease, offered, t, runtime_image) for t in tasks]
    return {
        "type": "LAUNCH_GROUP",
        "launch_group": {"executor": executor, "task_group": {"tasks": infos}},
    }


def _task_info(
    lease: Lease, offered: OfferedResources, t: LaunchTask, runtime_image: str
) -> dict[str, Any]:
    env = dict(t.env)
    if t.container is not None and t.container.runtime:
        env[RUNTIME_DIR_ENV] = RUNTIME_DIR
    info: dict[str, Any] = {
        "name": t.name,
        "task_id": {"value": t.task_id},
        "agent_id": {"value": lease.agent_id},
        "resources": offered.take(t.resources, t.ports),
        "command": {
            **_command(t),
            **({"user": t.user} if t.user else {}),
            "environment": {
                "variables": [
                    {"name": k, "type": "VALUE", "value": v} for k, v in sorted(env.items())
                ]
            },
        },
        "kill_policy": grace_policy(t.kill_grace_seconds),
    }
    if t.container is not None:
        info["container"] = container_info(t.container, runtime_image)
    return info


def _command(t: LaunchTask) -> dict[str, Any]:
    """CommandInfo's command part, as Mesos runs it in an image: ``shell`` is ``/bin/sh -c``;
    ``exec`` runs the program with the arguments (argv[0] first, as execvp takes them);
    ``image`` leaves the value out, so the image's ENTRYPOINT runs with the arguments in place
    of its CMD. A shell command is the task's, last and as written (its ``exec`` still replaces
    the shell), after peloton's lines: the GPU report of a task with GPUs, the runtime's PATH."""
    c = t.container
    if c is not None and not runs_in_shell(c):
        if c.entrypoint == "exec":
            return {"shell": False, "value": t.command, "arguments": [t.command, *c.args]}
        return {"shell": False, "arguments": list(c.args)}
    lines = []
    if t.resources.gpu > 0:
        # Mesos tells no framework which of its GPUs an agent gave a task: the task says.
        lines.append(gpu_report())
    if c is not None and c.runtime:
        # The image's PATH is the agent's to merge; the bundle's tools come after it.
        lines.append(f'PATH="$PATH:{RUNTIME_DIR}/bin"; export PATH')
    return {"shell": True, "value": "\n".join([*lines, t.command])}


def gpu_report(devices: str = "/dev/nvidia") -> str:
    """One line of POSIX sh (dash, busybox) that writes the host indices of the GPUs the task
    sees, comma-separated, to :data:`GPU_REPORT` in its sandbox, and never fails the task.

    The indices are ``CUDA_VISIBLE_DEVICES`` where it is set (as is, its order kept), else the
    numbers of the ``<devices>N`` device nodes the task may open, else none (an empty line).
    Only those it may open: Mesos's gpu/nvidia isolator leaves every ``/dev/nvidiaN`` of the
    host in view (a task without an image shares the host's /dev; an image gets them all bound
    in) and denies the ones not allocated in the devices cgroup, where open(2) fails. ``devices``
    is for tests. It runs in a subshell so that its variables never reach the task's command,
    with builtins only but ``mkdir``, which an image may lack: then nothing is written, as when
    the sandbox is read-only."""
    nodes = shlex.quote(devices)
    return (
        # Assignments, unquoted: they are not split, and a quoted pattern in ${d#...} inside
        # double quotes is read differently by different shells.
        f'(g=${{CUDA_VISIBLE_DEVICES-}}; [ "${{CUDA_VISIBLE_DEVICES+set}}" ] || '
        f'for d in {nodes}[0-9]*; do true <"$d" && g=$g${{g:+,}}${{d#{nodes}}}; done; '
        f'mkdir -p "$MESOS_SANDBOX/{posixpath.dirname(GPU_REPORT)}" && '
        f'printf \'%s\\n\' "$g" >"$MESOS_SANDBOX/{GPU_REPORT}") 2>/dev/null || :'
    )


def container_info(c: ContainerLaunch, runtime_image: str) -> dict[str, Any]:
    """A task's ContainerInfo for the Mesos containerizer: its image (docker image provider),
    volumes (host paths: filesystem/linux; images: volume/image) and the executor's IPC
    namespace and /dev/shm (namespaces/ipc)."""
    mounts = list(c.mounts)
    if c.runtime:
        mounts.append(Mount(RUNTIME_DIR, image=runtime_image, read_only=True))
    return {
        "type": "MESOS",
        "mesos": {"image": _image(c.image)},
        "volumes": [_volume(m) for m in mounts],
        "linux_info": {"ipc_mode": "SHARE_PARENT"},
    }


def _image(reference: str) -> dict[str, Any]:
    return {"type": "DOCKER", "docker": {"name": reference}}


def _volume(m: Mount) -> dict[str, Any]:
    volume: dict[str, Any] = {
        "container_path": m.container_path,
        "mode": "RO" if m.read_only else "RW",
    }
    if m.image:
        volume["image"] = _image(m.image)
    else:
        volume["host_path"] = m.host_path
    return volume


def grace_policy(seconds: int) -> dict[str, Any]:
    """A KillPolicy: SIGTERM, then SIGKILL after ``seconds``."""
    return {"grace_period": {"nanoseconds": int(seconds) * 1_000_000_000}}
