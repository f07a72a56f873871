"""Gangs that live and die together: a failed task takes its gang down, the gang restarts whole
after the backoff until max_failures, and a job is stopped at its max runtime."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from resmgr_support import Harness
from support import TO_RUNNING, FakeClock, RecordingKiller, make_spec

from peloton.core.records import TaskUpdate
from peloton.core.resources import Resources
from peloton.core.states import NOT_LAUNCHED, TASK_ACTIVE, Goal, JobState, TaskState
from peloton.jobmgr import restarts
from peloton.jobmgr.manager import MAX_RUNTIME, JobManager
from peloton.storage.db import Database

T = TaskState
J = JobState


@pytest.fixture
def h(db: Database) -> Iterator[Harness]:
    yield Harness(db, Resources(cpu=10_000, mem_mb=1e9, disk_mb=1e9, gpu=16))


def _running_gang(h: Harness, n: int = 4, **kw: int) -> str:
    job_id = h.submit("/default", n, **kw)
    h.cycle()
    assert job_id in h.place_all()
    assert h.counts(job_id) == {"RUNNING": n}
    return job_id


def _fail(h: Harness, job_id: str, instance: int, state: TaskState = T.FAILED) -> None:
    attempt = {t.instance_id: t.current.attempt for t in h.tasks(job_id)}[instance]
    h.jobs.update_tasks(job_id, [TaskUpdate(instance, attempt, state, "failed", "exit status 3")])


def _killed(h: Harness, attempt_id: str) -> None:
    job_id, instance, attempt = attempt_id.rsplit("-", 2)
    h.jobs.update_tasks(job_id, [TaskUpdate(int(instance), int(attempt), T.KILLED)])


def test_failed_task_takes_the_gang_down_and_it_restarts_whole_after_the_backoff(
    h: Harness,
) -> None:
    job_id = _running_gang(h, 4, backoff_seconds=10)
    _fail(h, job_id, 2)
    # The rest of the gang is being killed (with the job's grace), on every host.
    assert h.counts(job_id) == {"KILLING": 3, "PENDING": 1}
    ids, grace = h.killer.calls[-1]
    assert sorted(ids) == [f"{job_id}-{i}-1" for i in (0, 1, 3)]
    assert grace == 5
    job = h.job(job_id)
    assert (job.gang_failures, job.reason) == (1, restarts.GANG_RESTART)
    assert "instance 2 failed" in job.message and "gang failure 1 of 3" in job.message
    # While the old run is stopping, the failed task's new attempt is not admitted alone.
    h.cycle(2)
    assert h.rm.take_admitted(100) == []
    h.complete_kills()
    assert h.counts(job_id) == {"PENDING": 4}
    job = h.job(job_id)
    assert job.state == J.PENDING and job.reason == restarts.GANG_RESTART
    assert all(t.current.attempt == 2 for t in h.tasks(job_id))
    # Admitted again only once the backoff has passed, as one gang of 4.
    h.cycle(5)
    assert h.counts(job_id) == {"PENDING": 4}
    h.cycle(6)
    gangs = h.rm.take_admitted(100)
    assert [(g.job_id, g.instances) for g in gangs] == [(job_id, (0, 1, 2, 3))]


def test_the_gang_fails_with_the_first_failure_once_max_failures_is_spent(h: Harness) -> None:
    job_id = _running_gang(h, 3, max_failures=1, backoff_seconds=0)
    _fail(h, job_id, 0)
    h.complete_kills()
    h.cycle()
    h.place_all()
    _fail(h, job_id, 1)
    assert h.job(job_id).state == J.RUNNING  # the others are still being killed
    h.complete_kills()
    job = h.job(job_id)
    assert job.state == J.FAILED
    assert job.reason == "failed"
    assert job.message.startswith("instance 1 failed (failed): exit status 3")
    assert "the gang failed 2 times (restart.max_failures is 1)" in job.message
    assert h.counts(job_id) == {"FAILED": 1, "KILLED": 2}
    # No new attempt was started.
    assert all(t.current.attempt == 2 for t in h.tasks(job_id))


def test_max_failures_zero_fails_on_the_first_failure(h: Harness) -> None:
    job_id = _running_gang(h, 2, max_failures=0)
    _fail(h, job_id, 1, T.LOST)
    h.complete_kills()
    job = h.job(job_id)
    assert (job.state, job.gang_failures) == (J.FAILED, 1)
    assert job.message.startswith("instance 1 lost")


def test_a_failure_lost_with_a_sibling_blames_the_task_that_failed(
    manager: JobManager, killer: RecordingKiller
) -> None:
    job, _ = manager.create_job(make_spec(3, max_failures=0))
    for i in range(3):
        manager.update_tasks(job.id, [TaskUpdate(i, 1, s, host="h") for s in TO_RUNNING])
    # The executor took the task group down: the sibling reads as lost in the same batch.
    got = manager.update_tasks(
        job.id,
        [TaskUpdate(0, 1, T.LOST, "killed"), TaskUpdate(1, 1, T.FAILED, "failed", "exit 1")],
    )
    assert got.gang_failures == 1
    assert got.message.startswith("instance 1 failed (failed): exit 1")
    assert killer.killed == [f"{job.id}-2-1"]


def _launching(manager: JobManager, n: int, **kw: int) -> str:
    """A job of ``n`` tasks recorded LAUNCHING (their ACCEPT about to go out)."""
    job, _ = manager.create_job(make_spec(n, **kw))
    for i in range(n):
        manager.update_tasks(job.id, [TaskUpdate(i, 1, s, host="h") for s in TO_RUNNING[:4]])
    assert manager.get_task(job.id, n - 1)[0].state == T.LAUNCHING
    return job.id


def _never_reached(instance: int, attempt: int = 1) -> TaskUpdate:
    return TaskUpdate(instance, attempt, T.LOST, NOT_LAUNCHED, "the master never heard of it")


def test_a_gang_whose_launch_never_reached_mesos_restarts_at_once_counting_nothing(
    manager: JobManager, killer: RecordingKiller, clock: FakeClock
) -> None:
    """The daemon that led recorded the launch and stopped before its ACCEPT went out: the
    reconciliation of its successor finds the tasks unknown. With max_failures 0 and a minute
    of backoff, a counted failure would fail the job."""
    job_id = _launching(manager, 3, max_failures=0, backoff_seconds=60)
    got = manager.update_tasks(job_id, [_never_reached(0)])
    assert (got.state, got.gang_failures, got.not_before) == (J.RUNNING, 0, clock.now)
    assert got.message.startswith("instance 0 lost (not_launched)")
    assert "not counted as a failure; restarting the whole gang now" in got.message
    assert sorted(killer.killed) == [f"{job_id}-1-1", f"{job_id}-2-1"]
    # The siblings' ACCEPT was lost with it: found unknown too, they start again as well.
    got = manager.update_tasks(job_id, [_never_reached(1), _never_reached(2)])
    assert (got.state, got.gang_failures, got.not_before) == (J.PENDING, 0, clock.now)
    tasks, _ = manager.list_tasks(job_id)
    assert {(t.current.state, t.current.attempt, t.failures) for t in tasks} == {(T.PENDING, 2, 0)}


def test_a_counted_failure_with_one_that_never_launched_is_a_gang_failure() -> None:
    spec = make_spec(2, min_instances=2, max_failures=3, backoff_seconds=10)
    now = FakeClock().now
    lost = restarts.Failure(0, T.LOST, NOT_LAUNCHED, "")
    failed = restarts.Failure(1, T.FAILED, "failed", "exit 1")
    plan = restarts.plan(spec, 0, [lost, failed], {0: 0, 1: 1}, now)
    assert (plan.action, plan.counted) == (restarts.Action.RESTART_GANG, True)
    assert plan.not_before == now + timedelta(seconds=10)
    alone = restarts.plan(spec, 3, [lost], {0: 0}, now)
    assert (alone.action, alone.counted, alone.not_before) == (
        restarts.Action.RESTART_GANG,
        False,
        now,
    )


def test_independent_tasks_that_never_launched_start_again_at_once(manager: JobManager) -> None:
    job_id = _launching(manager, 2, min_instances=1, max_failures=0, backoff_seconds=60)
    got = manager.update_tasks(job_id, [_never_reached(1)])
    assert (got.state, got.gang_failures) == (J.RUNNING, 0)
    task, _ = manager.get_task(job_id, 1)
    assert (task.current.state, task.current.attempt, task.failures) == (T.PENDING, 2, 0)
    assert manager.get_task(job_id, 0)[0].state == T.LAUNCHING


def test_independent_tasks_restart_alone_each_within_its_own_limit(
    manager: JobManager, killer: RecordingKiller, clock: FakeClock
) -> None:
    job, _ = manager.create_job(make_spec(3, min_instances=1, max_failures=1, backoff_seconds=7))
    for i in range(3):
        manager.update_tasks(job.id, [TaskUpdate(i, 1, s, host="h") for s in TO_RUNNING])
    got = manager.update_tasks(job.id, [TaskUpdate(1, 1, T.FAILED, "failed", "exit 1")])
    assert dict(got.task_counts) == {T.RUNNING: 2, T.PENDING: 1}
    assert killer.killed == []  # nobody else is touched
    assert got.not_before == clock.now + timedelta(seconds=7)
    manager.update_tasks(job.id, [TaskUpdate(1, 2, s, host="h") for s in TO_RUNNING])
    got = manager.update_tasks(job.id, [TaskUpdate(1, 2, T.FAILED, "failed", "exit 1")])
    # Its second failure is over the limit: it stays FAILED; the others run on.
    assert dict(got.task_counts) == {T.RUNNING: 2, T.FAILED: 1}
    for i in (0, 2):
        manager.update_tasks(job.id, [TaskUpdate(i, 1, T.SUCCEEDED)])
    assert manager.get_job(job.id).state == J.FAILED


def test_a_task_failing_while_being_killed_is_not_another_gang_failure(h: Harness) -> None:
    job_id = _running_gang(h, 3)
    _fail(h, job_id, 0)
    # A sibling exits non-zero on SIGTERM: it was being killed, so it just ends.
    _fail(h, job_id, 1)
    assert h.job(job_id).gang_failures == 1
    h.complete_kills()
    assert h.counts(job_id) == {"PENDING": 3}


def test_restart_job_starts_the_gang_failure_count_over(h: Harness) -> None:
    job_id = _running_gang(h, 2, max_failures=0)
    _fail(h, job_id, 0)
    h.complete_kills()
    assert h.job(job_id).state == J.FAILED
    job = h.jobs.restart_job(job_id)
    assert (job.gang_failures, job.not_before) == (0, None)
    h.cycle()
    assert h.place_all() == [job_id]


def test_preempted_gang_is_requeued_whole_not_in_pieces(h: Harness) -> None:
    job_id = _running_gang(h, 4)
    h.jobs.preempt(job_id, "reclaimed")
    first, *rest = h.killer.killed
    _killed(h, first)
    h.cycle(2)
    # One task has a new attempt, three are still being preempted: nothing is admitted.
    assert h.rm.take_admitted(100) == []
    assert h.job(job_id).gang_failures == 0  # preemption is not a failure
    for attempt_id in rest:
        _killed(h, attempt_id)
    h.cycle()
    assert [g.instances for g in h.rm.take_admitted(100)] == [(0, 1, 2, 3)]


def test_max_runtime_kills_the_job_counted_from_its_first_start(h: Harness) -> None:
    job_id = _running_gang(h, 2, max_runtime_seconds=60)
    h.clock.advance(30)
    assert h.jobs.expire_jobs() == []
    h.clock.advance(31)
    assert h.jobs.expire_jobs() == [job_id]
    assert h.jobs.expire_jobs() == []  # being killed already
    job = h.job(job_id)
    assert (job.state, job.reason) == (J.KILLING, MAX_RUNTIME)
    assert "max_runtime_seconds (60 s)" in job.message
    h.complete_kills()
    job = h.job(job_id)
    assert (job.state, job.reason) == (J.KILLED, MAX_RUNTIME)


def test_a_job_without_max_runtime_is_never_expired(h: Harness) -> None:
    _running_gang(h, 2)
    h.clock.advance(10 * 365 * 86_400)
    assert h.jobs.expire_jobs() == []


# A gang's life as a random sequence of events: a task fails or is lost, kills complete, the
# gang is admitted and launched again.
Step = tuple[str, int]
steps = st.lists(
    st.tuples(st.sampled_from(["fail", "lose", "kills", "relaunch"]), st.integers(0, 3)),
    max_size=25,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=steps, max_failures=st.integers(0, 3))
def test_no_task_of_a_gang_ever_runs_alone(
    db: Database, steps: list[Step], max_failures: int
) -> None:
    h = Harness(db, Resources(cpu=10_000, mem_mb=1e9, disk_mb=1e9, gpu=64))
    job_id = _running_gang(h, 4, max_failures=max_failures, backoff_seconds=0)
    for action, instance in steps:
        tasks = {t.instance_id: t for t in h.tasks(job_id)}
        if action in ("fail", "lose") and tasks[instance].state == T.RUNNING:
            _fail(h, job_id, instance, T.FAILED if action == "fail" else T.LOST)
        elif action == "kills":
            h.complete_kills()
        elif action == "relaunch":
            h.cycle()
            h.place_all()
        job = h.job(job_id)
        tasks = {t.instance_id: t for t in h.tasks(job_id)}
        # After a failure, nothing of the gang runs on with the goal to run: every task still
        # on a host is being killed, unless the whole gang was launched again.
        running = [t for t in tasks.values() if t.state == T.RUNNING]
        assert len(running) in (0, 4)
        if any(t.state in TASK_ACTIVE and t.goal == Goal.RUN for t in tasks.values()):
            assert all(t.state == T.RUNNING for t in tasks.values())
        assert job.gang_failures <= max_failures + 1
        stopped = not any(t.state in TASK_ACTIVE for t in tasks.values())
        assert (job.state == J.FAILED) == (job.gang_failures > max_failures and stopped)
    # The database is shared by the examples: leave nothing running for the next.
    if not h.job(job_id).terminal:
        h.jobs.kill_job(job_id)
        h.complete_kills()
