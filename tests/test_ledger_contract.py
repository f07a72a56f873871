"""The job ledger's contract (:mod:`peloton.core.ledger`), run on the job manager over SQLite and
on the in-memory ledger alike: the same calls must leave the same states, reasons, attempts and
kills, and tell the scheduler the same jobs, so tests on the in-memory one say something about
the real one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon import migrated_sqlite_url
from ledger_memory import MemoryLedger, counts
from support import TO_RUNNING, FakeClock, RecordingKiller, make_spec

from peloton.core.records import TaskUpdate
from peloton.core.states import NOT_LAUNCHED, Goal, JobState, TaskState
from peloton.errors import FailedPrecondition, NotFound
from peloton.jobmgr.manager import JobManager
from peloton.storage.db import Database

T = TaskState


class Told:
    """A scheduler that accepts every pool and remembers which jobs it was told changed."""

    def __init__(self) -> None:
        self.changed: list[str] = []

    def check_pool(self, pool: str) -> None:
        pass

    def job_changed(self, job_id: str) -> None:
        self.changed.append(job_id)


class Setup:
    def __init__(self, ledger: JobManager | MemoryLedger, killer: RecordingKiller) -> None:
        self.ledger = ledger
        self.killer = killer
        self.told = Told()
        ledger.set_scheduler(self.told)

    def job(self, instances: int, **kw: Any) -> str:
        job, _ = self.ledger.create_job(make_spec(instances, **kw))
        self.told.changed.clear()
        return job.id

    def running(self, instances: int, **kw: Any) -> str:
        job_id = self.job(instances, **kw)
        self.ledger.admit_pending([(job_id, instances, "in")])
        for state in TO_RUNNING[1:]:
            self.ledger.update_tasks(
                job_id, [TaskUpdate(i, 1, state, host=f"h{i}") for i in range(instances)]
            )
        self.told.changed.clear()
        return job_id

    def counts(self, job_id: str) -> dict[str, int]:
        return dict(counts(self.ledger.get_job(job_id)))


@pytest.fixture(params=["memory", "sqlite"])
def s(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Setup]:
    clock, killer = FakeClock(), RecordingKiller()
    if request.param == "memory":
        yield Setup(MemoryLedger(clock=clock, killer=killer), killer)
        return
    db = Database.from_url(migrated_sqlite_url(tmp_path))
    yield Setup(JobManager(db, clock=clock, killer=killer), killer)
    db.dispose()


def test_admission_moves_the_lowest_pending_whole_or_not_at_all(s: Setup) -> None:
    a, b = s.job(4, min_instances=2), s.job(2)
    assert s.ledger.admit_pending([(a, 2, "gang"), (b, 3, "too many")]) == [(0, 1), ()]
    assert s.counts(a) == {"READY": 2, "PENDING": 2}
    assert s.counts(b) == {"PENDING": 2}
    job = s.ledger.get_job(a)
    assert (job.state, job.reason, job.message) == (JobState.PENDING, "admitted", "gang")
    assert s.ledger.instances(a, {T.PENDING}) == (2, 3)
    assert s.ledger.attempts(a, {T.READY}) == {0: 1, 1: 1}
    assert s.told.changed == [a, b]
    s.ledger.kill_job(b)
    assert s.ledger.admit_pending([(b, 1, "killed meanwhile")]) == [()]


def test_a_pending_reason_is_said_only_of_a_pending_job_and_moves_nothing(s: Setup) -> None:
    waiting, running = s.job(1), s.running(1)
    s.ledger.set_pending_reasons(
        {
            waiting: ("pending_entitlement", "pool /p: full"),
            running: ("pending_entitlement", "ignored"),
        }
    )
    assert (s.ledger.get_job(waiting).reason, s.ledger.get_job(waiting).message) == (
        "pending_entitlement",
        "pool /p: full",
    )
    assert s.ledger.get_job(running).reason != "pending_entitlement"
    assert s.told.changed == []


def test_failing_pending_tasks_fails_a_job_with_nothing_else(s: Setup) -> None:
    job_id = s.job(3)
    got = s.ledger.fail_pending(job_id, "infeasible", "needs 96 GPUs")
    assert (got.state, got.reason, got.message) == (JobState.FAILED, "infeasible", "needs 96 GPUs")
    assert counts(got) == {"FAILED": 3}
    assert s.told.changed == [job_id]
    assert s.ledger.unfinished_jobs() == []


def test_an_unplaceable_gang_fails_its_admitted_and_waiting_tasks(s: Setup) -> None:
    job_id = s.job(3, min_instances=2)
    s.ledger.admit_pending([(job_id, 2, "in")])
    got = s.ledger.fail_unplaceable(job_id, "no set of the cluster's hosts fits")
    assert (got.state, got.reason) == (JobState.FAILED, "unplaceable")
    assert counts(got) == {"FAILED": 3}


def test_preemption_takes_the_gang_back_and_requeues_it_once_killed(s: Setup) -> None:
    job_id = s.running(2, kill_grace_seconds=7)
    got = s.ledger.preempt(job_id, "pool /owner reclaims it")
    assert counts(got) == {"PREEMPTING": 2}
    assert s.killer.calls == [([f"{job_id}-0-1", f"{job_id}-1-1"], 7)]
    assert s.told.changed == [job_id]
    for i in (0, 1):
        s.ledger.update_tasks(job_id, [TaskUpdate(i, 1, T.KILLED)])
    job = s.ledger.get_job(job_id)
    assert (job.state, job.gang_failures, counts(job)) == (JobState.PENDING, 0, {"PENDING": 2})
    assert s.ledger.attempts(job_id, {T.PENDING}) == {0: 2, 1: 2}
    assert s.ledger.unfinished_jobs()[0].id == job_id


def test_preempting_an_admitted_gang_returns_it_to_pending_without_a_kill(s: Setup) -> None:
    job_id = s.job(2)
    s.ledger.admit_pending([(job_id, 2, "in")])
    got = s.ledger.preempt(job_id, "priority")
    assert counts(got) == {"PENDING": 2}
    assert s.killer.calls == []
    assert s.ledger.attempts(job_id, {T.PENDING}) == {0: 1, 1: 1}


def test_interrupted_placements_go_back_to_ready(s: Setup) -> None:
    placing, other = s.job(2), s.job(1)
    s.ledger.admit_pending([(placing, 2, "in"), (other, 1, "in")])
    s.ledger.update_tasks(placing, [TaskUpdate(i, 1, T.PLACING) for i in (0, 1)])
    s.ledger.update_tasks(placing, [TaskUpdate(1, 1, T.PLACED)])
    s.told.changed.clear()
    assert s.ledger.requeue_placements() == [placing]
    assert s.counts(placing) == {"READY": 2}
    assert s.told.changed == [placing]
    assert s.ledger.requeue_placements() == []


def test_task_updates_are_all_or_nothing_and_stale_ones_are_ignored(s: Setup) -> None:
    job_id = s.job(2)
    s.ledger.admit_pending([(job_id, 2, "in")])
    with pytest.raises(FailedPrecondition):
        s.ledger.update_tasks(job_id, [TaskUpdate(0, 1, T.PLACING), TaskUpdate(1, 1, T.RUNNING)])
    assert s.counts(job_id) == {"READY": 2}
    got = s.ledger.update_tasks(job_id, [TaskUpdate(0, 9, T.PLACING)])  # an old attempt
    assert counts(got) == {"READY": 2}
    with pytest.raises(NotFound):
        s.ledger.update_tasks(job_id, [TaskUpdate(5, 1, T.PLACING)])


def test_a_failed_gang_task_takes_the_rest_down_then_restarts_it_whole(s: Setup) -> None:
    job_id = s.running(3, max_failures=1, backoff_seconds=10)
    got = s.ledger.update_tasks(job_id, [TaskUpdate(1, 1, T.FAILED, "failed", "exit 3")])
    assert counts(got) == {"KILLING": 2, "PENDING": 1}
    assert (got.gang_failures, got.reason) == (1, "gang_restart")
    assert sorted(s.killer.killed) == [f"{job_id}-0-1", f"{job_id}-2-1"]
    for i in (0, 2):
        s.ledger.update_tasks(job_id, [TaskUpdate(i, 1, T.KILLED)])
    job = s.ledger.get_job(job_id)
    assert (job.state, counts(job)) == (JobState.PENDING, {"PENDING": 3})
    assert job.not_before is not None
    assert s.ledger.attempts(job_id, {T.PENDING}) == {0: 2, 1: 2, 2: 2}
    # Out of restarts: the next failure fails the job with its reason.
    s.ledger.admit_pending([(job_id, 3, "in")])
    for state in TO_RUNNING[1:]:
        s.ledger.update_tasks(job_id, [TaskUpdate(i, 2, state) for i in range(3)])
    s.ledger.update_tasks(job_id, [TaskUpdate(0, 2, T.LOST, "agent_lost")])
    for i in (1, 2):
        s.ledger.update_tasks(job_id, [TaskUpdate(i, 2, T.KILLED)])
    job = s.ledger.get_job(job_id)
    assert (job.state, job.reason, job.goal) == (JobState.FAILED, "agent_lost", Goal.RUN)
    assert job.message.startswith("instance 0 lost (agent_lost)")


def test_a_gang_whose_launch_never_reached_mesos_restarts_now_with_nothing_counted(
    s: Setup,
) -> None:
    job_id = s.job(2, max_failures=0, backoff_seconds=60)
    s.ledger.admit_pending([(job_id, 2, "in")])
    for state in TO_RUNNING[1:4]:  # PLACING, PLACED, LAUNCHING
        s.ledger.update_tasks(job_id, [TaskUpdate(i, 1, state) for i in range(2)])
    lost = [TaskUpdate(i, 1, T.LOST, NOT_LAUNCHED, "unknown to the master") for i in range(2)]
    got = s.ledger.update_tasks(job_id, lost)
    assert (got.state, got.gang_failures, counts(got)) == (JobState.PENDING, 0, {"PENDING": 2})
    assert got.not_before is not None
    assert s.ledger.attempts(job_id, {T.PENDING}) == {0: 2, 1: 2}
    assert s.killer.killed == []


def test_reads_of_jobs_that_do_not_exist(s: Setup) -> None:
    job_id = s.job(1)
    assert [j.id for j in s.ledger.get_jobs([job_id, "nope"])] == [job_id]
    assert s.ledger.attempts("nope", {T.PENDING}) == {}
    with pytest.raises(NotFound):
        s.ledger.get_job("nope")
    with pytest.raises(NotFound):
        s.ledger.preempt("nope", "x")
