"""The resource manager end to end over a real database: the failure modes of naive gang
schedulers (gangpeers.md §4), each as a scenario that would fail on one."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from resmgr_support import Harness

from peloton.core.resources import Resources
from peloton.core.states import JobState, TaskState
from peloton.errors import FailedPrecondition, InvalidArgument
from peloton.resmgr import admission
from peloton.resmgr.manager import ResourceManager
from peloton.storage.db import Database

T = TaskState

sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


@pytest.fixture
def cluster16(db: Database) -> Iterator[Harness]:
    yield Harness(db, Resources(cpu=10_000, mem_mb=1e9, disk_mb=1e9, gpu=16))


def test_gangs_are_admitted_whole_and_the_reason_is_readable(cluster16: Harness) -> None:
    h = cluster16
    h.pool("/vision", 8)
    a = h.submit("/vision", 6)
    b = h.submit("/vision", 12)
    h.cycle()
    assert h.counts(a) == {"READY": 6}
    assert h.counts(b) == {"PENDING": 12}
    job = h.job(b)
    assert (job.reason, job.message) == (
        admission.PENDING_ENTITLEMENT,
        "pool /vision: gpu entitlement 16, allocated 6, gang needs 12",
    )
    assert h.job(a).reason == "admitted"
    h.place_all()
    h.finish(a)
    h.cycle()
    assert h.counts(b) == {"READY": 12}


@sqlite_only
def test_two_100_task_gangs_on_100_gpus_never_deadlock(db: Database) -> None:
    h = Harness(db, Resources(cpu=1000, mem_mb=1e9, disk_mb=1e9, gpu=100))
    h.pool("/p")
    first, second = h.submit("/p", 100), h.submit("/p", 100)
    h.cycle()
    # One whole gang holds everything; the other holds nothing (a partial admission of both
    # would deadlock: each waiting forever for the other's GPUs).
    assert sorted([h.counts(first), h.counts(second)], key=str) == [
        {"PENDING": 100},
        {"READY": 100},
    ]
    winner = first if h.counts(first) == {"READY": 100} else second
    loser = second if winner == first else first
    h.place_all()
    h.finish(winner)
    h.cycle()
    assert h.counts(loser) == {"READY": 100}


def test_borrowed_gpus_are_reclaimed_within_one_cycle_plus_grace(cluster16: Harness) -> None:
    h = cluster16
    h.pool("/owner", 8)
    h.pool("/borrower", 8)
    borrowers = [h.submit("/borrower", 4, name=f"b{i}") for i in range(4)]
    h.cycle()
    h.place_all()
    assert h.gpus_held("/borrower") == 16  # it borrowed the owner's idle 8

    owner = h.submit("/owner", 8, name="owner")
    h.cycle()  # the owner's gang waits one cycle (hysteresis), then ...
    assert h.counts(owner) == {"PENDING": 8}
    assert h.job(owner).reason == admission.PENDING_CLUSTER
    h.cycle()  # ... its pool takes back what it lent: two whole 4-GPU gangs, the youngest
    victims = [p.job_id for p in h.preemptions]
    assert sorted(victims) == sorted(borrowers[2:])
    for v in victims:
        assert h.counts(v) == {"PREEMPTING": 4}
        assert any("pool /owner reclaims it" in e.message for e in h.jobs.job_events(v))
    assert len(h.killer.calls) == 2 and all(grace == 5 for _, grace in h.killer.calls)
    h.cycle()
    assert h.counts(owner) == {"PENDING": 8}, "nothing is admitted before the victims end"
    h.complete_kills()  # the grace period ends
    h.cycle()
    assert h.counts(owner) == {"READY": 8}
    for v in victims:
        job = h.job(v)
        assert job.state == JobState.PENDING  # requeued, not failed
        assert h.counts(v) == {"PENDING": 4}
        reasons = [e.reason for e in h.jobs.job_events(v)]
        assert "preempted" in reasons
    assert len(h.preemptions) == 2


def test_no_ping_pong_between_two_pools_over_1000_cycles(db: Database) -> None:
    h = Harness(db, Resources(cpu=10_000, mem_mb=1e9, disk_mb=1e9, gpu=16))
    h.pool("/a", 8)
    h.pool("/b", 8)
    rng = random.Random(7)
    # /b fills the idle cluster first; then both keep far more demand than fits, forever.
    queued = {"/a": [h.submit("/b", 3, name=f"b-first{i}") for i in range(5)], "/b": []}
    h.cycle()
    h.place_all()
    for pool in ("/a", "/b"):
        queued[pool] += [h.submit(pool, rng.choice([1, 2, 3]), name="q") for _ in range(6)]
    running: list[str] = []
    for _ in range(1000):
        h.cycle()
        running += h.place_all()
        h.complete_kills()
        if running and rng.random() < 0.05:  # now and then a gang ends; demand stays high
            done = running.pop(rng.randrange(len(running)))
            if h.counts(done).get("RUNNING"):
                h.finish(done)
                pool = h.job(done).spec.pool
                h.submit(pool, rng.choice([1, 2, 3]), name="q")
    # The initial reclaim happens; after it, neither pool ever takes capacity back from the
    # pool that just took from it.
    assert h.preemptions, "the scenario must exercise preemption"
    flips = [
        (x, y)
        for x, y in zip(h.preemptions, h.preemptions[1:], strict=False)
        if x.pool != y.pool and y.cycle - x.cycle < 100
    ]
    assert flips == []
    assert len(h.preemptions) <= 5
    # And the guarantees hold at the end: both pools use their reservation.
    assert h.gpus_held("/a") >= 6 and h.gpus_held("/b") >= 6


def test_non_preemptible_work_never_runs_on_borrowed_capacity(cluster16: Harness) -> None:
    h = cluster16
    h.pool("/a", 4)
    h.pool("/b", 12)  # idle: its 12 GPUs could be borrowed
    np_jobs = [h.submit("/a", 2, preemptible=False) for _ in range(4)]
    flexible = h.submit("/a", 6)
    h.cycle()
    admitted = [j for j in np_jobs if h.counts(j) == {"READY": 2}]
    assert len(admitted) == 2  # 4 GPUs: the reservation
    waiting = [j for j in np_jobs if j not in admitted]
    assert [h.job(j).reason for j in waiting] == [
        admission.PENDING_RESERVATION,
        admission.PENDING_BEHIND,  # first come, first served among them
    ]
    assert h.counts(flexible) == {"READY": 6}  # preemptible work may borrow


def test_an_infeasible_gang_fails_fast_with_its_reason(cluster16: Harness) -> None:
    h = cluster16
    h.pool("/small", 2, 8)
    h.pool("/unlimited")
    too_big = h.submit("/small", 9)
    too_big_for_cluster = h.submit("/unlimited", 2, gpu=10)
    h.cycle()
    job = h.job(too_big)
    assert job.state == JobState.FAILED
    assert (job.reason, job.message) == (
        admission.INFEASIBLE,
        "pool /small: gang needs 9 gpu, limit is 8; the gang can never fit",
    )
    assert h.job(too_big_for_cluster).state == JobState.FAILED
    assert "cluster: gang needs 20 gpu, capacity is 16" in h.job(too_big_for_cluster).message


def test_higher_priority_preempts_lower_inside_a_pool(cluster16: Harness) -> None:
    h = cluster16
    h.pool("/p", 0, 8)
    low = h.submit("/p", 8, priority=1)
    h.cycle()
    h.place_all()
    high = h.submit("/p", 4, priority=9)
    h.cycle(2)
    assert h.counts(low) == {"PREEMPTING": 8}
    assert any("this job has priority 1" in e.message for e in h.jobs.job_events(low))
    h.complete_kills()
    h.cycle()
    assert h.counts(high) == {"READY": 4}
    assert h.counts(low) == {"PENDING": 8}
    # A lower-priority gang never preempts a higher one.
    h.place_all()
    h.cycle(3)
    assert h.counts(high) == {"RUNNING": 4}
    assert len(h.preemptions) == 1


def test_min_instances_gang_first_then_single_tasks(cluster16: Harness) -> None:
    h = cluster16
    h.pool("/p", 0, 5)
    job = h.submit("/p", 8, min_instances=4)
    h.cycle()
    # The 4-task gang, then one more task fits the limit of 5.
    assert h.counts(job) == {"READY": 5, "PENDING": 3}


def test_state_is_rebuilt_from_the_database(cluster16: Harness) -> None:
    h = cluster16
    h.pool("/p", 4)
    running = h.submit("/p", 4)
    h.cycle()
    h.place_all()
    ready = h.submit("/p", 2)
    waiting = h.submit("/p", 12)
    h.cycle()
    assert h.counts(ready) == {"READY": 2}

    again = ResourceManager(h.pools, h.jobs, clock=h.seconds)
    h.jobs.set_scheduler(again)
    again.load()
    again.set_capacity(h.capacity)
    again.run_cycle()
    assert again.status("/p").kinds["gpu"].allocation == 6
    assert [g.job_id for g in again.take_admitted(10)] == [ready]
    assert h.counts(waiting) == {"PENDING": 12}
    assert h.counts(running) == {"RUNNING": 4}


def test_jobs_go_only_into_existing_leaf_pools(cluster16: Harness) -> None:
    h = cluster16
    h.pool("/org")
    h.pool("/org/team")
    with pytest.raises(InvalidArgument) as info:
        h.submit("/nope", 1)
    assert info.value.field == "pool"
    with pytest.raises(InvalidArgument, match="jobs run only in leaf pools"):
        h.submit("/org", 1)
    job = h.submit("/org/team", 1)
    with pytest.raises(FailedPrecondition, match="1 unfinished jobs"):
        h.rm.delete_pool("/org/team")
    h.jobs.kill_job(job)
    h.rm.delete_pool("/org/team")
    assert "/org/team" not in h.rm.pool_tree()


def test_status_reports_borrowing_and_lending(cluster16: Harness) -> None:
    h = cluster16
    h.pool("/lender", 8)
    h.pool("/borrower", 2)
    h.submit("/borrower", 6)
    h.cycle()
    lender = h.rm.status("/lender").kinds["gpu"]
    borrower = h.rm.status("/borrower").kinds["gpu"]
    assert (borrower.allocation, borrower.borrowed, borrower.lent) == (6, 4, 0)
    assert (lender.allocation, lender.lent, lender.borrowed) == (0, 8, 0)
    root = h.rm.status("/").kinds["gpu"]
    assert (root.reservation, root.allocation, root.entitlement) == (16, 6, 16)
    assert h.rm.status("/borrower").queued_gangs == 0


def test_a_job_killed_and_restarted_between_cycles_gets_its_reason_again(
    cluster16: Harness,
) -> None:
    """The kill and the restart write their own reasons; a cycle that sees neither (it runs
    only after both) must still say why the job waits, not skip it as already explained."""
    h = cluster16
    h.pool("/vision", 8)
    a = h.submit("/vision", 6)
    b = h.submit("/vision", 12)
    h.cycle()
    waiting = (h.job(b).reason, h.job(b).message)
    assert waiting[0] == admission.PENDING_ENTITLEMENT
    h.jobs.kill_job(b)
    h.jobs.restart_job(b)
    assert (h.job(b).state, h.job(b).reason) == (JobState.PENDING, "restarted")
    h.cycle()
    assert (h.job(b).reason, h.job(b).message) == waiting
    assert h.counts(a) == {"READY": 6}
