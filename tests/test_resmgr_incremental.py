"""Properties of the resource manager's incremental cycle: what it keeps up to date as jobs
change equals what is built from scratch.

- After any sequence of submissions, cycles, placements, successes, failures (restarts with
  backoff), kills, deletions and preemptions, the book (what each pool's jobs hold, want and
  queue; the jobs that queue and that run) equals a book of the same views built afresh, its
  sums are the exactly rounded sums of the jobs' shares (fractional cpus included), and every
  job's cached queued gangs and preemption candidate equal fresh ones.
- Admission (reserve-ahead, and BACKFILL/LAS with expected ends and placement) decides a queue
  the same when no gang shares its shape with another (so nothing is decided once per shape),
  and what it admits stays within what was available (which it keeps between admissions).
- The simulator decides every job the same (starts, ends, preemptions, failures) when the book
  and the caches are rebuilt from scratch before every cycle.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from resmgr_support import Harness

from peloton.core.pools import KindConfig, PoolConfig, QueuePolicy
from peloton.core.records import TaskUpdate
from peloton.core.resources import KINDS, Resources
from peloton.core.states import JOB_TERMINAL, TaskState
from peloton.resmgr.admission import Outlook, Room, Waiting, admit, order
from peloton.resmgr.manager import JobView, ResourceManager, _Book
from peloton.sim.cluster import generate_hosts
from peloton.sim.simulator import RunResult, Simulation
from peloton.sim.trace import TraceJob

T = TaskState
POOLS = ("/a", "/b")

# ---------------------------------------------------------------------------- the book


def fresh_book(views: list[JobView]) -> _Book:
    book = _Book()
    for view in views:
        book.add(view)
    return book


def exact_sum(values: list[float]) -> float:
    return float(sum((Fraction(v) for v in values), Fraction(0)))


def check_book(rm: ResourceManager) -> None:
    views = list(rm._views.values())
    book, fresh = rm._book, fresh_book(views)
    assert book.usage() == fresh.usage()
    assert book.demand() == fresh.demand()
    assert book.queued_gangs == fresh.queued_gangs
    assert {p: set(vs) for p, vs in book.queued.items()} == {
        p: set(vs) for p, vs in fresh.queued.items()
    }
    assert set(book.running) == set(fresh.running)
    # Exact: each sum is the exactly rounded sum of the jobs' shares, whatever came and went.
    usage = book.usage()
    for pool in {v.pool for v in views}:
        mine = [v for v in views if v.pool == pool]
        for k in KINDS:
            held = exact_sum([v.amount(v.holding).get(k) for v in mine])
            assert usage.allocation.get(pool, Resources()).get(k) == held
            wanted = exact_sum([v.amount(v.pending + v.holding).get(k) for v in mine])
            assert book.demand()[pool].get(k) == wanted
    for k in KINDS:
        assert usage.total.get(k) == exact_sum([v.amount(v.holding).get(k) for v in views])
    # What BACKFILL pools expect to end, in job order (admission weighs ties in this order).
    now = rm._clock()
    outlook = rm._outlooks({"/b": []}, now)["/b"]
    assert outlook.ends == [
        (v.admitted_at + rm.expected_runtime(v), v.amount(v.holding - v.ending))
        for v in views
        if v.holding > v.ending
    ]
    # Cached gangs and candidates equal fresh ones (a copy of a view has no caches).
    for view in views:
        assert view.gangs() == dataclasses.replace(view).gangs()
        if view.holding > view.ending:
            assert view.as_running() == dataclasses.replace(view).as_running()


@dataclass(frozen=True)
class Submit:
    pool: str
    instances: int
    gpu: float
    cpu: float
    priority: int
    preemptible: bool
    least: int  # the gang's minimum (0: the whole job); an elastic gang when below instances
    elastic: bool


@dataclass(frozen=True)
class Act:
    kind: str
    which: int  # which job, modulo those it may be


submits = st.builds(
    Submit,
    st.sampled_from(POOLS),
    st.integers(1, 4),
    st.sampled_from([0.0, 1.0, 2.0, 2.0]),
    st.sampled_from([0.1, 0.25, 0.3, 1.0, 1.5]),  # sums of tenths are inexact in floats
    st.integers(0, 2),
    st.booleans(),
    st.sampled_from([0, 1, 1, 2]),  # mostly gangs that run in part while the rest queues
    st.booleans(),
)
acts = st.builds(
    Act,
    st.sampled_from(
        ["cycle", "cycle", "place", "succeed", "fail", "kill", "kills_done", "delete", "wait"]
    ),
    st.integers(0, 1_000),
)


def apply(h: Harness, op: Submit | Act, jobs: list[str]) -> None:
    if isinstance(op, Submit):
        elastic = op.elastic and 0 < op.least < op.instances
        jobs.append(
            h.submit(
                op.pool,
                op.instances,
                gpu=op.gpu,
                cpu=op.cpu,
                priority=op.priority,
                preemptible=op.preemptible,
                min_instances=min(op.least, op.instances),
                elastic=elastic,
                max_failures=2,
                backoff_seconds=2,
            )
        )
        return
    live = [j for j in jobs if j in h.jobs._jobs and h.job(j).state not in JOB_TERMINAL]
    job = live[op.which % len(live)] if live else None
    if op.kind == "cycle":
        h.cycle()
    elif op.kind == "place":
        h.place_all()
    elif op.kind == "wait":
        h.clock.advance(1.5)
    elif op.kind == "kills_done":
        h.complete_kills()
    elif job is None:
        return
    elif op.kind == "succeed":
        h.finish(job)
    elif op.kind == "fail":
        running = h.jobs.instances(job, {T.RUNNING})
        if running:
            attempt = {t.instance_id: t.current.attempt for t in h.tasks(job)}[running[0]]
            h.jobs.update_tasks(job, [TaskUpdate(running[0], attempt, T.FAILED)])
    elif op.kind == "kill":
        h.jobs.kill_job(job)
    elif op.kind == "delete":
        ended = [j for j in jobs if j in h.jobs._jobs and h.job(j).state in JOB_TERMINAL]
        if ended:
            h.jobs.delete_job(ended[op.which % len(ended)])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(submits, acts, acts), min_size=1, max_size=40))
def test_the_book_equals_one_built_from_scratch_after_any_changes(ops: list[Submit | Act]) -> None:
    h = Harness.in_memory(Resources(cpu=6, mem_mb=4096, gpu=6))
    h.pool("/a", gpu_reservation=2)
    h.rm.create_pool(
        PoolConfig(
            "/b", kinds={"gpu": KindConfig(reservation=1)}, queue_policy=QueuePolicy.BACKFILL
        )
    )
    jobs: list[str] = []
    for op in ops:
        apply(h, op, jobs)
        # The resource manager hears of changes between cycles; reading them is a cycle's work.
        with h.rm._lock:
            h.rm._refresh_dirty()
        check_book(h.rm)
    h.cycle()
    check_book(h.rm)


# ---------------------------------------------------------------------------- admission


gangs = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 2, 4, 8]),  # gpus
        st.sampled_from([0, 4]),  # cpus
        st.integers(0, 1),  # priority
        st.booleans(),  # preemptible
    ),
    min_size=3,
    max_size=30,
)


@settings(max_examples=1000, deadline=None)
@given(
    gangs,
    st.integers(0, 12),  # the pool's GPU entitlement: some gangs are bigger
    st.integers(0, 8),
    st.integers(0, 8),
    st.integers(0, 24),
    st.sampled_from(list(QueuePolicy)),
    st.lists(st.tuples(st.integers(1, 50), st.integers(1, 8)), max_size=6),  # running: end, gpus
    st.lists(st.sampled_from([5.0, 20.0, math.inf]), min_size=30, max_size=30),  # run times
)
def test_admission_decides_alike_when_every_gang_has_its_own_shape(
    drawn: list[tuple[int, int, int, bool]],
    entitlement: int,
    allocation: int,
    reservation: int,
    free_gpu: int,
    policy: QueuePolicy,
    ends: list[tuple[int, int]],
    runtimes: list[float],
) -> None:
    def queue(nudge: float) -> list[Waiting]:
        # ``nudge``: each gang's memory (which never binds here) moved by its own amount, too
        # small for any reason to show, so that no two gangs share a shape.
        return order(
            [
                Waiting(
                    f"j{i}",
                    priority,
                    preemptible,
                    float(i),
                    i,
                    1,
                    Resources(cpu=cpu, mem_mb=1024 + nudge * (i + 1), gpu=gpu),
                )
                for i, (gpu, cpu, priority, preemptible) in enumerate(drawn)
            ],
            policy,
        )

    room = Room(
        "/p",
        entitlement=Resources(cpu=64, mem_mb=math.inf, gpu=entitlement),
        allocation=Resources(gpu=allocation),
        reservation=Resources(cpu=math.inf, mem_mb=math.inf, disk_mb=math.inf, gpu=reservation),
        np_allocation=Resources(),
        limit=Resources(cpu=math.inf, mem_mb=math.inf, disk_mb=math.inf, gpu=16),
    )
    cluster = Resources(cpu=128, mem_mb=math.inf, gpu=32)
    free = Resources(cpu=96, mem_mb=math.inf, gpu=free_gpu)
    # BACKFILL and LAS pools: the hosts hold every gang but each third one.
    outlook = (
        Outlook(
            0.0,
            [(float(end), Resources(cpu=4 * gpus, gpu=gpus)) for end, gpus in ends],
            {f"j{i}": runtime for i, runtime in enumerate(runtimes)},
            lambda w: None if w.seq % 3 else "no host has room",
        )
        if policy in (QueuePolicy.BACKFILL, QueuePolicy.LAS)
        else None
    )
    shared = admit(queue(0.0), room, free, cluster, outlook=outlook)
    own = admit(queue(1e-9), room, free, cluster, outlook=outlook)
    assert [g.key for g in shared.admitted] == [g.key for g in own.admitted]
    assert shared.pending == own.pending
    assert shared.infeasible == own.infeasible
    assert [g.key for g in shared.starved] == [g.key for g in own.starved]
    assert [g.key for g in shared.over_entitlement] == [g.key for g in own.over_entitlement]
    # What is available is taken down by every admission (it is kept between them).
    total = sum((g.total for g in shared.admitted), Resources())
    assert total.fits_in(room.entitlement - room.allocation)
    assert total.fits_in(free)
    held = sum((g.total for g in shared.admitted if not g.preemptible), Resources())
    assert held.fits_in(room.reservation)


# ---------------------------------------------------------------------------- the simulator


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, list[TraceJob], list[PoolConfig], str]:
    hosts = draw(st.integers(1, 3))
    pools = [
        PoolConfig(p, kinds={"gpu": KindConfig(reservation=draw(st.sampled_from([0, 2, 4])))})
        for p in POOLS
    ]
    jobs = []
    for i in range(draw(st.integers(1, 25))):
        per = draw(st.sampled_from([0, 1, 2, 4]))
        jobs.append(
            TraceJob(
                job_id=f"j{i}",
                arrival_s=draw(st.integers(0, 300)),
                tasks=draw(st.integers(1, hosts if per else 3)),
                gpu_per_task=per,
                cpu_per_task=draw(st.sampled_from([0.5, 1.0, 2.5])) * max(1, per),
                mem_mb_per_task=8192.0 * max(1, per),
                duration_s=draw(st.integers(1, 200)),
                pool=draw(st.sampled_from(POOLS)),
                priority=draw(st.integers(0, 2)),
                preemptible=draw(st.booleans()),
                name=draw(st.sampled_from(["a", "b"])),
                max_runtime_s=draw(st.sampled_from([0, 0, 120])),
            )
        )
    policy = draw(st.sampled_from([p.value for p in QueuePolicy]))
    return hosts, jobs, pools, policy


def decided(result: RunResult) -> list[object]:
    return [
        [(o.first_start, o.completed, o.failed, o.preemptions) for o in result.outcomes],
        result.cycles,
        result.preemptions,
        [(s.t, s.busy_gpus, s.waiting, s.running) for s in result.samples],
        [(p.pool, p.allocation, p.entitlement) for p in result.pools],
    ]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_the_simulator_decides_alike_with_everything_rebuilt_before_every_cycle(
    scenario: tuple[int, list[TraceJob], list[PoolConfig], str],
) -> None:
    hosts, jobs, pools, policy = scenario
    cluster = generate_hosts(hosts, 4)
    incremental = Simulation(jobs, cluster, pools, policy).run()
    sim = Simulation(jobs, cluster, pools, policy)
    rm = sim.rm
    assert rm is not None
    cycle = rm.run_cycle

    def from_scratch(max_admissions: int | None = None, *, when_changed: bool = False) -> None:
        views = [dataclasses.replace(v) for v in rm._views.values()]  # no caches
        rm._views = {v.job.id: v for v in views}
        rm._book = fresh_book(views)
        cycle(max_admissions, when_changed=when_changed)

    rm.run_cycle = from_scratch  # type: ignore[method-assign]
    assert decided(sim.run()) == decided(incremental)
