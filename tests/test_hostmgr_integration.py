"""The daemon as a Mesos framework, end to end: ``peloton server`` processes on PostgreSQL, a
minicluster master with agents that run real processes, and the CLI/gRPC client.

Covers: a gang on two agents runs to SUCCEEDED with each host's share in one task group (and its
output readable with ``peloton task logs``); a failing task takes its group down; a daemon
SIGKILLed mid-run comes back with the same framework id and every task ends exactly once; a lost
agent's tasks end LOST; a dropped master connection is survived; idle offers are declined and
suppressed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import Peloton, run_peloton, start_minicluster, task_states, wait_for

from peloton.minicluster import AgentSpec, Minicluster
from peloton.v1 import job_pb2

# Only PostgreSQL: the deployment database (SQLite is covered by the unit tests).
pytestmark = pytest.mark.parametrize("backend", ["postgresql"])

AGENT = "cpus:4;mem:8192;disk:10000;gpus:2;ports:[31000-31100]"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Minicluster]:
    agents = AgentSpec.uniform(2, resources=AGENT, attributes="rack:r1;gpu_model:A100")
    mc = start_minicluster(agents, tmp_path / "cluster")
    yield mc
    mc.stop()


def test_a_gang_on_two_agents_runs_to_succeeded_one_group_per_host(
    peloton: Peloton, cluster: Minicluster
) -> None:
    job_id = peloton.submit('echo "hello from rank $PELOTON_RANK of $PELOTON_GANG_SIZE"', 3)
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, job
    ours = [t for t in cluster.tasks() if t.task_id.startswith(job_id)]
    assert len(ours) == 3
    by_agent: dict[str, set[str]] = {}
    for t in ours:
        by_agent.setdefault(t.agent_id, set()).add(t.executor_id)
        assert t.state == "TASK_FINISHED"
    assert len(by_agent) == 2  # 2 GPUs per agent: two tasks on one, one on the other
    assert all(len(executors) == 1 for executors in by_agent.values())  # one group per host
    hosts = peloton.client.list_hosts()
    assert sorted(h.hostname for h in hosts) == ["agent-0", "agent-1"]
    assert [(h.total.gpu, h.attributes["gpu_model"]) for h in hosts] == [(2, "A100")] * 2, hosts
    logs = run_peloton("task", "logs", job_id, "2", "--follow", server=peloton.proc.address)
    assert logs.returncode == 0, logs.stderr  # --follow returns: the task has ended
    assert logs.stdout == "hello from rank 2 of 3\n"
    errors = run_peloton("task", "logs", job_id, "2", "--stderr", server=peloton.proc.address)
    assert (errors.returncode, errors.stdout) == (0, "")


def test_a_failing_task_takes_its_group_down(peloton: Peloton) -> None:
    job_id = peloton.submit(
        'if [ "$PELOTON_RANK" = 0 ]; then exit 1; fi; sleep 60', 2, max_failures=0
    )
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_FAILED
    states = task_states(peloton, job_id)
    assert states[0] == "TASK_STATE_FAILED"
    # Killed as the rest of a failed gang, or lost with its task group if the executor's kill
    # was reported with the failure.
    assert states[1] in ("TASK_STATE_LOST", "TASK_STATE_KILLED")
    assert job.message.startswith("instance 0 failed")


def test_a_sigkilled_daemon_takes_its_tasks_over_and_each_runs_once(
    peloton: Peloton, cluster: Minicluster
) -> None:
    job_id = peloton.submit("sleep 3", 3)
    peloton.wait_running(job_id)
    framework = {t.framework_id for t in cluster.tasks()}
    peloton.restart_after_sigkill()
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED
    ours = [t for t in cluster.tasks() if t.task_id.startswith(job_id)]
    assert sorted(t.task_id for t in ours) == [f"{job_id}-{i}-1" for i in range(3)]
    assert {t.framework_id for t in ours} == framework  # same framework: no second launch
    (fw,) = cluster.frameworks()
    assert fw.connected and {fw.id} == framework


def test_a_killed_agents_tasks_are_lost(peloton: Peloton, cluster: Minicluster) -> None:
    job_id = peloton.submit("sleep 60", 2, gpu=2, max_failures=0)  # one task per agent
    peloton.wait_running(job_id)
    victim = next(t for t in cluster.tasks() if t.task_id.startswith(job_id))
    cluster.kill_agent(victim.hostname)
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_FAILED
    assert "TASK_STATE_LOST" in task_states(peloton, job_id).values()


def test_a_dropped_master_connection_is_survived(peloton: Peloton, cluster: Minicluster) -> None:
    first = peloton.submit("true", 1)
    assert peloton.wait_done(first).state == job_pb2.JOB_STATE_SUCCEEDED
    cluster.drop_connections()
    second = peloton.submit("true", 2)
    assert peloton.wait_done(second).state == job_pb2.JOB_STATE_SUCCEEDED


def test_idle_offers_are_declined_and_suppressed(peloton: Peloton, cluster: Minicluster) -> None:
    def idle() -> bool:
        frameworks = cluster.frameworks()
        return bool(frameworks) and all(f.suppressed and f.offers == 0 for f in frameworks)

    wait_for(idle, 30, "offers declined and suppressed", interval=0.1)
