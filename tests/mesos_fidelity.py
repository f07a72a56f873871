"""What peloton relies on a Mesos 1.11 master for, checked the same way on any master.

Each ``check_*`` function takes a master address (``host:port`` of the v1 scheduler API) of a
cluster of a given shape (the constants below) and drives it through a raw v1 scheduler
(:class:`minicluster_support.RawScheduler`), asserting what a real Mesos 1.11 master and its
agents do. ``tests/test_minicluster_fidelity.py`` runs them on the minicluster,
``tests/mesos/test_fidelity.py`` on a local real Mesos cluster: the minicluster is held to
what the real one does.

Observed on the real master (1.11.0), and matched here:

- An empty or unknown FrameworkInfo.user (agents' ``--switch_user``, the default): each task
  is TASK_DROPPED (TASK_LOST without PARTITION_AWARE), REASON_EXECUTOR_TERMINATED,
  SOURCE_AGENT, with a uuid to acknowledge: "Failed to create executor directory
  '<work>/.../executors/<id>/runs/<run>': Failed to chown directory to 'U': No such user 'U'";
  a task group's executor also gets FAILURE with status -1.
- Agents that share a hostname register with their own agent ids, and each is offered.
- Static reservations (``gpus(gpu):2;...``): a MULTI_ROLE framework of role ``gpu`` is offered
  the unreserved resources and those reserved for ``gpu`` as separate entries, never those of
  another role. Without RESERVATION_REFINEMENT entries carry the legacy ``role`` (``gpu`` or
  ``*``); with it, reserved entries carry ``reservations: [{type: STATIC, role: gpu}]`` and
  no ``role``. ``allocation_info: {role: gpu}`` is on every entry and on the offer.
- A launch must name resources as offered. The master injects the offer's allocation_info
  where a resource has none; anything else not in the offer (a reservation the offer lacks,
  more unreserved than offered, another allocation role) is TASK_ERROR from the master:
  REASON_TASK_GROUP_INVALID "Total resources <asked> required by task group and its executor
  are more than available <offer>", or for a LAUNCH REASON_TASK_INVALID "... required by task
  and its executor is more than available ...", resources printed as Mesos prints them
  (:func:`peloton.minicluster.resources.mesos_text`). A task's resources allocated to two roles:
  "Invalid task resources: The resources have multiple allocation roles ('B' and 'A') but only
  one allocation role is allowed".
- Explicit reconciliation of a task the master never received: TASK_UNKNOWN (TASK_LOST without
  PARTITION_AWARE), REASON_RECONCILIATION, SOURCE_MASTER, no uuid.
- A task group's task errors read "Task 'ID' is invalid: ..."; a task naming another agent,
  "Task uses invalid agent X while agent Y is expected"; a DEFAULT executor needs 0.01 cpus,
  32MB mem and some disk: "Executor 'E' uses less CPUs (None) than the minimum required (0.01)",
  "... uses less memory (16MB) than the minimum required (32MB)", "... uses no disk".
- Task containers as peloton sends them: a task group's tasks with a MESOS ContainerInfo (a
  DOCKER image, a read-only host-path volume and a read-only image volume, ``linux_info``
  ``ipc_mode: SHARE_PARENT``) under a DEFAULT executor with a MESOS ContainerInfo of
  ``linux_info`` ``ipc_mode: PRIVATE`` and a ``shm_size`` are accepted; each task goes
  TASK_STARTING, TASK_RUNNING, TASK_FINISHED "Command exited with status 0" (the local real
  agents have no image support: their executors ignore ContainerInfo and run the command on the
  host; the minicluster runs it in the image). A task group's task with a DOCKER ContainerInfo is
  TASK_ERROR from the master, REASON_TASK_GROUP_INVALID: "Task 'ID' is invalid: Docker
  ContainerInfo is not supported on the task".
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from typing import Any

from minicluster_support import CURRENT_USER, EXECUTOR, RawScheduler, framework_info, get, task_info

from peloton.minicluster.resources import mesos_text

# Cluster shapes the checks need.
ROLE = "gpu"
# Agent 0 of the reservations cluster (hostname RESERVED_HOSTNAME): reserved for ROLE, for
# another role, and unreserved.
RESERVED_AGENT = (
    "gpus(gpu):2;cpus(gpu):4;mem(gpu):8192;cpus(other):1;cpus:4;mem:8192;disk:20000;"
    "ports:[31000-32000]"
)
RESERVED_HOSTNAME = "node-r"
PLAIN_AGENT = "cpus:4;mem:4096;disk:10000;gpus:2;ports:[31000-31100]"
# The hostname two agents share (of three: the third is ``node-c``).
SHARED_HOSTNAME = "node-a"
NO_SUCH_USER = "peloton-no-such-user"
TIMEOUT = 30.0
ACCEPT_FILTERS = {"refuse_seconds": 0.0}  # what a launch leaves is offered again at once

Offer = dict[str, Any]


def _scheduler(master: str, **info: Any) -> RawScheduler:
    return RawScheduler(master, framework_info(**info)).subscribe()


def _multi_role(master: str, refinement: bool = False, **info: Any) -> RawScheduler:
    caps = ["GPU_RESOURCES", "PARTITION_AWARE", "MULTI_ROLE"]
    if refinement:
        caps.append("RESERVATION_REFINEMENT")
    return _scheduler(master, roles=[ROLE], capabilities=[{"type": c} for c in caps], **info)


def _leave(sched: RawScheduler) -> None:
    """TEARDOWN (its tasks end and nothing lingers for the failover timeout), then close."""
    try:
        sched.call("TEARDOWN")
    finally:
        sched.close()


def _offer_where(sched: RawScheduler, what: str, match: Callable[[Offer], bool]) -> Offer:
    """The first offer that matches; the others are declined (to come back at once)."""
    seen: list[str] = []
    while True:
        try:
            offer = sched.offer(timeout=TIMEOUT)
        except AssertionError as exc:
            raise AssertionError(f"no offer of {what} (offers seen from: {seen}): {exc}") from None
        if match(offer):
            return offer
        seen.append(f"{offer['hostname']}/{offer['agent_id']['value']}")
        sched.ok("DECLINE", {"offer_ids": [offer["id"]], "filters": ACCEPT_FILTERS})


def _of_agent(agent_id: str) -> Callable[[Offer], bool]:
    return lambda offer: bool(offer["agent_id"]["value"] == agent_id)


def _reserved(resource: dict[str, Any]) -> bool:
    return bool(resource.get("reservations")) or resource.get("role", "*") != "*"


def _reserved_offer(sched: RawScheduler) -> Offer:
    return _offer_where(
        sched, "the agent with reservations", lambda o: any(map(_reserved, o["resources"]))
    )


def _updates_until_terminal(sched: RawScheduler, task_id: str) -> list[dict[str, Any]]:
    """The updates of ``task_id`` up to a terminal one, each acknowledged."""
    out: list[dict[str, Any]] = []
    while not out or out[-1]["state"] in ("TASK_STAGING", "TASK_STARTING", "TASK_RUNNING"):
        status = sched.update(task_id, timeout=TIMEOUT)
        if "uuid" in status:
            sched.ack(status)
        out.append(status)
    return out


def _scalar(name: str, value: float, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": "SCALAR", "scalar": {"value": value}, **extra}


def _entries(offer: Offer, name: str) -> list[dict[str, Any]]:
    return [r for r in offer["resources"] if r["name"] == name]


# ---------------------------------------------------------------------- framework user


def check_unknown_user_fails_every_executor(master: str, user: str, partition_aware: bool) -> None:
    """Any cluster. A task group and a command task of a framework whose user is ``user``
    (empty or unknown) are dropped by the agent, as ``--switch_user`` agents do."""
    caps = [{"type": "GPU_RESOURCES"}]
    if partition_aware:
        caps.append({"type": "PARTITION_AWARE"})
    sched = _scheduler(master, user=user, capabilities=caps)
    state = "TASK_DROPPED" if partition_aware else "TASK_LOST"
    try:
        executor_id = f"ex-{uuid.uuid4().hex[:8]}"
        offer = sched.offer(timeout=TIMEOUT)
        sched.launch_group(
            offer, [task_info("group-task", "true")], executor_id, filters=ACCEPT_FILTERS
        )
        (status,) = _updates_until_terminal(sched, "group-task")
        _assert_dropped(status, state, user, executor_id)
        failure = sched.take("FAILURE", TIMEOUT, lambda e: "executor_id" in e["failure"])
        assert failure["failure"] == {
            "agent_id": offer["agent_id"],
            "executor_id": {"value": executor_id},
            "status": -1,
        }, failure

        offer = sched.offer(timeout=TIMEOUT)
        command = dict(task_info("command-task", "true"), agent_id=offer["agent_id"])
        launch = {"type": "LAUNCH", "launch": {"task_infos": [command]}}
        sched.ok(
            "ACCEPT",
            {"offer_ids": [offer["id"]], "operations": [launch], "filters": ACCEPT_FILTERS},
        )
        (status,) = _updates_until_terminal(sched, "command-task")
        _assert_dropped(status, state, user, "command-task")
    finally:
        _leave(sched)


def _assert_dropped(status: dict[str, Any], state: str, user: str, executor_id: str) -> None:
    seen = json.dumps(status)
    assert status["state"] == state, seen
    assert status["reason"] == "REASON_EXECUTOR_TERMINATED", seen
    assert status["source"] == "SOURCE_AGENT", seen
    assert status["executor_id"] == {"value": executor_id}, seen
    assert "uuid" in status, seen  # the agent's update: re-sent until acknowledged
    expected = (
        r"Failed to create executor directory '[^']*/executors/"
        + re.escape(executor_id)
        + r"/runs/[^'/]+': Failed to chown directory to '"
        + re.escape(user)
        + r"': No such user '"
        + re.escape(user)
        + "'"
    )
    assert re.fullmatch(expected, status["message"]), seen


def check_an_unknown_task_is_reconciled_unknown(master: str, partition_aware: bool) -> None:
    """Any cluster. Explicit reconciliation of a task the master never received (a launch lost
    on its way) answers TASK_UNKNOWN (TASK_LOST without PARTITION_AWARE), REASON_RECONCILIATION,
    SOURCE_MASTER, with no uuid: peloton tells such a launch from a failure by it."""
    caps = [{"type": "GPU_RESOURCES"}]
    if partition_aware:
        caps.append({"type": "PARTITION_AWARE"})
    sched = _scheduler(master, capabilities=caps)
    try:
        task_id = f"never-sent-{uuid.uuid4().hex[:8]}"
        sched.ok("RECONCILE", {"tasks": [{"task_id": {"value": task_id}}]})
        status = sched.update(task_id, timeout=TIMEOUT)
        expected = "TASK_UNKNOWN" if partition_aware else "TASK_LOST"
        assert (status["state"], status.get("reason"), status.get("source")) == (
            expected,
            "REASON_RECONCILIATION",
            "SOURCE_MASTER",
        ), status
        assert "uuid" not in status, status
    finally:
        _leave(sched)


def check_known_user_runs(master: str) -> None:
    """Any cluster. The framework user this process runs as: the task runs to TASK_FINISHED."""
    sched = _scheduler(master, user=CURRENT_USER)
    try:
        sched.launch_group(sched.offer(timeout=TIMEOUT), [task_info("mine", "true")])
        states = [s["state"] for s in _updates_until_terminal(sched, "mine")]
        assert states[-1] == "TASK_FINISHED", states
    finally:
        _leave(sched)


def check_task_groups_share_one_accept(master: str) -> None:
    """An agent of PLAIN_AGENT. One ACCEPT of its offer with two LAUNCH_GROUP operations, each
    with its executor and one of its two GPUs (two gangs placed on one host in one round):
    both groups' tasks run to TASK_FINISHED."""
    sched = _scheduler(master, user=CURRENT_USER)
    try:
        offer = sched.offer(timeout=TIMEOUT)
        ops = [
            sched.group_op(offer, [task_info(task_id, "true", gpus=1)])
            for task_id in ("group-a", "group-b")
        ]
        sched.accept(offer, ops, ACCEPT_FILTERS)
        for task_id in ("group-a", "group-b"):
            states = [s["state"] for s in _updates_until_terminal(sched, task_id)]
            assert states[-1] == "TASK_FINISHED", (task_id, states)
    finally:
        _leave(sched)


# ---------------------------------------------------------------------- shared hostnames


def check_agents_sharing_a_hostname_are_each_offered(master: str) -> None:
    """Three agents, two of them of hostname SHARED_HOSTNAME. Both register with their own
    agent ids; each is offered, and runs a task."""
    _, _, body = get(master, "/master/state")
    slaves = json.loads(body)["slaves"]
    shared = sorted(s["id"] for s in slaves if s["hostname"] == SHARED_HOSTNAME)
    assert len(shared) == 2 and len(set(shared)) == 2, slaves
    sched = _scheduler(master)
    try:
        for n, agent_id in enumerate(shared):
            offer = _offer_where(sched, f"agent {agent_id}", _of_agent(agent_id))
            assert offer["hostname"] == SHARED_HOSTNAME, offer
            task_id = f"on-{n}"
            sched.launch_group(offer, [task_info(task_id, "true")], filters=ACCEPT_FILTERS)
            updates = _updates_until_terminal(sched, task_id)
            assert updates[-1]["state"] == "TASK_FINISHED", updates
            assert updates[-1]["agent_id"] == {"value": agent_id}, updates
    finally:
        _leave(sched)


# ---------------------------------------------------------------------- reservations


def check_reserved_resources_are_offered_as_reserved(master: str) -> None:
    """Agent 0 has RESERVED_AGENT. A MULTI_ROLE framework of ROLE gets its reservations and
    the unreserved resources as separate entries, in both formats, never another role's."""
    for refinement in (False, True):
        sched = _multi_role(master, refinement)
        try:
            offer = _reserved_offer(sched)
        finally:
            _leave(sched)
        seen = json.dumps(offer)
        assert offer["allocation_info"] == {"role": ROLE}, seen
        for resource in offer["resources"]:
            assert resource["allocation_info"] == {"role": ROLE}, seen
            if refinement:
                assert "role" not in resource, seen
            else:
                assert "reservations" not in resource, seen

        def amounts(name: str, reserved: bool, offer: Offer = offer) -> list[float]:
            return [r["scalar"]["value"] for r in _entries(offer, name) if _reserved(r) == reserved]

        assert amounts("gpus", True) == [2] and amounts("gpus", False) == [], seen
        assert amounts("cpus", True) == [4] and amounts("cpus", False) == [4], seen
        assert amounts("mem", True) == [8192] and amounts("mem", False) == [8192], seen
        assert amounts("disk", True) == [] and amounts("disk", False) == [20000], seen
        for resource in offer["resources"]:
            if not _reserved(resource):
                assert resource.get("role", "*") == "*", seen
            elif refinement:
                assert resource["reservations"] == [{"type": "STATIC", "role": ROLE}], seen
            else:
                assert resource["role"] == ROLE, seen


def check_reservations_are_not_offered_to_other_roles(master: str) -> None:
    """Agent 0 has RESERVED_AGENT. A framework of the default role ``*`` (no MULTI_ROLE) gets
    only its unreserved resources, with the legacy ``role: *`` and no allocation_info."""
    sched = _scheduler(master)
    try:
        offer = sched.offer(RESERVED_HOSTNAME, timeout=TIMEOUT)
    finally:
        _leave(sched)
    seen = json.dumps(offer)
    assert "allocation_info" not in offer, seen
    for resource in offer["resources"]:
        assert resource["role"] == "*" and "allocation_info" not in resource, seen
        assert "reservations" not in resource, seen
    cpus = [r["scalar"]["value"] for r in _entries(offer, "cpus")]
    assert cpus == [4] and _entries(offer, "gpus") == [], seen


def check_launch_takes_resources_as_offered(master: str) -> None:
    """Agent 0 has RESERVED_AGENT. A task group naming reserved and unreserved resources as
    offered runs; so does one whose resources lack allocation_info (the master injects it)."""
    sched = _multi_role(master)

    def whole(offer: Offer) -> bool:  # all of the agent's reserved cpus and gpus
        held = {r["name"]: r["scalar"]["value"] for r in offer["resources"] if _reserved(r)}
        return held.get("cpus") == 4 and held.get("gpus") == 2

    try:
        offer = _offer_where(sched, "the agent's reserved cpus and gpus", whole)
        reserved = {r["name"]: r for r in offer["resources"] if _reserved(r)}
        task = task_info("as-offered", "true")
        task["resources"] = [
            dict(reserved["gpus"], scalar={"value": 2}),
            dict(reserved["cpus"], scalar={"value": 4}),
            _scalar("mem", 64, role="*", allocation_info={"role": ROLE}),
        ]
        executor = [dict(r, allocation_info={"role": ROLE}, role="*") for r in EXECUTOR]
        sched.launch_group(offer, [task], executor_resources=executor, filters=ACCEPT_FILTERS)
        states = [s["state"] for s in _updates_until_terminal(sched, "as-offered")]
        assert states[-1] == "TASK_FINISHED", states

        offer = _reserved_offer(sched)
        task = task_info("injected", "true")
        task["resources"] = [_scalar("cpus", 0.5), _scalar("mem", 64, role=ROLE)]
        sched.launch_group(offer, [task], filters=ACCEPT_FILTERS)
        states = [s["state"] for s in _updates_until_terminal(sched, "injected")]
        assert states[-1] == "TASK_FINISHED", states
    finally:
        _leave(sched)


def check_launch_not_as_offered_is_refused(master: str) -> None:
    """Agent 0 has RESERVED_AGENT. Resources the offer does not hold as named are refused by
    the master with TASK_ERROR and Mesos's own message."""
    other = {"allocation_info": {"role": "other"}}
    cases: list[tuple[str, list[dict[str, Any]]]] = [
        # More unreserved cpus than unreserved (the reserved ones do not count).
        ("unreserved", [_scalar("cpus", 6, role="*"), _scalar("mem", 64, role="*")]),
        # Another role's reservation.
        ("other-role", [_scalar("cpus", 1, role="other"), _scalar("mem", 64, role="*")]),
        # Allocated to a role the offer is not.
        ("wrong-allocation", [_scalar("cpus", 1, role=ROLE, **other), _scalar("mem", 64, **other)]),
    ]
    sched = _multi_role(master)
    try:
        for task_id, resources in cases:
            offer = _reserved_offer(sched)
            task = dict(task_info(task_id, "true"), resources=resources)
            sched.launch_group(offer, [task], filters=ACCEPT_FILTERS)
            (status,) = _updates_until_terminal(sched, task_id)
            asked = mesos_text(resources + EXECUTOR, ROLE)
            available = mesos_text(offer["resources"], ROLE)
            _assert_error(
                status,
                "REASON_TASK_GROUP_INVALID",
                f"Total resources {asked} required by task group and its executor are more "
                f"than available {available}",
            )

        offer = _reserved_offer(sched)
        resources = [_scalar("cpus", 6, role="*"), _scalar("mem", 64, role="*")]
        command = dict(task_info("command", "true"), agent_id=offer["agent_id"])
        command["resources"] = resources
        launch = {"type": "LAUNCH", "launch": {"task_infos": [command]}}
        sched.ok(
            "ACCEPT",
            {"offer_ids": [offer["id"]], "operations": [launch], "filters": ACCEPT_FILTERS},
        )
        (status,) = _updates_until_terminal(sched, "command")
        _assert_error(
            status,
            "REASON_TASK_INVALID",
            f"Total resources {mesos_text(resources, ROLE)} required by task and its executor "
            f"is more than available {mesos_text(offer['resources'], ROLE)}",
        )

        # A task's resources allocated to two roles (the master injects the offer's role where
        # allocation_info is absent).
        mixed = [_scalar("cpus", 1, role=ROLE, **other), _scalar("mem", 64, role=ROLE)]
        roles_error = (
            "Invalid task resources: The resources have multiple allocation roles "
            f"('{ROLE}' and 'other') but only one allocation role is allowed"
        )
        offer = _reserved_offer(sched)
        sched.launch_group(
            offer, [dict(task_info("mixed", "true"), resources=mixed)], filters=ACCEPT_FILTERS
        )
        (status,) = _updates_until_terminal(sched, "mixed")
        _assert_error(
            status, "REASON_TASK_GROUP_INVALID", f"Task 'mixed' is invalid: {roles_error}"
        )
        offer = _reserved_offer(sched)
        command = dict(task_info("mixed-command", "true"), agent_id=offer["agent_id"])
        command["resources"] = mixed
        launch = {"type": "LAUNCH", "launch": {"task_infos": [command]}}
        sched.ok(
            "ACCEPT",
            {"offer_ids": [offer["id"]], "operations": [launch], "filters": ACCEPT_FILTERS},
        )
        (status,) = _updates_until_terminal(sched, "mixed-command")
        _assert_error(status, "REASON_TASK_INVALID", roles_error)
    finally:
        _leave(sched)


def _assert_error(status: dict[str, Any], reason: str, message: str) -> None:
    seen = json.dumps(status)
    assert "agent_id" in status, seen
    assert (status["state"], status["reason"], status["source"]) == (
        "TASK_ERROR",
        reason,
        "SOURCE_MASTER",
    ), seen
    assert "uuid" not in status, seen  # the master's own update: nothing to acknowledge
    assert status["message"] == message, seen


# ---------------------------------------------------------------------- task and executor checks


def check_bad_executors_and_agents_are_refused(master: str) -> None:
    """Any cluster. A DEFAULT executor with too few cpus or mem, or no disk, and a task naming
    another agent are refused with Mesos's words."""
    sched = _scheduler(master)

    def executor(cpus: float, mem: float, disk: float) -> list[dict[str, Any]]:
        amounts = {"cpus": cpus, "mem": mem, "disk": disk}
        return [_scalar(name, value) for name, value in amounts.items() if value]

    cases = [
        (executor(0, 32, 10), "uses less CPUs (None) than the minimum required (0.01)"),
        (executor(0.005, 32, 10), "uses less CPUs (0.005) than the minimum required (0.01)"),
        (executor(0.1, 0, 10), "uses less memory (None) than the minimum required (32MB)"),
        (executor(0.1, 16.5, 10), "uses less memory (16MB) than the minimum required (32MB)"),
        (executor(0.1, 32, 0), "uses no disk"),
    ]
    try:
        for n, (resources, error) in enumerate(cases):
            task_id, executor_id = f"executor-{n}", f"ex-{n}-{uuid.uuid4().hex[:8]}"
            offer = sched.offer(timeout=TIMEOUT)
            sched.launch_group(
                offer, [task_info(task_id, "true")], executor_id, resources, ACCEPT_FILTERS
            )
            (status,) = _updates_until_terminal(sched, task_id)
            _assert_error(status, "REASON_TASK_GROUP_INVALID", f"Executor '{executor_id}' {error}")

        def wrong(offer: Offer) -> str:
            agent = offer["agent_id"]["value"]
            return f"Task uses invalid agent no-such-agent while agent {agent} is expected"

        offer = sched.offer(timeout=TIMEOUT)
        elsewhere = dict(task_info("elsewhere", "true"), agent_id={"value": "no-such-agent"})
        sched.launch_group(offer, [elsewhere], filters=ACCEPT_FILTERS)
        (status,) = _updates_until_terminal(sched, "elsewhere")
        _assert_error(
            status, "REASON_TASK_GROUP_INVALID", f"Task 'elsewhere' is invalid: {wrong(offer)}"
        )
        offer = sched.offer(timeout=TIMEOUT)
        elsewhere = dict(elsewhere, task_id={"value": "elsewhere-command"})
        launch = {"type": "LAUNCH", "launch": {"task_infos": [elsewhere]}}
        sched.ok(
            "ACCEPT",
            {"offer_ids": [offer["id"]], "operations": [launch], "filters": ACCEPT_FILTERS},
        )
        (status,) = _updates_until_terminal(sched, "elsewhere-command")
        _assert_error(status, "REASON_TASK_INVALID", wrong(offer))
    finally:
        _leave(sched)


# ---------------------------------------------------------------------- task containers


def _image(name: str) -> dict[str, Any]:
    return {"type": "DOCKER", "docker": {"name": name}}


def check_containers_of_a_task_group_run(
    master: str, image: str, volume_image: str, host_dir: str
) -> None:
    """Agents with the images ``image`` and ``volume_image`` (a real agent without image support
    ignores them). A task group of two tasks in ``image``, each with ``host_dir`` (a directory
    that exists) and ``volume_image`` mounted read-only and the executor's IPC namespace, whose
    executor has a /dev/shm of its own (peloton's shape: :mod:`peloton.hostmgr.launch`), is
    accepted and its tasks run ``true`` to TASK_FINISHED."""
    container = {
        "type": "MESOS",
        "mesos": {"image": _image(image)},
        "volumes": [
            {"container_path": "/data", "mode": "RO", "host_path": host_dir},
            {"container_path": "/opt/peloton", "mode": "RO", "image": _image(volume_image)},
        ],
        "linux_info": {"ipc_mode": "SHARE_PARENT"},
    }
    sched = _scheduler(master)
    try:
        offer = sched.offer(timeout=TIMEOUT)
        task_ids = ["in-image-0", "in-image-1"]
        tasks = [
            dict(task_info(t, "true"), agent_id=offer["agent_id"], container=container)
            for t in task_ids
        ]
        executor = {
            "type": "DEFAULT",
            "executor_id": {"value": f"ex-{uuid.uuid4().hex[:8]}"},
            "framework_id": {"value": sched.framework_id},
            "resources": EXECUTOR,
            "container": {"type": "MESOS", "linux_info": {"ipc_mode": "PRIVATE", "shm_size": 64}},
        }
        launch = {
            "type": "LAUNCH_GROUP",
            "launch_group": {"executor": executor, "task_group": {"tasks": tasks}},
        }
        sched.ok(
            "ACCEPT",
            {"offer_ids": [offer["id"]], "operations": [launch], "filters": ACCEPT_FILTERS},
        )
        for task_id in task_ids:
            updates = _updates_until_terminal(sched, task_id)
            seen = json.dumps(updates)
            states = [s["state"] for s in updates]
            assert states == ["TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"], seen
            assert updates[-1]["message"] == "Command exited with status 0", seen
    finally:
        _leave(sched)


def check_docker_containers_in_a_task_group_are_refused(master: str) -> None:
    """Any cluster. A task group's task with a DOCKER ContainerInfo is refused by the master."""
    sched = _scheduler(master)
    try:
        docker = task_info("docker", "true")
        docker["container"] = {"type": "DOCKER", "docker": {"image": "base:1"}}
        sched.launch_group(sched.offer(timeout=TIMEOUT), [docker], filters=ACCEPT_FILTERS)
        (status,) = _updates_until_terminal(sched, "docker")
        _assert_error(
            status,
            "REASON_TASK_GROUP_INVALID",
            "Task 'docker' is invalid: Docker ContainerInfo is not supported on the task",
        )
    finally:
        _leave(sched)
