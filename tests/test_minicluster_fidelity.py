"""The minicluster behaves as a real Mesos 1.11 master and agents do in what peloton relies on:
the checks of ``mesos_fidelity`` (run on a real cluster by ``tests/mesos/test_fidelity.py``),
then what only the minicluster can show (tasks switched to the framework's user; addressing
agents that share a hostname)."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import mesos_fidelity as fidelity
import pytest
from minicluster_support import (  # noqa: F401 (fixtures)
    MiniclusterFactory,
    RawScheduler,
    fixture_make_minicluster,
    framework_info,
    get,
    task_info,
)

from peloton.minicluster import AgentSpec, Minicluster

SHARED = [
    AgentSpec(fidelity.SHARED_HOSTNAME, fidelity.PLAIN_AGENT, ""),
    AgentSpec(fidelity.SHARED_HOSTNAME, fidelity.PLAIN_AGENT, ""),
    AgentSpec("node-c", fidelity.PLAIN_AGENT, ""),
]
RESERVED = [
    AgentSpec(fidelity.RESERVED_HOSTNAME, fidelity.RESERVED_AGENT, ""),
    AgentSpec("node-p", fidelity.PLAIN_AGENT, ""),
]


@pytest.mark.parametrize("partition_aware", [True, False])
@pytest.mark.parametrize("user", ["", fidelity.NO_SUCH_USER])
def test_an_empty_or_unknown_user_fails_every_executor(
    make_minicluster: MiniclusterFactory, user: str, partition_aware: bool
) -> None:
    mc = make_minicluster(agents=1)
    fidelity.check_unknown_user_fails_every_executor(mc.address, user, partition_aware)
    assert all(t.state in ("TASK_DROPPED", "TASK_LOST") for t in mc.tasks())
    fidelity.check_known_user_runs(mc.address)


def test_task_groups_share_one_accept(make_minicluster: MiniclusterFactory) -> None:
    fidelity.check_task_groups_share_one_accept(make_minicluster(agents=1).address)


@pytest.mark.parametrize("partition_aware", [True, False])
def test_an_unknown_task_is_reconciled_unknown(
    make_minicluster: MiniclusterFactory, partition_aware: bool
) -> None:
    fidelity.check_an_unknown_task_is_reconciled_unknown(
        make_minicluster(agents=1).address, partition_aware
    )


def test_an_unknown_user_fails_simulated_executors_too(
    make_minicluster: MiniclusterFactory,
) -> None:
    mc = make_minicluster(agents=1, simulated=True)
    fidelity.check_unknown_user_fails_every_executor(mc.address, fidelity.NO_SUCH_USER, True)


def test_agents_sharing_a_hostname_are_each_offered(make_minicluster: MiniclusterFactory) -> None:
    mc = make_minicluster(agents=SHARED)
    fidelity.check_agents_sharing_a_hostname_are_each_offered(mc.address)


def test_reserved_resources_are_offered_as_reserved(make_minicluster: MiniclusterFactory) -> None:
    mc = make_minicluster(agents=RESERVED)
    fidelity.check_reserved_resources_are_offered_as_reserved(mc.address)


def test_reservations_are_not_offered_to_other_roles(
    make_minicluster: MiniclusterFactory,
) -> None:
    mc = make_minicluster(agents=RESERVED)
    fidelity.check_reservations_are_not_offered_to_other_roles(mc.address)


def test_launch_takes_resources_as_offered(make_minicluster: MiniclusterFactory) -> None:
    mc = make_minicluster(agents=RESERVED)
    fidelity.check_launch_takes_resources_as_offered(mc.address)


def test_launch_not_as_offered_is_refused(make_minicluster: MiniclusterFactory) -> None:
    mc = make_minicluster(agents=RESERVED)
    fidelity.check_launch_not_as_offered_is_refused(mc.address)


def test_bad_executors_and_agents_are_refused(make_minicluster: MiniclusterFactory) -> None:
    mc = make_minicluster(agents=1)
    fidelity.check_bad_executors_and_agents_are_refused(mc.address)


# Containers need mount namespaces and overlayfs (as a Mesos agent, root); CI runs as root.
@pytest.mark.skipif(os.geteuid() != 0, reason="task containers need root")
def test_containers_of_a_task_group_run(
    make_minicluster: MiniclusterFactory, image_registry: Path, tmp_path: Path
) -> None:
    mc = make_minicluster(agents=1, docker_registry=image_registry)
    host_dir = tmp_path / "volume"
    host_dir.mkdir()
    fidelity.check_containers_of_a_task_group_run(mc.address, "base:1", "data:1", str(host_dir))


def test_docker_containers_in_a_task_group_are_refused(
    make_minicluster: MiniclusterFactory,
) -> None:
    mc = make_minicluster(agents=1)
    fidelity.check_docker_containers_in_a_task_group_are_refused(mc.address)


# ---------------------------------------------------------------------- minicluster only


def test_state_shows_reservations_and_the_framework_user(
    make_minicluster: MiniclusterFactory,
) -> None:
    mc = make_minicluster(agents=RESERVED)
    RawScheduler(mc.address, framework_info(user="someone")).subscribe()
    state = json.loads(get(mc.address, "/master/state")[2])
    node = next(s for s in state["slaves"] if s["hostname"] == "node-r")
    assert node["resources"]["cpus"] == 9 and node["resources"]["gpus"] == 2
    assert node["reserved_resources"] == {
        "gpu": {"cpus": 4, "gpus": 2, "mem": 8192},
        "other": {"cpus": 1},
    }
    assert node["unreserved_resources"]["cpus"] == 4
    assert [f["user"] for f in state["frameworks"]] == ["someone"]


def test_agents_sharing_a_hostname_are_addressed_by_agent_id(
    make_minicluster: MiniclusterFactory,
) -> None:
    mc: Minicluster = make_minicluster(agents=SHARED)
    first, second = mc.agent_ids(fidelity.SHARED_HOSTNAME)
    assert mc.agent_ids() == [first, second, mc.agent_id("node-c")]
    with pytest.raises(KeyError, match=f"node-a names 2 agents \\({first}, {second}\\)"):
        mc.agent_id(fidelity.SHARED_HOSTNAME)
    assert mc.agent_id(second) == second
    assert mc.agent_address(first) != mc.agent_address(second)
    assert mc.work_dir is not None
    assert {p.name for p in (mc.work_dir / "agents").iterdir()} == {"node-a", "node-a.2", "node-c"}
    sched = RawScheduler(mc.address).subscribe()
    mc.kill_agent(first)
    failure = sched.take("FAILURE", where=lambda e: "executor_id" not in e["failure"])
    assert failure["failure"]["agent_id"] == {"value": first}
    # The other agent of that hostname is now the only one: its hostname names it again.
    assert mc.agent_id(fidelity.SHARED_HOSTNAME) == second


@pytest.mark.skipif(os.geteuid() != 0, reason="only an agent running as root switches users")
def test_tasks_run_as_the_framework_user_when_the_agent_is_root(
    make_minicluster: MiniclusterFactory,
) -> None:
    nobody = pwd.getpwnam("nobody")
    # Its own work dir (made traversable): a pytest tmp_path is private to root.
    mc: Minicluster = make_minicluster(agents=1, work_dir=None)
    sched = RawScheduler(mc.address, framework_info(user="nobody")).subscribe()
    command = "id -u > ids; id -g >> ids; id -G >> ids; touch $MESOS_SANDBOX/mine"
    sched.launch_group(sched.offer(), [task_info("as-nobody", command)])
    for state in ("TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"):
        sched.ack(sched.update("as-nobody", state))
    sandbox = mc.task("as-nobody").sandbox
    assert sandbox is not None
    uid, gid, groups = (sandbox / "ids").read_text().splitlines()
    assert (int(uid), int(gid)) == (nobody.pw_uid, nobody.pw_gid)
    assert {int(g) for g in groups.split()} == set(os.getgrouplist("nobody", nobody.pw_gid))
    for path in (sandbox, sandbox / "stdout", sandbox / "mine", _run_dir(sandbox)):
        assert (path.stat().st_uid, path.stat().st_gid) == (nobody.pw_uid, nobody.pw_gid), path


@pytest.mark.skipif(os.geteuid() != 0, reason="only an agent running as root switches users")
def test_a_command_task_runs_as_its_command_user(make_minicluster: MiniclusterFactory) -> None:
    nobody = pwd.getpwnam("nobody")
    mc: Minicluster = make_minicluster(agents=1, work_dir=None)
    sched = RawScheduler(mc.address).subscribe()  # the framework's user: this one's
    offer = sched.offer()
    task = dict(task_info("cmd-as-nobody", "id -u > uid"), agent_id=offer["agent_id"])
    task["command"]["user"] = "nobody"
    launch = {"type": "LAUNCH", "launch": {"task_infos": [task]}}
    sched.ok("ACCEPT", {"offer_ids": [offer["id"]], "operations": [launch]})
    for state in ("TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"):
        sched.ack(sched.update("cmd-as-nobody", state))
    sandbox = mc.task("cmd-as-nobody").sandbox
    assert sandbox is not None
    assert int((sandbox / "uid").read_text()) == nobody.pw_uid


def _run_dir(sandbox: Path) -> Path:
    return sandbox.parent.parent  # <run>/tasks/<task id>
