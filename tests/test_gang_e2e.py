"""Gangs end to end: a ``peloton server`` process on PostgreSQL, a minicluster whose agents run
real processes, and jobs submitted over gRPC.

Covers what a distributed-training job relies on: every task starts knowing its rank, its gang and
its peers' addresses and can listen on its ports; the bundled allreduce boots from exactly that; a
failing worker or a lost agent takes the gang down and the gang restarts whole on fresh attempts;
max_failures ends the job with the failure's reason; KillJob is graceful; max_runtime_seconds is
enforced.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import Peloton, scrape_metrics, start_minicluster, task_states, wait_for

from peloton.minicluster import AgentSpec, Minicluster
from peloton.v1 import job_pb2

pytestmark = pytest.mark.parametrize("backend", ["postgresql"])

AGENT = "cpus:4;mem:8192;disk:10000;gpus:2;ports:[31000-31100]"

# One worker program for every test; what it does is chosen by its first argument.
WORKER = r"""
import json, os, signal, socket, sys, time

mode, out = sys.argv[1], sys.argv[2]
env = {k: v for k, v in os.environ.items() if k.startswith("PELOTON_")}
rank = int(env["PELOTON_RANK"])
attempt = int(env["PELOTON_ATTEMPT_ID"].rsplit("-", 1)[1])

def mark(name):
    with open(os.path.join(out, name), "w") as f:
        f.write(str(os.getpid()))

if mode == "discover":
    host, port = env["PELOTON_PEERS"].split(",")[rank].rsplit(":", 1)
    listeners = []
    for p in (int(port), int(env["PELOTON_PORT_HTTP"])):
        s = socket.socket()
        # As servers do: a port an earlier test's connections left in TIME_WAIT is free to bind.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, p))
        s.listen()
        listeners.append(s)
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump(env, f)
elif mode == "allreduce":
    import numpy as np
    import peloton.collective as pc
    pc.init(timeout=20)
    total = pc.allreduce(np.full(4, rank + 1.0), op="sum")
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump({"total": total.tolist(), "size": pc.size(), "local": pc.local_size()}, f)
    pc.shutdown()
elif mode == "fail-once":
    mark(f"{rank}-{attempt}")
    if attempt == 1:
        if rank == 1:
            time.sleep(1)
            sys.exit(3)
        time.sleep(60)
elif mode == "always-fail":
    mark(f"{rank}-{attempt}")
    if rank == 0:
        time.sleep(0.5)
        sys.exit(3)
    time.sleep(60)
elif mode == "hang-first":
    mark(f"{rank}-{attempt}")
    if attempt == 1:
        time.sleep(60)
elif mode == "graceful":
    def stop(signum, frame):
        mark(f"sigterm-{rank}")
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    mark(f"{rank}-{attempt}")
    time.sleep(60)
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Minicluster]:
    """Three agents with 2 GPUs each, on two racks."""
    agents = [
        AgentSpec(f"agent-{i}", resources=AGENT, attributes=f"rack:r{i % 2};gpu_model:A100")
        for i in range(3)
    ]
    mc = start_minicluster(agents, tmp_path / "cluster")
    yield mc
    mc.stop()


@pytest.fixture
def out(tmp_path: Path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d


def command(tmp_path: Path, mode: str, out: Path) -> str:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    # exec: the worker itself gets the kill's SIGTERM (a shell in between would die of it, and
    # the rest of the task's process group with it).
    return f"exec {sys.executable} {script} {mode} {out}"


def attempts(p: Peloton, job_id: str) -> dict[int, int]:
    return {t.instance_id: t.current.attempt for t in p.client.list_tasks(job_id).tasks}


def test_every_task_knows_its_gang_and_can_listen_on_its_ports(
    peloton: Peloton, cluster: Minicluster, tmp_path: Path, out: Path
) -> None:
    job_id = peloton.submit(command(tmp_path, "discover", out), 4, ports=["http"])
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, job
    envs = [json.loads((out / f"{r}.json").read_text()) for r in range(4)]
    tasks = peloton.client.list_tasks(job_id).tasks
    hosts = {t.instance_id: t.current.host for t in tasks}
    # The first run succeeded: the agents offer only ports held for them (free_ports), so no
    # other program on this machine can make a bind fail.
    assert {t.instance_id: t.current.attempt for t in tasks} == dict.fromkeys(range(4), 1)
    with cluster.master.lock:
        offered = {a.spec.hostname: a.total.ranges["ports"] for a in cluster.master.agents.values()}
    peers = envs[0]["PELOTON_PEERS"].split(",")
    assert len(peers) == 4 and len(set(peers)) == 4
    for rank, env in enumerate(envs):
        instance = int(env["PELOTON_INSTANCE_ID"])
        assert env["PELOTON_JOB_ID"] == job_id
        assert env["PELOTON_ATTEMPT_ID"] == f"{job_id}-{instance}-1"
        assert (env["PELOTON_RANK"], env["PELOTON_GANG_SIZE"]) == (str(rank), "4")
        assert env["PELOTON_PEERS"].split(",") == peers
        same_host = [r for r in range(4) if hosts[r] == hosts[instance]]
        assert env["PELOTON_LOCAL_SIZE"] == str(len(same_host))
        assert env["PELOTON_LOCAL_RANK"] == str(same_host.index(rank))
        port = int(env["PELOTON_PORT_HTTP"])
        assert any(b <= port <= e for b, e in offered[hosts[instance]]), (port, offered)
        assert port != int(peers[rank].rsplit(":", 1)[1])
    # Packed on the fewest hosts: two of 2 GPUs, two ranks each; cross ranks pair them up.
    assert sorted(set(hosts.values())) != [] and len(set(hosts.values())) == 2
    assert sorted((e["PELOTON_LOCAL_RANK"], e["PELOTON_CROSS_RANK"]) for e in envs) == [
        ("0", "0"),
        ("0", "1"),
        ("1", "0"),
        ("1", "1"),
    ]
    assert {e["PELOTON_CROSS_SIZE"] for e in envs} == {"2"}


def test_the_bundled_allreduce_boots_from_the_gang_environment(
    peloton: Peloton, tmp_path: Path, out: Path
) -> None:
    # No backoff: should another program on this machine hold an offered port, the gang fails
    # to connect and restarts at once.
    job_id = peloton.submit(command(tmp_path, "allreduce", out), 4, backoff_seconds=0)
    job = peloton.wait_done(job_id, timeout=90)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, job
    for r in range(4):
        got = json.loads((out / f"{r}.json").read_text())
        assert got == {"total": [10.0] * 4, "size": 4, "local": 2}


def test_a_failing_worker_takes_the_gang_down_and_it_restarts_on_fresh_attempts(
    peloton: Peloton, cluster: Minicluster, tmp_path: Path, out: Path
) -> None:
    job_id = peloton.submit(
        command(tmp_path, "fail-once", out), 3, max_failures=2, backoff_seconds=0
    )
    job = peloton.wait_done(job_id, timeout=90)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, job
    assert attempts(peloton, job_id) == {0: 2, 1: 2, 2: 2}
    assert sorted(p.name for p in out.iterdir()) == [f"{r}-{a}" for r in range(3) for a in (1, 2)]
    history = {t.instance_id: t.history[0] for t in peloton.client.list_tasks(job_id).tasks}
    assert history[1].state == job_pb2.TASK_STATE_FAILED
    assert {history[i].state for i in (0, 2)} <= {
        job_pb2.TASK_STATE_KILLED,
        job_pb2.TASK_STATE_LOST,
    }
    ours = sorted(t.task_id for t in cluster.tasks() if t.task_id.startswith(job_id))
    assert ours == sorted(f"{job_id}-{i}-{a}" for i in range(3) for a in (1, 2))
    samples = scrape_metrics(peloton.proc.metrics_port)
    assert samples[("peloton_gang_restarts_total", ())] == 1
    assert samples[("peloton_placement_rounds_total", ())] >= 2
    assert samples[("peloton_gang_placement_seconds_count", ())] == 2  # the gang, twice
    assert ("peloton_gpu_fragmentation", ()) in samples


def test_a_lost_agent_takes_the_gang_down_and_it_restarts_elsewhere(
    peloton: Peloton, cluster: Minicluster, tmp_path: Path, out: Path
) -> None:
    job_id = peloton.submit(
        command(tmp_path, "hang-first", out), 2, gpu=2, max_failures=1, backoff_seconds=0
    )
    peloton.wait_running(job_id)
    victim = next(t for t in cluster.tasks() if t.task_id.startswith(job_id))
    cluster.kill_agent(victim.hostname)
    job = peloton.wait_done(job_id, timeout=90)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, job
    tasks = peloton.client.list_tasks(job_id).tasks
    assert {t.current.attempt for t in tasks} == {2}
    assert victim.hostname not in {t.current.host for t in tasks}
    assert job_pb2.TASK_STATE_LOST in {t.history[0].state for t in tasks}


def test_max_failures_ends_the_job_with_the_failure_reason(
    peloton: Peloton, tmp_path: Path, out: Path
) -> None:
    job_id = peloton.submit(
        command(tmp_path, "always-fail", out), 2, max_failures=1, backoff_seconds=0
    )
    job = peloton.wait_done(job_id, timeout=90)
    assert job.state == job_pb2.JOB_STATE_FAILED
    assert job.reason == "failed"
    assert job.message.startswith("instance 0 failed"), job.message
    assert "the gang failed 2 times (restart.max_failures is 1)" in job.message
    assert attempts(peloton, job_id) == {0: 2, 1: 2}
    # Nothing is left running: the other worker of each run was killed.
    assert set(task_states(peloton, job_id).values()) <= {
        "TASK_STATE_FAILED",
        "TASK_STATE_KILLED",
        "TASK_STATE_LOST",
    }


def test_kill_job_is_graceful(peloton: Peloton, tmp_path: Path, out: Path) -> None:
    job_id = peloton.submit(command(tmp_path, "graceful", out), 2, kill_grace_seconds=10)
    wait_for(lambda: len(list(out.iterdir())) == 2, 30, "both workers started", interval=0.1)
    peloton.client.kill_job(job_id)
    job = peloton.wait_done(job_id, timeout=30)
    assert job.state == job_pb2.JOB_STATE_KILLED
    # Each worker got SIGTERM and finished its handler (not SIGKILLed first).
    assert sorted(p.name for p in out.glob("sigterm-*")) == ["sigterm-0", "sigterm-1"]


def test_max_runtime_is_enforced(peloton: Peloton, tmp_path: Path, out: Path) -> None:
    job_id = peloton.submit(command(tmp_path, "hang-first", out), 2, max_runtime_seconds=2)
    job = peloton.wait_done(job_id, timeout=30)
    assert job.state == job_pb2.JOB_STATE_KILLED
    assert job.reason == "max_runtime_exceeded"
    assert "max_runtime_seconds (2 s)" in job.message
