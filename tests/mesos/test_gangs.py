"""Gangs on a real Mesos master (``mesos``: ``PELOTON_TEST_MESOS_MASTER`` or a local real cluster
of two agents) through a ``peloton server`` process: a gang spread over two agents succeeds and
every task sees its gang; the framework user; idle offers suppressed and declined; KillJob sends
SIGTERM first; the logs of a failed attempt stay readable after its task restarted, and after the
daemon restarted too.

Tasks run plain ``sh`` and report on their stdout, read back with ``peloton task logs`` (the
agent's /files API), so these scenarios also run on an operator's cluster.
"""

from __future__ import annotations

import getpass

import pytest
from daemon import run_peloton, wait_for
from mesos_support import MesosPeloton, PelotonFactory
from realcluster import RealCluster
from support import make_spec

from peloton.v1 import job_pb2

pytestmark = pytest.mark.parametrize("backend", ["postgresql"])

SHOW_ENV = "env | grep '^PELOTON_' | sort"


def task_logs(peloton: MesosPeloton, job_id: str, instance: int, *args: str) -> str:
    """A task's stdout (``args``: more ``task logs`` options), read from its agent's sandbox by
    ``peloton task logs``."""
    out = run_peloton("task", "logs", job_id, str(instance), *args, server=peloton.proc.address)
    assert out.returncode == 0, out.stderr
    return out.stdout


def env_of(peloton: MesosPeloton, job_id: str, instance: int) -> dict[str, str]:
    lines = task_logs(peloton, job_id, instance).splitlines()
    return dict(line.split("=", 1) for line in lines if line.startswith("PELOTON_"))


def port_ranges(cluster: RealCluster) -> list[range]:
    """Every agent's ``ports`` resource, as ranges (e.g. ``[31000-32000]``)."""
    ranges = []
    for agent in cluster.agents():
        for part in agent["resources"].get("ports", "[]").strip("[]").split(","):
            if part.strip():
                begin, end = part.strip().split("-")
                ranges.append(range(int(begin), int(end) + 1))
    return ranges


def test_a_gang_spread_over_two_agents_succeeds_and_every_task_knows_its_gang(
    peloton: MesosPeloton, mesos: RealCluster
) -> None:
    spec = make_spec(2, command=SHOW_ENV, ports=["http"])
    spec.placement = "spread"
    job_id = peloton.client.create_job(spec).job_id
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, job
    ours = [t for t in mesos.tasks_of(peloton.framework()["id"]) if t["id"].startswith(job_id)]
    assert len({t["slave_id"] for t in ours}) == 2, ours  # one task per agent
    envs = [env_of(peloton, job_id, i) for i in range(2)]
    peers = envs[0]["PELOTON_PEERS"].split(",")
    assert len(peers) == 2 and len(set(peers)) == 2
    ports = port_ranges(mesos)
    for rank, env in enumerate(envs):
        assert env["PELOTON_JOB_ID"] == job_id
        assert env["PELOTON_ATTEMPT_ID"] == f"{job_id}-{rank}-1"
        assert env["PELOTON_INSTANCE_ID"] == str(rank)
        assert (env["PELOTON_RANK"], env["PELOTON_GANG_SIZE"]) == (str(rank), "2")
        assert env["PELOTON_PEERS"].split(",") == peers
        # One task per host: each is alone there, and the cross ranks number the hosts.
        assert (env["PELOTON_LOCAL_RANK"], env["PELOTON_LOCAL_SIZE"]) == ("0", "1")
        assert (env["PELOTON_CROSS_RANK"], env["PELOTON_CROSS_SIZE"]) == (str(rank), "2")
        http = int(env["PELOTON_PORT_HTTP"])
        assert any(http in r for r in ports), (http, ports)
        assert http != int(peers[rank].rsplit(":", 1)[1])


def test_tasks_run_as_the_daemons_user_by_default(
    peloton: MesosPeloton, mesos: RealCluster
) -> None:
    job_id = peloton.submit("id -un", 1)
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, job
    assert peloton.framework()["user"] == getpass.getuser()
    assert task_logs(peloton, job_id, 0) == f"{getpass.getuser()}\n"


def test_a_user_the_agents_do_not_have_fails_the_job_naming_the_user(
    make_peloton: PelotonFactory, mesos: RealCluster
) -> None:
    # Agents switch to the framework's user (--switch_user, true by default): one they do not
    # have fails each executor, and the job ends with why rather than waiting.
    peloton = make_peloton(mesos, "--mesos-user", "nosuchuser")
    job_id = peloton.submit("true", 1, max_failures=0)
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_FAILED, job
    assert "No such user 'nosuchuser'" in job.message, job.message
    assert peloton.framework()["user"] == "nosuchuser"


def test_idle_offers_are_suppressed_and_declined(peloton: MesosPeloton, mesos: RealCluster) -> None:
    job_id = peloton.submit("true", 1)
    assert peloton.wait_done(job_id).state == job_pb2.JOB_STATE_SUCCEEDED
    framework_id = peloton.framework()["id"]

    def idle_state() -> dict[str, float]:
        metrics = mesos.framework_metrics(framework_id)
        return {
            "outstanding": mesos.outstanding_offers(framework_id),
            "suppressed": metrics["roles/*/suppressed"],
            # Every offer the master sent was used or declined (none dropped, none rescinded).
            "unanswered": metrics["offers/sent"]
            - metrics["offers/accepted"]
            - metrics["offers/declined"],
        }

    wait_for(
        lambda: idle_state() == {"outstanding": 0, "suppressed": 1, "unanswered": 0},
        30,
        "offers suppressed and every offer answered at the master",
        interval=0.2,
        state=idle_state,
    )


def test_kill_job_stops_each_task_with_sigterm_first(peloton: MesosPeloton) -> None:
    # The shell traps SIGTERM between short sleeps: it reports and exits within the grace.
    command = "trap 'echo sigterm; exit 0' TERM; echo started; while :; do sleep 0.1; done"
    job_id = peloton.submit(command, 2, kill_grace_seconds=20)
    peloton.wait_running(job_id)
    wait_for(
        lambda: all(task_logs(peloton, job_id, i) == "started\n" for i in range(2)),
        30,
        "both tasks to have started their loop",
        interval=0.2,
        state=lambda: [task_logs(peloton, job_id, i) for i in range(2)],
    )
    peloton.client.kill_job(job_id)
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_KILLED, job
    assert [task_logs(peloton, job_id, i) for i in range(2)] == ["started\nsigterm\n"] * 2


def test_the_logs_of_a_failed_attempt_are_read_after_the_task_and_the_daemon_restarted(
    peloton: MesosPeloton, mesos: RealCluster
) -> None:
    # The first attempt fails; its executor ends, and the agent keeps its sandbox until GC.
    command = (
        'echo "run $PELOTON_ATTEMPT_ID"; echo "err $PELOTON_ATTEMPT_ID" >&2; '
        'case "$PELOTON_ATTEMPT_ID" in *-1) exit 3;; esac'
    )
    job_id = peloton.submit(command, 1, max_failures=1, backoff_seconds=0)
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, peloton.describe(job_id)
    framework_id = peloton.framework()["id"]

    def executors() -> set[str]:
        return {e["executor_id"] for e in mesos.framework(framework_id)["executors"]}

    # Read once the master has seen the first attempt's executor exit.
    wait_for(
        lambda: f"{job_id}-0-1-executor" not in executors(),
        60,
        "the first attempt's executor to end",
        interval=0.2,
        state=executors,
    )
    assert task_logs(peloton, job_id, 0) == f"run {job_id}-0-2\n"
    assert task_logs(peloton, job_id, 0, "--previous") == f"run {job_id}-0-1\n"
    assert task_logs(peloton, job_id, 0, "--attempt", "1", "--stderr") == f"err {job_id}-0-1\n"
    assert task_logs(peloton, job_id, 0, "--attempt", "1", "-f") == f"run {job_id}-0-1\n"
    # A new daemon process finds the sandbox from the attempt's record alone.
    peloton.restart_after_sigkill()
    assert task_logs(peloton, job_id, 0, "--previous") == f"run {job_id}-0-1\n"
    assert task_logs(peloton, job_id, 0, "--attempt", "1", "--stderr") == f"err {job_id}-0-1\n"
