"""Property: on random small traces and clusters, under every policy, every job ends (it runs
to completion, or is killed at its max_runtime_seconds), no job starts before it arrives, runs
end exactly a duration after their start, and no host is ever over-committed."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peloton.core.resources import EPSILON, KINDS
from peloton.sim.cluster import generate_hosts
from peloton.sim.policy import policies
from peloton.sim.simulator import Simulation
from peloton.sim.trace import TraceJob


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, int, list[TraceJob], str]:
    hosts = draw(st.integers(1, 4))
    gpus_per_host = draw(st.sampled_from([1, 2, 4, 8]))
    jobs = []
    for i in range(draw(st.integers(1, 12))):
        per = draw(st.integers(0, gpus_per_host))
        tasks = draw(st.integers(1, hosts if per else 3))
        jobs.append(
            TraceJob(
                job_id=f"j{i}",
                arrival_s=draw(st.integers(0, 400)),
                tasks=tasks,
                gpu_per_task=per,
                cpu_per_task=4.0 * max(1, per),
                mem_mb_per_task=16384.0 * max(1, per),
                duration_s=draw(st.integers(1, 300)),
                priority=draw(st.integers(0, 2)),
                preemptible=draw(st.booleans()),
                name=draw(st.sampled_from(["a", "b"])),
                max_runtime_s=draw(st.sampled_from([0, 0, 0, 150])),
            )
        )
    return hosts, gpus_per_host, jobs, draw(st.sampled_from(policies()))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_job_ends_never_early_and_hosts_hold_what_they_have(
    scenario: tuple[int, int, list[TraceJob], str],
) -> None:
    hosts, gpus_per_host, jobs, policy = scenario
    sim = Simulation(jobs, generate_hosts(hosts, gpus_per_host), policy=policy)
    starts: dict[str, list[float]] = {j.job_id: [] for j in jobs}
    schedule = sim._schedule
    real_start = sim._start

    def start(r, gang, placed):  # type: ignore[no-untyped-def]
        starts[gang.job_id].append(sim.now)
        real_start(r, gang, placed)

    def checked_schedule() -> None:
        schedule()
        busy = 0.0
        for h in sim.cluster.hosts:
            for k in KINDS:
                assert h.used.get(k) <= h.total.get(k) + 1e-6, (h.hostname, k, h.used)
                assert h.used.get(k) >= -1e-6
            assert 0 <= h.used_ports <= h.ports
            busy += h.used.gpu
        assert abs(busy - sim.cluster.busy_gpus) < 1e-6

    sim._start = start  # type: ignore[method-assign]
    sim._schedule = checked_schedule  # type: ignore[method-assign]
    result = sim.run()
    for o in result.outcomes:
        job = o.job
        assert all(t >= job.arrival_s for t in starts[job.job_id]), (job, starts[job.job_id])
        if o.completed is not None:
            assert not o.failed
            assert o.first_start is not None and o.first_start >= job.arrival_s
            # The last run went all the way: preempted runs restart from scratch.
            assert o.completed == starts[job.job_id][-1] + job.duration_s
            assert o.jct is not None and o.jct >= job.duration_s - EPSILON
            assert len(starts[job.job_id]) == o.preemptions + 1
        else:
            # Only the max_runtime_seconds limit ends a job that fits the cluster otherwise.
            assert job.max_runtime_s, (policy, job, o)
            assert o.failed.startswith("max_runtime_exceeded"), o.failed
            assert o.first_start is not None
            assert job.duration_s > job.max_runtime_s or o.preemptions
    assert sim.cluster.busy_gpus == 0
    assert sim.ledger.unfinished_jobs() == []
