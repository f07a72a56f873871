"""``peloton task logs`` of any attempt of a task: a daemon process on SQLite, a minicluster whose
agent runs real processes and keeps the sandboxes of ended attempts (as Mesos does until it
garbage-collects them), and the CLI.

Covers: ``--attempt N`` and ``--previous`` of a task that failed and was restarted (also after
the daemon was killed and started again: where each attempt ran is in its record), the default
(the latest attempt that reached a host, also while the task waits to restart), ``--follow`` of
an ended attempt, and the errors: no such attempt, an attempt that never reached a host, no
previous attempt, a sandbox the agent removed, an agent that is gone, both options at once.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import Peloton, error_line, run_peloton, start_minicluster, wait_for

from peloton.minicluster import AgentSpec, Minicluster
from peloton.v1 import job_pb2

# SQLite: the database does not matter here (PostgreSQL runs the other integration tests).
on_sqlite = pytest.mark.parametrize("backend", ["sqlite"])

AGENT = "cpus:4;mem:8192;disk:10000;gpus:2;ports:[31000-31100]"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Minicluster]:
    mc = start_minicluster(AgentSpec.uniform(1, resources=AGENT), tmp_path / "cluster")
    yield mc
    mc.stop()


def fails_first(marker: Path) -> str:
    """A command whose first run says so on stdout and stderr and fails; later runs succeed."""
    return (
        f"if [ -e {marker} ]; then echo second run; echo second err >&2; "
        f"else touch {marker}; echo first run; echo first err >&2; exit 3; fi"
    )


def logs(peloton: Peloton, job_id: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_peloton("task", "logs", job_id, "0", *args, server=peloton.proc.address)


def output(peloton: Peloton, job_id: str, *args: str) -> str:
    result = logs(peloton, job_id, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def failure(peloton: Peloton, job_id: str, *args: str) -> tuple[int, str]:
    result = logs(peloton, job_id, *args)
    return result.returncode, error_line(result)


@on_sqlite
def test_each_attempt_of_a_restarted_task_can_be_read(peloton: Peloton, tmp_path: Path) -> None:
    job_id = peloton.submit(fails_first(tmp_path / "ran"), 1, max_failures=1, backoff_seconds=0)
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, peloton.describe(job_id)
    assert output(peloton, job_id) == "second run\n"
    assert output(peloton, job_id, "--attempt", "2", "--follow") == "second run\n"
    assert output(peloton, job_id, "--previous") == "first run\n"
    assert output(peloton, job_id, "-p", "--stderr") == "first err\n"
    assert output(peloton, job_id, "--attempt", "1", "-f") == "first run\n"
    assert output(peloton, job_id, "--attempt", "1", "--stderr") == "first err\n"
    code, line = failure(peloton, job_id, "--attempt", "3")
    assert code == 1 and "attempt" in line and "its attempts are 1 to 2" in line, line

    once = peloton.submit("echo once", 1)
    peloton.wait_done(once)
    code, line = failure(peloton, once, "--previous")
    assert code == 1 and "only one attempt (1)" in line, line


@on_sqlite
def test_an_attempt_that_ended_before_the_daemon_restarted_can_be_read(
    peloton: Peloton, tmp_path: Path
) -> None:
    job_id = peloton.submit(fails_first(tmp_path / "ran"), 1, max_failures=1, backoff_seconds=0)
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, peloton.describe(job_id)
    # Nothing of attempt 1 is left in the new daemon's memory: no update of it comes again.
    peloton.restart_after_sigkill()
    assert output(peloton, job_id, "--previous") == "first run\n"
    assert output(peloton, job_id, "--attempt", "1", "--stderr") == "first err\n"
    assert output(peloton, job_id, "--attempt", "1", "-f") == "first run\n"
    assert output(peloton, job_id) == "second run\n"


@on_sqlite
def test_a_task_waiting_to_restart_shows_the_run_that_ended(
    peloton: Peloton, cluster: Minicluster, tmp_path: Path
) -> None:
    job_id = peloton.submit(fails_first(tmp_path / "ran"), 1, max_failures=1, backoff_seconds=3600)

    def waiting() -> bool:
        task = peloton.client.get_task(job_id, 0).task
        return task.current.attempt == 2 and task.current.state == job_pb2.TASK_STATE_PENDING

    wait_for(waiting, 60, "attempt 2 PENDING", interval=0.1, state=lambda: peloton.describe(job_id))
    assert output(peloton, job_id) == "first run\n"
    assert output(peloton, job_id, "--follow") == "first run\n"  # returns: the run has ended
    assert output(peloton, job_id, "--previous") == "first run\n"
    code, line = failure(peloton, job_id, "--attempt", "2")
    assert code == 1 and "attempt 2" in line and "not reached a host" in line, line

    # Mesos garbage-collects an ended executor's run directory.
    (first,) = [t for t in cluster.tasks() if t.task_id == f"{job_id}-0-1"]
    assert first.sandbox is not None
    shutil.rmtree(first.sandbox.parent.parent)
    code, line = failure(peloton, job_id, "--attempt", "1")
    assert code == 1 and "no longer on its agent" in line, line

    cluster.kill_agent("agent-0")
    wait_for(
        lambda: peloton.client.list_hosts(["DOWN"]),
        30,
        "the agent DOWN",
        state=lambda: peloton.client.list_hosts(),
    )
    code, line = failure(peloton, job_id, "--previous")
    assert code == 1 and "is DOWN" in line, line


def test_attempt_and_previous_are_a_usage_error() -> None:
    result = run_peloton("task", "logs", "job", "0", "--attempt", "1", "--previous")
    assert result.returncode == 2
    assert "mutually exclusive" in error_line(result)
    result = run_peloton("task", "logs", "job", "0", "--attempt", "0")
    assert result.returncode == 2 and "--attempt" in error_line(result)
