"""realcluster.py itself: local real clusters run side by side and leave nothing running; one
that cannot start says why."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from daemon import ROOT
from mesos_support import RealClusterFactory
from realcluster import RealCluster, RealClusterError, real_cluster

pytestmark = pytest.mark.local_shape


def cluster_pids(cluster: RealCluster) -> list[int]:
    """The pids start.sh recorded (the cluster, its proxy, the flag feeder)."""
    lines = (cluster.home / "run" / "pids").read_text().split("\n")
    return [int(line.split()[1]) for line in lines if line.strip()]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(") ", 1)[1][0] != "Z"


def test_clusters_run_side_by_side_and_leave_nothing_running(
    real_cluster: RealClusterFactory,
) -> None:
    first = real_cluster(agents=1, hostname="one")
    second = real_cluster(agents=2, per_agent={1: {"hostname": "two-b"}})
    assert first.master != second.master and first.home != second.home
    assert [a["hostname"] for a in first.agents()] == ["one"]
    assert sorted(a["hostname"] for a in second.agents()) == ["localhost", "two-b"]
    assert {a["id"] for a in first.agents()}.isdisjoint(a["id"] for a in second.agents())
    pids = cluster_pids(first) + cluster_pids(second)
    assert all(alive(pid) for pid in pids)
    first.stop()
    second.stop()
    assert [pid for pid in pids if alive(pid)] == []
    for cluster in (first, second):
        work = cluster.home / "run" / "work"
        assert cluster.processes_in(work) == []


def test_a_cluster_that_cannot_start_says_why() -> None:
    with pytest.raises(RealClusterError) as failed, real_cluster(resources="cpus:lots"):
        pass
    message = str(failed.value)
    assert "start.sh --agents 1 --resources cpus:lots" in message
    assert "cluster did not come up" in message  # start.sh's own words
    assert "mesos.log (last 40 lines)" in message  # and the log's tail
    # Stopped: nothing runs from the home it had (removed since).
    home = Path(message.split("REAL_MESOS_HOME=", 1)[1].split(")", 1)[0])
    assert not home.exists()
    running = [p for p in os.listdir("/proc") if p.isdigit() and alive(int(p))]
    for pid in running:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert str(home).encode() not in cmdline, pid


def test_the_suite_fails_rather_than_skips_without_a_cluster() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PELOTON_TEST_MESOS_MASTER"}
    env["PELOTON_REAL_MESOS_DIR"] = "/nonexistent/real-mesos"
    test = "tests/mesos/test_gangs.py::test_tasks_run_as_the_daemons_user_by_default"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "no real-mesos harness at /nonexistent/real-mesos" in run.stdout, run.stdout
    assert "skipped" not in run.stdout and re.search(r"^1 error in ", run.stdout, re.M), run.stdout
