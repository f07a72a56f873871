"""The daemon and the simulator must not drift: one small trace, replayed through a ``peloton
server`` on the minicluster (each task a process that sleeps the job's duration, one trace second
a real second) and through ``peloton simulate``'s loop on the same cluster, admits the same jobs
at the same points of the trace under each queue policy.

The trace (one agent of 4 GPUs; every job gives its max_runtime_seconds, so BACKFILL's
reservations use the same expected ends in both): ``hog`` takes all 4 GPUs for 6 s; meanwhile
``small`` (1 GPU), ``pair`` (2 x 2 GPUs), ``urgent`` (2 GPUs, priority 5) and ``quick`` (1 GPU,
2 s) arrive. When ``hog`` ends, ``urgent`` and ``small`` are admitted; ``pair`` does not fit.
PRIORITY_FIFO keeps ``quick`` behind ``pair``; BACKFILL reserves for ``pair`` at the others'
expected ends and lets ``quick`` run before it, as it ends earlier. Admissions are compared as
*waves*: the jobs admitted at one instant of the simulation, and in the daemon the jobs admitted
within a second of each other (the waves of this trace are at least 3 s apart), so the order in
which one cycle admits several jobs, and a gang's tasks finishing a few milliseconds apart, do not
matter.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import DONE, Peloton, start_minicluster, wait_for

from peloton.core.pools import PoolConfig, QueuePolicy
from peloton.minicluster import AgentSpec, Minicluster
from peloton.sim.cluster import from_agents
from peloton.sim.simulator import simulate
from peloton.sim.trace import TraceJob, parse_csv
from peloton.v1 import job_pb2, pool_pb2

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])

AGENT = AgentSpec("agent-0", resources="cpus:8;mem:8192;disk:10000;gpus:4;ports:[31000-31100]")
POOL = "/drift"
TRACE = """\
job_id,arrival_s,pool,priority,tasks,gpu_per_task,cpu_per_task,mem_mb_per_task,duration_s,preemptible,name,max_runtime_s
hog,0,/drift,0,1,4,0.5,128,6,0,hog,8
small,1,/drift,0,1,1,0.5,128,4,0,small,6
pair,2,/drift,0,2,2,0.5,128,3,0,pair,5
urgent,3,/drift,5,1,2,0.5,128,4,0,urgent,6
quick,4,/drift,0,1,1,0.5,128,2,0,quick,4
"""
# Admissions more than this far apart (in seconds) are different waves.
WAVE_GAP_S = 1.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Minicluster]:
    mc = start_minicluster([AGENT], tmp_path / "cluster")
    yield mc
    mc.stop()


def waves(admitted: dict[str, float]) -> list[set[str]]:
    """The jobs by admission time, grouped into waves (see the module doc)."""
    out: list[set[str]] = []
    last = -float("inf")
    for name, t in sorted(admitted.items(), key=lambda item: item[1]):
        if t - last > WAVE_GAP_S:
            out.append(set())
        out[-1].add(name)
        last = t
    return out


def simulated(jobs: list[TraceJob], policy: QueuePolicy) -> dict[str, float]:
    """Each job's admission instant in the simulator (its gang is placed in the same instant)."""
    pool = PoolConfig(path=POOL, queue_policy=policy)
    result = simulate(jobs, from_agents([AGENT]), [pool], policy.value)
    starts = {o.job.job_id: o.first_start for o in result.outcomes}
    assert all(t is not None for t in starts.values()), starts
    return {k: float(t) for k, t in starts.items() if t is not None}


def admitted_at(peloton: Peloton, job_id: str) -> float:
    """When the job's first task was admitted (its first PENDING -> READY), from its events."""
    for response in peloton.client.watch_job(job_id):
        e = response.event
        if e.has_instance and e.to_state == "READY":
            return e.time.ToDatetime().timestamp()
    raise AssertionError(f"job {job_id} was never admitted: {peloton.describe(job_id)}")


def replayed(peloton: Peloton, jobs: list[TraceJob], policy: QueuePolicy) -> dict[str, float]:
    """Each job's admission time in the daemon, relative to the trace's start."""
    peloton.client.create_pool(
        pool_pb2.PoolSpec(
            path=POOL, queue_policy=pool_pb2.QueuePolicy.Value(f"QUEUE_POLICY_{policy.value}")
        )
    )
    ids: dict[str, str] = {}
    start = time.time()
    for job in jobs:
        # The trace's clock: submit each job at its arrival.
        time.sleep(max(0.0, start + job.arrival_s - time.time()))
        assert job.spec is not None
        spec = job_pb2.JobSpec()
        spec.CopyFrom(job.spec)
        spec.task.command = f"exec sleep {job.duration_s:g}"
        ids[job.job_id] = peloton.client.create_job(spec).job_id
    for name, job_id in ids.items():
        job = wait_for(
            lambda j=job_id: (got := peloton.client.get_job(j)).state in DONE and got,
            60,
            f"job {name} to end",
            interval=0.2,
            state=lambda j=job_id: peloton.describe(j),
        )
        assert job.state == job_pb2.JOB_STATE_SUCCEEDED, peloton.describe(job_id)
    return {name: admitted_at(peloton, job_id) - start for name, job_id in ids.items()}


@pytest.mark.parametrize("policy", [QueuePolicy.PRIORITY_FIFO, QueuePolicy.BACKFILL])
def test_the_daemon_admits_a_trace_in_the_order_the_simulator_does(
    peloton: Peloton, policy: QueuePolicy
) -> None:
    jobs = parse_csv(io.StringIO(TRACE), "drift.csv")
    expected = waves(simulated(jobs, policy))
    # The scenario itself: the two policies differ only in where `quick` goes.
    if policy is QueuePolicy.BACKFILL:
        assert expected == [{"hog"}, {"small", "urgent", "quick"}, {"pair"}], expected
    else:
        assert expected == [{"hog"}, {"small", "urgent"}, {"pair"}, {"quick"}], expected
    seen = replayed(peloton, jobs, policy)
    assert waves(seen) == expected, (seen, expected)
