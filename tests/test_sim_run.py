"""Runs of the simulator on traces small enough to work out by hand: exact start and completion
times under the resource manager's policies and under the backfill baseline, preemption, pools,
GPU models, failures; and proof that the production kernels are what runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from peloton.core.pools import KindConfig, PoolConfig, QueuePolicy
from peloton.placement import engine
from peloton.resmgr import admission
from peloton.resmgr.manager import ResourceManager
from peloton.sim import report
from peloton.sim.cluster import generate_hosts
from peloton.sim.policy import BASELINE_BACKFILL, parse_policy, policies
from peloton.sim.simulator import Simulation, SimulationError, simulate
from peloton.sim.trace import TraceJob


def job(
    job_id: str,
    arrival: float,
    tasks: int,
    gpus: int,
    duration: float,
    *,
    priority: int = 0,
    pool: str = "/default",
    gpu_model: str = "",
    preemptible: bool = True,
) -> TraceJob:
    return TraceJob(
        job_id,
        arrival,
        tasks,
        gpus,
        4.0 * max(1, gpus),
        16384.0 * max(1, gpus),
        duration,
        pool=pool,
        priority=priority,
        gpu_model=gpu_model,
        preemptible=preemptible,
    )


# 2 hosts x 4 GPUs. A takes one host for 100 s; B (both hosts) comes at 10 and must wait for
# A; C (2 GPUs) comes at 20 and fits on the free host at once.
THREE = [job("A", 0, 1, 4, 100), job("B", 10, 2, 4, 50), job("C", 20, 1, 2, 30)]


def times(result: object) -> dict[str, tuple[float | None, float | None]]:
    return {o.job.job_id: (o.first_start, o.completed) for o in result.outcomes}  # type: ignore[attr-defined]


@pytest.mark.parametrize("policy", ["PRIORITY_FIFO", "FIFO"])
def test_resource_manager_holds_capacity_for_the_big_gang(policy: str) -> None:
    result = simulate(THREE, generate_hosts(2, 4), policy=policy)
    # No starvation: C could start at 20 but would take what B waits for; it runs after B.
    assert times(result) == {"A": (0, 100), "B": (100, 150), "C": (150, 180)}
    assert [o.jct for o in result.outcomes] == [100, 140, 160]
    assert [o.wait for o in result.outcomes] == [0, 90, 130]
    assert result.preemptions == 0
    summary = report.summarize(result)
    assert summary["jct_s"]["mean"] == pytest.approx((100 + 140 + 160) / 3)
    assert summary["makespan_s"] == 180
    # Busy GPU-seconds: A 4x100, B 8x50, C 2x30 over 8 GPUs x 180 s.
    assert summary["gpu_utilization"] == pytest.approx((400 + 400 + 60) / (8 * 180))
    assert summary["by_size"]["5-8"]["jct_s"]["mean"] == 140
    assert summary["worst_wait_16plus_gpus_s"] is None


def test_the_backfill_baseline_lets_small_gangs_pass() -> None:
    result = simulate(THREE, generate_hosts(2, 4), policy=BASELINE_BACKFILL)
    assert times(result) == {"A": (0, 100), "B": (100, 150), "C": (20, 50)}
    assert result.cycles == 0  # the resource manager is not involved
    summary = report.summarize(result)
    assert summary["baseline"] is True
    assert summary["placement_delay_s"]["n"] == 0


def test_a_higher_priority_gang_preempts_and_the_victim_restarts_from_scratch() -> None:
    jobs = [job("D", 0, 2, 4, 100), job("E", 10, 1, 4, 20, priority=1)]
    result = simulate(jobs, generate_hosts(2, 4), policy="PRIORITY_FIFO")
    # E waits one cycle (the daemon's hysteresis, 1 s), D is preempted at 11, E runs 11-31,
    # D starts over at 31 and runs its whole 100 s again.
    assert times(result) == {"D": (0, 131), "E": (11, 31)}
    assert result.preemptions == 1
    assert result.lost_gpu_seconds == 8 * 11
    assert [o.preemptions for o in result.outcomes] == [1, 0]
    # The baseline never preempts: E waits for D.
    baseline = simulate(jobs, generate_hosts(2, 4), policy=BASELINE_BACKFILL)
    assert times(baseline) == {"D": (0, 100), "E": (100, 120)}


def test_a_non_preemptible_victim_is_left_alone() -> None:
    jobs = [job("D", 0, 2, 4, 100, preemptible=False), job("E", 10, 1, 4, 20, priority=1)]
    result = simulate(jobs, generate_hosts(2, 4), policy="PRIORITY_FIFO")
    assert times(result) == {"D": (0, 100), "E": (100, 120)}
    assert result.preemptions == 0


def test_fifo_ignores_priority_in_the_queue() -> None:
    # A holds the cluster; B (priority 0) and then C (priority 5) wait; both need all of it,
    # so neither preempts the other's place... but C preempts nothing (A is not preemptible).
    jobs = [
        job("A", 0, 2, 4, 100, preemptible=False),
        job("B", 10, 2, 4, 10),
        job("C", 20, 2, 4, 10, priority=5),
    ]
    fifo = simulate(jobs, generate_hosts(2, 4), policy="FIFO")
    assert times(fifo)["B"] == (100, 110)
    assert times(fifo)["C"] == (110, 120)
    prio = simulate(jobs, generate_hosts(2, 4), policy="PRIORITY_FIFO")
    assert times(prio)["C"] == (100, 110)
    assert times(prio)["B"] == (110, 120)


def test_gpu_models_constrain_placement() -> None:
    cluster = generate_hosts(2, 4, gpu_models=("A100", "V100"))
    jobs = [job("a", 0, 1, 4, 50, gpu_model="V100"), job("b", 0, 1, 4, 50, gpu_model="V100")]
    for policy in ("PRIORITY_FIFO", BASELINE_BACKFILL):
        result = simulate(jobs, cluster, policy=policy)
        # One V100 host: they run one after the other although an A100 host is free.
        assert times(result) == {"a": (0, 50), "b": (50, 100)}, policy


def test_gangs_that_never_fit_fail_and_the_rest_runs() -> None:
    cluster = generate_hosts(2, 4)
    jobs = [
        job("huge", 0, 3, 4, 10),  # 12 GPUs: more than the cluster
        job("wide", 0, 1, 8, 10),  # one task of 8 GPUs: no host has 8
        job("nomodel", 0, 1, 1, 10, gpu_model="H100"),
        job("ok", 1, 1, 4, 10),
    ]
    for policy in ("PRIORITY_FIFO", BASELINE_BACKFILL):
        result = simulate(jobs, cluster, policy=policy)
        by_id = {o.job.job_id: o for o in result.outcomes}
        assert by_id["ok"].completed == 11, policy
        assert by_id["wide"].failed.startswith("unplaceable"), by_id["wide"].failed
        assert by_id["nomodel"].failed.startswith("unplaceable")
        assert by_id["huge"].failed, policy
        summary = report.summarize(result)
        assert summary["failed"] == 3
        assert summary["completed"] == 1
    result = simulate(jobs, cluster, policy="PRIORITY_FIFO")
    huge = next(o for o in result.outcomes if o.job.job_id == "huge")
    assert huge.failed.startswith("gang_infeasible")  # the resource manager's admission


def test_pools_share_the_cluster_by_entitlement() -> None:
    pools = [
        PoolConfig("/a", kinds={"gpu": KindConfig(reservation=4)}),
        PoolConfig("/b", kinds={"gpu": KindConfig(reservation=4)}),
    ]
    # /a floods the cluster first; /b's gang comes later and takes its reservation back.
    jobs = [job(f"a{i}", 0, 1, 2, 1000, pool="/a") for i in range(4)]
    jobs.append(job("b0", 100, 1, 4, 50, pool="/b"))
    result = simulate(jobs, generate_hosts(2, 4), pools, "PRIORITY_FIFO")
    by_id = {o.job.job_id: o for o in result.outcomes}
    assert by_id["b0"].first_start == 101  # reclaimed after one cycle of waiting
    assert result.preemptions == 2  # two 2-GPU gangs of /a
    shares = {p["pool"]: p for p in report.summarize(result)["pools"]}
    assert set(shares) == {"/a", "/b"}
    assert shares["/a"]["gpu_allocation"] > shares["/b"]["gpu_allocation"] > 0


def test_jobs_of_a_pool_that_does_not_exist_are_refused() -> None:
    with pytest.raises(SimulationError, match="pool /nope does not exist"):
        Simulation([job("x", 0, 1, 1, 1, pool="/nope")], generate_hosts(1, 1))
    pools = [PoolConfig("/a"), PoolConfig("/a/b")]
    with pytest.raises(SimulationError, match="pool /a is not a leaf pool"):
        Simulation([job("x", 0, 1, 1, 1, pool="/a")], generate_hosts(1, 1), pools)


def test_the_production_kernels_do_the_work(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"admit_all": 0, "place_on": 0, "never_fits": 0}
    real_admit, real_place, real_never = admission.admit_all, engine.place_on, engine.never_fits

    def admit_all(*args: object, **kwargs: object) -> object:
        calls["admit_all"] += 1
        return real_admit(*args, **kwargs)  # type: ignore[arg-type]

    def place_on(*args: object, **kwargs: object) -> object:
        calls["place_on"] += 1
        return real_place(*args, **kwargs)  # type: ignore[arg-type]

    def never_fits(*args: object, **kwargs: object) -> object:
        calls["never_fits"] += 1
        return real_never(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(admission, "admit_all", admit_all)
    monkeypatch.setattr(engine, "place_on", place_on)
    monkeypatch.setattr(engine, "never_fits", never_fits)
    sim = Simulation(THREE, generate_hosts(2, 4), policy="PRIORITY_FIFO")
    assert type(sim.rm) is ResourceManager
    result = sim.run()
    # One cycle per instant with news, and the one loading it (ResourceManager.load).
    assert calls["admit_all"] == result.cycles + 1 > 1
    assert calls["place_on"] >= 3  # every gang was placed by the engine
    assert times(result)["C"] == (150, 180)


def test_policies_come_from_the_queue_policy_enum() -> None:
    assert policies() == [p.value for p in QueuePolicy] + [BASELINE_BACKFILL]
    assert policies()[:2] == ["PRIORITY_FIFO", "FIFO"]
    assert parse_policy("priority_fifo") == "PRIORITY_FIFO"
    with pytest.raises(ValueError, match=r"use one of PRIORITY_FIFO, FIFO, .*baseline-backfill"):
        parse_policy("lottery")


def test_a_simulation_runs_once_and_leaves_the_cluster_it_was_given_alone() -> None:
    cluster = generate_hosts(2, 4)
    sim = Simulation(THREE, cluster)
    sim.run()
    assert cluster.busy_gpus == 0 and all(h.used.gpu == 0 for h in cluster.hosts)
    with pytest.raises(RuntimeError):
        sim.run()


@pytest.mark.parametrize("policy", ["BACKFILL", "LAS"])
def test_a_reservation_names_the_hosts_and_rack_it_will_start_on(policy: str) -> None:
    # 4 hosts x 4 GPUs, 2 per rack. "short" (100 s) and "long" (500 s) take a rack each;
    # "pair" (2 hosts) comes at 10 and can start when "short" ends, on its rack's hosts.
    cluster = generate_hosts(4, 4, racks=2)
    trace = [
        dataclasses.replace(job("short", 0, 2, 4, 100), max_runtime_s=100),
        dataclasses.replace(job("long", 1, 2, 4, 500), max_runtime_s=500),
        job("pair", 10, 2, 4, 50),
    ]
    sim = Simulation(trace, cluster, policy=policy)
    told: dict[str, str] = {}
    write = sim.ledger.set_pending_reasons

    def record(reasons: Mapping[str, tuple[str, str]]) -> None:
        told.update({k: m for k, (r, m) in reasons.items() if r == admission.PENDING_RESERVED})
        write(reasons)

    sim.ledger.set_pending_reasons = record  # type: ignore[method-assign]
    result = sim.run()
    short_rack = {
        h.attributes["rack"] for h in cluster.hosts if h.agent_id in hosts_of(sim, "short")
    }
    assert len(short_rack) == 1, short_rack
    expected = (
        f"reserved: starts by 2026-01-01 00:01:40 UTC on 2 hosts in rack {short_rack.pop()} ("
    )
    assert expected in told["pair"], told["pair"]
    assert times(result)["pair"] == (100, 150)


def hosts_of(sim: Simulation, job_id: str) -> set[str]:
    """The agent ids a job ran on."""
    return set(sim.ledger.hosts(job_id))
