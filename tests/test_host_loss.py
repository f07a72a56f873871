"""A brief agent loss fails no gang: a ``peloton server`` process and a minicluster of 2 agents
x 2 GPUs, a running 4-GPU gang with restart budget and a queued 4-GPU gang. The lost agent's host
counts toward what can ever fit for ``host_loss_grace_seconds``: both gangs wait, naming it, and
run once an agent of that hostname is back; past the window the gang fails as never fitting."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import Peloton, start_minicluster, wait_for

from peloton.minicluster import AgentSpec, Minicluster
from peloton.v1 import job_pb2

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])

AGENT = "cpus:4;mem:8192;disk:10000;gpus:2;ports:[31000-31100]"
HOSTS = ("gpu-r1-1", "gpu-r2-1")
LOST = HOSTS[1]

# The first attempt runs until killed (the agent loss ends it), later ones succeed.
WORKER = r"""
import os, time
if os.environ["PELOTON_ATTEMPT_ID"].endswith("-1"):
    time.sleep(600)
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Minicluster]:
    mc = start_minicluster([AgentSpec(h, resources=AGENT) for h in HOSTS], tmp_path / "cluster")
    yield mc
    mc.stop()


@pytest.fixture
def daemons() -> Iterator[list[Peloton]]:
    """The daemons a test started, closed after it."""
    started: list[Peloton] = []
    yield started
    for p in started:
        p.close()


def _lose_an_agent(
    db_url: str, cluster: Minicluster, tmp_path: Path, daemons: list[Peloton], grace: float
) -> tuple[Peloton, str, str]:
    """A daemon with ``grace`` as host_loss_grace_seconds, the two gangs, and then ``LOST``'s
    agent gone: (the daemon, the running gang's job id, the queued one's)."""
    p = Peloton(db_url, cluster, tmp_path / "daemon", ["--host-loss-grace-seconds", str(grace)])
    daemons.append(p)
    running, queued = _gangs(p, tmp_path)
    cluster.kill_agent(LOST)
    return p, running, queued


def _gangs(p: Peloton, tmp_path: Path) -> tuple[str, str]:
    """A running 4-GPU gang with restart budget, and a 4-GPU gang queued behind it."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    running = p.submit(f"exec {sys.executable} {script}", 4, max_failures=2, backoff_seconds=0)
    p.wait_running(running)
    queued = p.submit("true", 4)
    _wait_reason(p, queued, lambda job: job.state == job_pb2.JOB_STATE_PENDING and job.reason)
    return running, queued


def _wait_reason(p: Peloton, job_id: str, ok: object) -> job_pb2.Job:
    def check() -> job_pb2.Job | None:
        job = p.client.get_job(job_id)
        return job if ok(job) else None  # type: ignore[operator]

    return wait_for(check, 60, f"job {job_id}", interval=0.1, state=lambda: p.describe(job_id))


def _waits_for_lost_host(job: job_pb2.Job) -> bool:
    assert job.state != job_pb2.JOB_STATE_FAILED, job
    return job.reason == "cluster_capacity" and f"2 more on {LOST} (lost at" in job.message


def test_an_agent_back_within_the_window_fails_no_gang(
    db_url: str, cluster: Minicluster, tmp_path: Path, daemons: list[Peloton]
) -> None:
    p, running, queued = _lose_an_agent(db_url, cluster, tmp_path, daemons, 300)
    for job_id in (running, queued):
        job = _wait_reason(p, job_id, _waits_for_lost_host)
        assert job.message.startswith("cluster: gang needs 4 gpu, 2 available now; "), job
    cluster.add_agent(AgentSpec(LOST, resources=AGENT))
    for job_id in (running, queued):
        job = p.wait_done(job_id, timeout=90)
        assert job.state == job_pb2.JOB_STATE_SUCCEEDED, p.describe(job_id)
    assert "lost host is back" in p.proc.stderr


def test_a_gang_fails_once_the_window_of_a_host_that_stays_away_ends(
    db_url: str, cluster: Minicluster, tmp_path: Path, daemons: list[Peloton]
) -> None:
    p, running, _ = _lose_an_agent(db_url, cluster, tmp_path, daemons, 1)
    job = p.wait_done(running, timeout=60)
    assert (job.state, job.reason) == (job_pb2.JOB_STATE_FAILED, "gang_infeasible"), job
    assert "gang needs 4 gpu, capacity is 2; the gang can never fit" in job.message
    assert "lost host's grace ended" in p.proc.stderr
