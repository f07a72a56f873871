"""Disruptions on a real Mesos master, through a ``peloton server`` process: the daemon fails over
(same framework id, its running tasks taken over, none launched twice); a task's process, its
executor or its agent is lost and the whole gang restarts on fresh attempts.

Killing a task's or an executor's processes needs the agents on this machine, and taking an agent
away for good (the operator API's MARK_AGENT_GONE: the local cluster cannot stop or restart one
agent) is no thing to do to an operator's cluster: those scenarios always run on a local real
cluster. Everything here is ``disruptive``.
"""

from __future__ import annotations

import os
import signal

import pytest
from daemon import wait_for
from mesos_support import MesosPeloton, PelotonFactory
from realcluster import RealCluster
from support import make_spec

from peloton.v1 import job_pb2

pytestmark = [pytest.mark.parametrize("backend", ["postgresql"]), pytest.mark.disruptive]

# The first attempt of each task runs until it is stopped, the second one succeeds.
HANG_FIRST = 'case "$PELOTON_ATTEMPT_ID" in *-1) exec sleep 300 ;; esac'


def our_tasks(peloton: MesosPeloton, job_id: str) -> dict[str, str]:
    """Every Mesos task of the job the master knows: task id -> state."""
    tasks = peloton.cluster.tasks_of(peloton.framework()["id"])
    return {t["id"]: t["state"] for t in tasks if t["id"].startswith(job_id)}


def restarted_whole(peloton: MesosPeloton, job_id: str, instances: int) -> None:
    """The job SUCCEEDED on second attempts of every task, the first ones ended by the gang
    failure; the master ran each attempt once."""
    job = peloton.wait_done(job_id, timeout=90)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, job
    tasks = peloton.client.list_tasks(job_id).tasks
    assert {t.current.attempt for t in tasks} == {2}, tasks
    ended = {job_pb2.TASK_STATE_FAILED, job_pb2.TASK_STATE_LOST, job_pb2.TASK_STATE_KILLED}
    assert {t.history[0].state for t in tasks} <= ended, tasks
    attempts = sorted(f"{job_id}-{i}-{a}" for i in range(instances) for a in (1, 2))
    assert sorted(our_tasks(peloton, job_id)) == attempts


def test_a_failed_over_daemon_takes_its_running_tasks_over(peloton: MesosPeloton) -> None:
    job_id = peloton.submit("sleep 4", 2)
    peloton.wait_running(job_id)
    before = peloton.framework()
    peloton.restart_after_sigkill()
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, job
    after = peloton.framework()
    assert after["id"] == before["id"] and after["connected"], after
    # Taken over, not launched again: one Mesos task per instance, each finished.
    assert our_tasks(peloton, job_id) == {f"{job_id}-{i}-1": "TASK_FINISHED" for i in range(2)}


def kill_all(pids: list[int]) -> None:
    assert pids, "no process to kill"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


@pytest.mark.local_shape
@pytest.mark.parametrize("victim", ["task process", "executor"])
def test_a_killed_task_process_or_executor_restarts_the_whole_gang(
    make_peloton: PelotonFactory, local_cluster: RealCluster, victim: str
) -> None:
    peloton = make_peloton(local_cluster)
    spec = make_spec(2, command=HANG_FIRST, max_failures=1, backoff_seconds=0)
    spec.placement = "spread"
    job_id = peloton.client.create_job(spec).job_id
    peloton.wait_running(job_id)
    if victim == "executor":
        kill_all(local_cluster.executor_processes(f"{job_id}-0-1"))
    else:
        kill_all(local_cluster.task_processes(f"{job_id}-1-1"))
    restarted_whole(peloton, job_id, 2)


@pytest.mark.local_shape
def test_a_lost_agent_restarts_the_whole_gang_on_the_agent_left(
    make_peloton: PelotonFactory, local_cluster: RealCluster
) -> None:
    peloton = make_peloton(local_cluster)
    spec = make_spec(2, command=HANG_FIRST, gpu=2, max_failures=1, backoff_seconds=0)
    spec.placement = "spread"
    job_id = peloton.client.create_job(spec).job_id
    peloton.wait_running(job_id)
    tasks = peloton.cluster.tasks_of(peloton.framework()["id"])
    victim = next(t["slave_id"] for t in tasks if t["id"] == f"{job_id}-0-1")
    left = [a["id"] for a in local_cluster.agents() if a["id"] != victim]
    local_cluster.mark_agent_gone(victim)
    restarted_whole(peloton, job_id, 2)
    again = [
        t for t in peloton.cluster.tasks_of(peloton.framework()["id"]) if t["id"].endswith("-2")
    ]
    assert victim not in {t["slave_id"] for t in again}, again
    lost = {t.instance_id: t.history[0] for t in peloton.client.list_tasks(job_id).tasks}
    assert lost[0].state == job_pb2.TASK_STATE_LOST, lost

    def hosts() -> dict[str, str]:
        return {h.agent_id: h.state for h in peloton.client.list_hosts()}

    expected = {victim: "DOWN", **{agent: "UP" for agent in left}}
    wait_for(
        lambda: hosts() == expected,
        30,
        "peloton to show the gone agent DOWN",
        state=hosts,
    )
    wait_for(
        lambda: [a["id"] for a in local_cluster.agents() if a["id"] == victim] == [],
        30,
        "the gone agent to leave the master's agents",
        state=lambda: [(a["id"], a["active"]) for a in local_cluster.agents()],
    )
