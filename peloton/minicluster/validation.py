"""Validation of LAUNCH and LAUNCH_GROUP operations, as a Mesos 1.x master does it. Pure.

A LAUNCH is judged task by task (a bad task gets TASK_ERROR, the rest launch); a LAUNCH_GROUP is
all or nothing (every task of a bad group gets TASK_ERROR with REASON_TASK_GROUP_INVALID).

Resources must be named as offered: reserved ones with their role (``reservations`` or the legacy
``role``), unreserved ones without, and each ``allocation_info`` (where given; the master injects
the offer's where not) naming the offer's role. Otherwise they are not in the offer, and the
error is Mesos 1.11's: "Total resources cpus(allocated: gpu):6; ... required by task group and
its executor are more than available ..." (resources printed as :func:`mesos_text` does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from peloton.minicluster.resources import ResourceSet, allocation_roles, from_json, mesos_text

# What a Mesos 1.11 master requires of a DEFAULT executor (it runs its tasks in nested
# containers): at least MIN_CPUS cpus and MIN_MEM MB of mem, and some disk.
MIN_CPUS = 0.01
MIN_MEM = 32


class Invalid(Exception):
    """An operation or task is invalid; the message is what the TASK_ERROR update says."""


@dataclass
class Planned:
    """A task that passed validation, with what it uses."""

    info: dict[str, Any]
    task_id: str
    resources: ResourceSet


@dataclass
class PlannedGroup:
    """A valid LAUNCH_GROUP: the executor (and what it adds, empty if already running)."""

    executor: dict[str, Any]
    executor_id: str
    executor_resources: ResourceSet
    tasks: list[Planned] = field(default_factory=list)


def task_ids_of(infos: Sequence[Any]) -> list[str]:
    """The task ids of (possibly malformed) TaskInfos, for the TASK_ERROR updates."""
    out = []
    for info in infos:
        tid = info.get("task_id", {}) if isinstance(info, dict) else {}
        value = tid.get("value") if isinstance(tid, dict) else None
        if isinstance(value, str) and value:
            out.append(value)
    return out


def _task_id(info: Any) -> str:
    if not isinstance(info, dict):
        raise Invalid("TaskInfo must be an object")
    tid = info.get("task_id")
    value = tid.get("value") if isinstance(tid, dict) else None
    if not isinstance(value, str) or not value:
        raise Invalid("Task is missing 'task_id.value'")
    if "/" in value or value in (".", ".."):
        raise Invalid(f"Task ID '{value}' contains invalid characters")
    return value


def _check_task(
    info: dict[str, Any], task_id: str, agent_id: str, in_use: Callable[[str], bool], role: str
) -> ResourceSet:
    if not isinstance(info.get("name"), str):
        raise Invalid(f"Task '{task_id}' is missing the required field 'name'")
    if in_use(task_id):
        raise Invalid(f"Task has duplicate ID: {task_id}")
    given = info.get("agent_id", {})
    if not isinstance(given, dict) or given.get("value") != agent_id:
        named = given.get("value") if isinstance(given, dict) else given
        raise Invalid(f"Task uses invalid agent {named} while agent {agent_id} is expected")
    try:
        res = from_json(info.get("resources", []), "resources")
    except ValueError as exc:
        raise Invalid(f"Task '{task_id}' has invalid resources: {exc}") from None
    _check_single_role(info["resources"], role)
    return res


def _check_single_role(resources: list[Any], role: str) -> None:
    """Mesos's check that a task's resources (allocation_info injected where absent) are all
    allocated to one role."""
    first: str | None = None
    for res in resources:
        info = res.get("allocation_info")
        given = info.get("role") if isinstance(info, dict) else None
        this = given if isinstance(given, str) else role
        if first is None:
            first = this
        elif this != first:
            raise Invalid(
                "Invalid task resources: The resources have multiple allocation roles"
                f" ('{this}' and '{first}') but only one allocation role is allowed"
            )


def _check_command(info: dict[str, Any], task_id: str) -> None:
    command = info.get("command")
    if not isinstance(command, dict):
        raise Invalid(f"Task '{task_id}' has no CommandInfo")
    shell = command.get("shell", True)
    if not isinstance(shell, bool):
        raise Invalid(f"Task '{task_id}': 'command.shell' must be a boolean")
    value = command.get("value", "")
    # In an image, a command without a value runs the image's ENTRYPOINT (or CMD).
    optional = not shell and _has_image(info)
    if not isinstance(value, str) or not (value or optional):
        what = "a shell command" if shell else "the program"
        raise Invalid(f"Task '{task_id}': 'command.value' ({what}) is required")
    args = command.get("arguments", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise Invalid(f"Task '{task_id}': 'command.arguments' must be a list of strings")
    env = command.get("environment", {})
    variables = env.get("variables", []) if isinstance(env, dict) else None
    if not isinstance(variables, list) or not all(
        isinstance(v, dict) and isinstance(v.get("name"), str) and v["name"] for v in variables
    ):
        raise Invalid(
            f"Task '{task_id}': 'command.environment.variables' must be a list of {{name, value}}"
        )


def _has_image(info: dict[str, Any]) -> bool:
    container = info.get("container")
    mesos = container.get("mesos") if isinstance(container, dict) else None
    return isinstance(mesos, dict) and isinstance(mesos.get("image"), dict)


def _check_container(container: Any, whose: str) -> None:
    """Mesos's ContainerInfo validation (common to tasks and executors); ``whose`` is "Task's"
    or "Executor's"."""
    if container is None:
        return
    if not isinstance(container, dict) or not isinstance(container.get("volumes", []), list):
        raise Invalid(f"{whose} `ContainerInfo` must be an object with a list of 'volumes'")
    problem = ""
    for volume in container.get("volumes", []):
        sources = [k for k in ("host_path", "image", "source") if k in _dict(volume)]
        if len(sources) != 1:
            problem = (
                "Invalid volume: Only one of them should be set: 'host_path', 'image' and 'source'"
            )
            break
    if not problem and container.get("type") == "DOCKER" and "docker" not in container:
        problem = "DockerInfo 'docker' is not set for DOCKER typed ContainerInfo"
    if problem:
        raise Invalid(f"{whose} `ContainerInfo` is invalid: {problem}")


def _check_group_container(container: Any, what: str) -> None:
    """A task group's tasks and executor run in the Mesos containerizer: no DOCKER."""
    _check_container(container, "Task's" if what == "task" else "Executor's")
    if isinstance(container, dict) and container.get("type") == "DOCKER":
        raise Invalid(f"Docker ContainerInfo is not supported on the {what}")


def missing_fields(call: dict[str, Any]) -> list[str]:
    """The protobuf-required fields an ACCEPT's containers lack, as Mesos names them when it
    refuses the call ("Missing required fields: accept.operations[0]...docker.name")."""
    missing: list[str] = []
    for i, op in enumerate(_list(_dict(call.get("accept")).get("operations"))):
        prefix = f"accept.operations[{i}]"
        group = _dict(_dict(op).get("launch_group"))
        tasks = _list(_dict(group.get("task_group")).get("tasks"))
        infos = [(f"{prefix}.launch_group.task_group.tasks[{j}]", t) for j, t in enumerate(tasks)]
        infos.append((f"{prefix}.launch_group.executor", group.get("executor")))
        launched = _list(_dict(_dict(op).get("launch")).get("task_infos"))
        infos += [(f"{prefix}.launch.task_infos[{j}]", t) for j, t in enumerate(launched)]
        for path, info in infos:
            container = _dict(info).get("container")
            if isinstance(container, dict):
                missing += _missing_in_container(f"{path}.container", container)
    return missing


def _missing_in_container(path: str, container: dict[str, Any]) -> list[str]:
    missing = [] if "type" in container else [f"{path}.type"]
    image = _dict(container.get("mesos")).get("image")
    if isinstance(image, dict):
        missing += _missing_in_image(f"{path}.mesos.image", image)
    for k, volume in enumerate(_list(container.get("volumes"))):
        if not isinstance(volume, dict):
            continue
        where = f"{path}.volumes[{k}]"
        missing += [f"{where}.{f}" for f in ("container_path", "mode") if f not in volume]
        if isinstance(volume.get("image"), dict):
            missing += _missing_in_image(f"{where}.image", volume["image"])
    return missing


def _missing_in_image(path: str, image: dict[str, Any]) -> list[str]:
    missing = [] if "type" in image else [f"{path}.type"]
    for kind in ("docker", "appc"):
        if isinstance(image.get(kind), dict) and "name" not in image[kind]:
            missing.append(f"{path}.{kind}.name")
    return missing


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def plan_launch(
    infos: Any,
    agent_id: str,
    remaining: ResourceSet,
    in_use: Callable[[str], bool],
    role: str = "*",
) -> tuple[list[Planned], list[tuple[str, str]], ResourceSet]:
    """(valid tasks, [(task id, error)] for invalid ones, remaining resources) of a LAUNCH of
    offers allocated to ``role``.

    Command tasks only (a custom executor is not supported here and is reported as invalid).
    """
    planned: list[Planned] = []
    errors: list[tuple[str, str]] = []
    if not isinstance(infos, list):
        return [], [], remaining
    seen: set[str] = set()
    for info in infos:
        try:
            task_id = _task_id(info)
        except Invalid:
            continue  # nobody to tell: no task id
        try:
            res = _check_task(info, task_id, agent_id, lambda t: in_use(t) or t in seen, role)
            if "executor" in info and "command" in info:
                raise Invalid(
                    "Task should have at least one (but not both) of CommandInfo or "
                    "ExecutorInfo present"
                )
            if "executor" in info:
                raise Invalid("Custom executors are not supported by the minicluster")
            _check_command(info, task_id)
            _check_container(info.get("container"), "Task's")
            if res.is_empty():
                raise Invalid(f"Task '{task_id}' uses no resources")
            _check_available(
                info.get("resources"), res, remaining, role, "task and its executor is"
            )
        except Invalid as exc:
            errors.append((task_id, str(exc)))
            seen.add(task_id)
            continue
        seen.add(task_id)
        remaining = remaining - res
        planned.append(Planned(info, task_id, res))
    return planned, errors, remaining


def plan_group(
    launch_group: Any,
    framework_id: str,
    agent_id: str,
    remaining: ResourceSet,
    in_use: Callable[[str], bool],
    executor_running: Callable[[str], bool],
    role: str = "*",
) -> PlannedGroup:
    """The plan of a valid LAUNCH_GROUP of offers allocated to ``role``; raises Invalid with the
    reason otherwise."""
    if not isinstance(launch_group, dict):
        raise Invalid("Expecting 'launch_group' to be present")
    executor = launch_group.get("executor")
    group = launch_group.get("task_group")
    tasks = group.get("tasks") if isinstance(group, dict) else None
    if not isinstance(tasks, list) or not tasks:
        raise Invalid("Task group must have at least one task")
    planned: list[Planned] = []
    seen: set[str] = set()
    total = ResourceSet()
    named: list[Any] = []
    for info in tasks:
        task_id = _task_id(info)
        if task_id in seen:
            # (A Mesos 1.11 master aborts on this: "Check failed: ... Duplicate task".)
            raise Invalid(f"Duplicate task '{task_id}' in the task group")
        seen.add(task_id)
        try:
            res = _check_task(info, task_id, agent_id, in_use, role)
            if "executor" in info:
                raise Invalid(f"Task '{task_id}' in a task group must not set 'executor'")
            _check_command(info, task_id)
            _check_group_container(info.get("container"), "task")
        except Invalid as exc:  # as Mesos words a group's task errors
            raise Invalid(f"Task '{task_id}' is invalid: {exc}") from None
        total = total + res
        named += info.get("resources") or []
        planned.append(Planned(info, task_id, res))
    executor_id, exec_res = _check_executor(executor, framework_id, executor_running)
    assert isinstance(executor, dict)
    plan = PlannedGroup(executor, executor_id, exec_res, planned)
    total = total + exec_res
    if not exec_res.is_empty():
        named += executor.get("resources") or []
    _check_available(named, total, remaining, role, "task group and its executor are")
    return plan


def _check_available(
    named: Any, total: ResourceSet, remaining: ResourceSet, role: str, what: str
) -> None:
    """Raise Invalid as a Mesos master does unless the resources ``named`` (JSON; ``total``
    parsed) are in what is left of offers allocated to ``role``."""
    if remaining.contains(total) and allocation_roles(named) <= {role}:
        return
    raise Invalid(
        f"Total resources {mesos_text(named or [], role)} required by {what} more than "
        f"available {mesos_text(remaining.to_json(role), role)}"
    )


def _check_executor(
    executor: Any, framework_id: str, executor_running: Callable[[str], bool]
) -> tuple[str, ResourceSet]:
    if not isinstance(executor, dict):
        raise Invalid("Expecting 'launch_group.executor' to be present")
    eid = executor.get("executor_id", {})
    executor_id = eid.get("value") if isinstance(eid, dict) else None
    if not isinstance(executor_id, str) or not executor_id or "/" in executor_id:
        raise Invalid("Executor is missing a valid 'executor_id.value'")
    if executor.get("type") != "DEFAULT":
        raise Invalid(
            f"Executor '{executor_id}': 'type' must be 'DEFAULT' for a task group "
            f"(got {executor.get('type', 'UNKNOWN')})"
        )
    if "command" in executor:
        raise Invalid(f"Executor '{executor_id}': 'command' must not be set for 'DEFAULT'")
    _check_group_container(executor.get("container"), "executor")
    fid = executor.get("framework_id", {})
    if isinstance(fid, dict) and fid and fid.get("value") != framework_id:
        raise Invalid(
            f"ExecutorInfo has an invalid FrameworkID (Actual: {fid.get('value')} vs "
            f"Expected: {framework_id})"
        )
    try:
        res = from_json(executor.get("resources", []), "executor.resources")
    except ValueError as exc:
        raise Invalid(f"Executor '{executor_id}' has invalid resources: {exc}") from None
    if executor_running(executor_id):
        return executor_id, ResourceSet()  # the running executor already holds its own
    _check_executor_minimum(executor_id, res)
    return executor_id, res


def _check_executor_minimum(executor_id: str, res: ResourceSet) -> None:
    """Raise Invalid in a Mesos 1.11 master's words if a new DEFAULT executor has too little."""
    cpus = res.scalar("cpus")
    if cpus < MIN_CPUS:
        raise Invalid(
            f"Executor '{executor_id}' uses less CPUs ({f'{cpus:.15g}' if cpus else 'None'})"
            f" than the minimum required ({MIN_CPUS:g})"
        )
    mem = int(res.scalar("mem"))  # whole megabytes, as Resources::mem() truncates
    if mem < MIN_MEM:
        raise Invalid(
            f"Executor '{executor_id}' uses less memory ({_megabytes(mem) if mem else 'None'})"
            f" than the minimum required ({_megabytes(MIN_MEM)})"
        )
    if res.scalar("disk") <= 0:
        raise Invalid(f"Executor '{executor_id}' uses no disk")


def _megabytes(mb: int) -> str:
    """Mesos's Bytes printed: the largest unit that loses nothing (``32MB``, ``2GB``)."""
    for unit, size in (("TB", 1024 * 1024), ("GB", 1024)):
        if mb % size == 0:
            return f"{mb // size}{unit}"
    return f"{mb}MB"
