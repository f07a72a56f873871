"""JobManager over SQLite and PostgreSQL: create, read, list, update, kill, restart, delete."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select
from support import (
    LIFECYCLE,
    TO_RUNNING,
    FakeClock,
    RecordingKiller,
    drive,
    job_event_chain_problems,
    task_event_chain_problems,
)
from support import (
    independent_spec as make_spec,
)
from support import (
    make_spec as gang_spec,
)

from peloton.core.records import (
    EventRecord,
    JobFilter,
    JobRecord,
    Placement,
    TaskUpdate,
    launch_updates,
)
from peloton.core.states import (
    TASK_TERMINAL,
    TASK_TRANSITIONS,
    Goal,
    JobState,
    TaskState,
    derive_job_state,
    task_transition_allowed,
)
from peloton.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from peloton.jobmgr.manager import JobManager
from peloton.storage import jobs as repo
from peloton.storage.db import Database
from peloton.storage.models import JobEventRow, JobLabelRow, JobRow, TaskAttemptRow, TaskRow

T = TaskState
J = JobState


def all_events(manager: JobManager, job_id: str) -> list[EventRecord]:
    """Every event of a job, oldest first, read page by page."""
    out: list[EventRecord] = []
    while page := manager.job_events(job_id, after=out[-1].sequence if out else 0, limit=1000):
        out.extend(page)
    return out


def job_events(manager: JobManager, job_id: str) -> list[EventRecord]:
    return [e for e in all_events(manager, job_id) if e.instance_id is None]


def job_level_events(db: Database, job_id: str) -> list[tuple[str, str]]:
    """(from, to) of a job's job-level events, straight from the table (for huge jobs)."""
    with db.reading() as s:
        rows = s.execute(
            select(JobEventRow.from_state, JobEventRow.to_state)
            .where(JobEventRow.job_id == job_id, JobEventRow.instance_id.is_(None))
            .order_by(JobEventRow.id)
        )
        return [(a, b) for a, b in rows]


def job_hops(manager: JobManager, job_id: str) -> list[tuple[str, str]]:
    return [(e.from_state, e.to_state) for e in job_events(manager, job_id)]


def task_events(manager: JobManager, job_id: str, instance_id: int) -> list[EventRecord]:
    return manager.get_task(job_id, instance_id)[1]


def all_ids(manager: JobManager, flt: JobFilter | None = None) -> list[str]:
    jobs, token = manager.list_jobs(flt or JobFilter(), page_size=1000)
    assert token == ""
    return [j.id for j in jobs]


def row_counts(db: Database, job_id: str) -> dict[str, int]:
    with db.reading() as s:
        return {
            model.__tablename__: s.scalar(
                select(func.count()).select_from(model).where(model.job_id == job_id)
            )
            or 0
            for model in (TaskRow, JobEventRow, JobLabelRow, TaskAttemptRow)
        } | {"jobs": s.scalar(select(func.count()).select_from(JobRow).where(JobRow.id == job_id))}


def check_consistent(manager: JobManager, job_id: str) -> JobRecord:
    """The invariants every committed job keeps; returns the job."""
    job = manager.get_job(job_id)
    assert job.state == derive_job_state(job.task_counts, job.goal)
    events = job_events(manager, job_id)
    assert job_event_chain_problems(events) == []
    assert events[-1].to_state == job.state
    # Every change of the job row writes a job event, and vice versa.
    assert job.version == len(events)
    tasks, _ = manager.list_tasks(job_id, page_size=10_000)
    # The job's materialized counts agree with its task rows.
    assert dict(job.task_counts) == dict(Counter(t.state for t in tasks))
    if job.goal == Goal.KILL:
        # A job being killed has nothing left but tasks being killed (never a new attempt).
        assert all(t.state in TASK_TERMINAL or t.state == T.KILLING for t in tasks)
        assert all(t.goal == Goal.KILL for t in tasks if t.state not in TASK_TERMINAL)
    for task in tasks:
        evs = task_events(manager, job_id, task.instance_id)
        assert task_event_chain_problems(evs) == [], task.instance_id
        if evs:
            assert evs[-1].to_state == task.state
            assert evs[-1].attempt_id == task.current.id
        assert task.current.attempt == len(task.history) + 1
    return job


# ---------------------------------------------------------------------------- create


def test_create_job_writes_pending_tasks_and_one_event(
    manager: JobManager, clock: FakeClock, killer: RecordingKiller
) -> None:
    before = manager.events.generation()
    job, created = manager.create_job(gang_spec(3, labels={"team": "vision"}))
    assert created is True
    assert manager.events.generation() > before
    assert job.state == J.PENDING
    assert job.goal == Goal.RUN
    assert job.version == 1
    assert job.created_at == job.updated_at == clock.now
    assert dict(job.task_counts) == {T.PENDING: 3}
    assert (job.reason, job.message) == ("", "")
    # The stored spec is the spec with its defaults.
    assert job.spec.pool == "/default"
    assert job.spec.gang.min_instances == 3
    assert job.spec.preemption.kill_grace_seconds == 30
    assert dict(job.spec.labels) == {"team": "vision"}
    assert manager.get_job(job.id) == job

    tasks, token = manager.list_tasks(job.id)
    assert token == ""
    assert [t.instance_id for t in tasks] == [0, 1, 2]
    for t in tasks:
        assert (t.state, t.goal, t.failures, t.history) == (T.PENDING, Goal.RUN, 0, ())
        assert t.current.attempt == 1
        assert t.current.id == f"{job.id}-{t.instance_id}-1"
        assert t.current.started_at is None and t.current.ended_at is None

    events = manager.job_events(job.id)
    assert len(events) == 1
    [e] = events
    assert (e.instance_id, e.from_state, e.to_state, e.reason) == (None, "", "PENDING", "created")
    assert e.message == "3 tasks in pool /default"
    assert e.time == clock.now
    assert killer.calls == []
    check_consistent(manager, job.id)


def test_create_invalid_spec_writes_nothing(manager: JobManager) -> None:
    spec = make_spec(2)
    spec.task.resources.gpu = 0.5
    with pytest.raises(InvalidArgument) as info:
        manager.create_job(spec, request_id="r1")
    assert info.value.field == "task.resources.gpu"
    assert all_ids(manager) == []


def test_create_refuses_a_long_request_id(manager: JobManager) -> None:
    with pytest.raises(InvalidArgument) as info:
        manager.create_job(make_spec(), request_id="r" * 129)
    assert info.value.field == "request_id"
    manager.create_job(make_spec(), request_id="r" * 128)


def test_create_is_idempotent_on_request_id(manager: JobManager, clock: FakeClock) -> None:
    first, created = manager.create_job(make_spec(2), request_id="req-1")
    assert created
    clock.advance(5)
    again, created_again = manager.create_job(make_spec(2), request_id="req-1")
    assert created_again is False
    assert again.id == first.id
    assert again.created_at == first.created_at
    # Defaults are applied before comparing: naming the default pool is the same spec.
    same, created_same = manager.create_job(make_spec(2, pool="/default"), request_id="req-1")
    assert (same.id, created_same) == (first.id, False)
    with pytest.raises(AlreadyExists, match="req-1"):
        manager.create_job(make_spec(3), request_id="req-1")
    # Without a request id every call makes a new job; another request id makes another job.
    other, _ = manager.create_job(make_spec(2), request_id="req-2")
    plain1, _ = manager.create_job(make_spec(2))
    plain2, _ = manager.create_job(make_spec(2))
    assert len({first.id, other.id, plain1.id, plain2.id}) == 4
    assert sorted(all_ids(manager)) == sorted([first.id, other.id, plain1.id, plain2.id])
    assert len(manager.job_events(first.id)) == 1


def test_concurrent_creates_with_one_request_id_make_one_job(manager: JobManager) -> None:
    n = 8
    barrier = threading.Barrier(n)
    results: list[tuple[str, bool]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def create() -> None:
        barrier.wait()
        try:
            job, created = manager.create_job(make_spec(50), request_id="same-request")
        except BaseException as exc:  # reported below
            with lock:
                errors.append(exc)
            return
        with lock:
            results.append((job.id, created))

    threads = [threading.Thread(target=create) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == n
    assert len({job_id for job_id, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    [job_id] = all_ids(manager)
    assert manager.get_job(job_id).task_counts == {T.PENDING: 50}
    assert len(manager.job_events(job_id)) == 1


def test_concurrent_creates_with_one_request_id_and_different_specs(manager: JobManager) -> None:
    n = 6
    barrier = threading.Barrier(n)
    made: list[tuple[str, bool, int]] = []
    refused: list[AlreadyExists] = []
    lock = threading.Lock()

    def create(instances: int) -> None:
        barrier.wait()
        try:
            job, created = manager.create_job(make_spec(instances), request_id="contested")
        except AlreadyExists as exc:
            with lock:
                refused.append(exc)
            return
        with lock:
            made.append((job.id, created, instances))

    threads = [threading.Thread(target=create, args=(2 + i % 2,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # One spec won; every request with it got the job, every request with the other was refused.
    [job_id] = all_ids(manager)
    winner = manager.get_job(job_id).spec.instances
    assert {m[0] for m in made} == {job_id}
    assert sum(m[1] for m in made) == 1
    assert all(m[2] == winner for m in made)
    assert len(made) == n // 2 and len(refused) == n // 2


# ---------------------------------------------------------------------------- not found


def test_unknown_job_and_instance_are_not_found(manager: JobManager) -> None:
    missing = "00000000-0000-0000-0000-000000000000"
    calls: list[Callable[[], object]] = [
        lambda: manager.get_job(missing),
        lambda: manager.get_task(missing, 0),
        lambda: manager.list_tasks(missing),
        lambda: manager.job_events(missing),
        lambda: manager.kill_job(missing),
        lambda: manager.restart_job(missing),
        lambda: manager.delete_job(missing),
        lambda: manager.update_tasks(missing, [TaskUpdate(0, 1, T.READY)]),
    ]
    for call in calls:
        with pytest.raises(NotFound, match=missing):
            call()
    job, _ = manager.create_job(make_spec(2))
    with pytest.raises(NotFound, match="no instance 2"):
        manager.get_task(job.id, 2)
    with pytest.raises(NotFound, match="no instance 7"):
        manager.update_tasks(job.id, [TaskUpdate(0, 1, T.READY), TaskUpdate(7, 1, T.READY)])
    # The update batch that named a missing instance wrote nothing.
    assert manager.get_task(job.id, 0)[0].state == T.PENDING
    assert len(manager.job_events(job.id)) == 1


# ---------------------------------------------------------------------------- listing


def test_list_jobs_filters(manager: JobManager, clock: FakeClock) -> None:
    def make(name: str, pool: str, labels: dict[str, str]) -> str:
        clock.advance(1)
        return manager.create_job(make_spec(1, name=name, pool=pool, labels=labels))[0].id

    a = make("resnet-a", "/research/vision", {"team": "vision", "tier": "gold"})
    b = make("resnet_b", "/research/vision", {"team": "vision", "tier": "silver"})
    c = make("resnetxb", "/research/nlp", {"team": "nlp", "tier": "gold"})
    d = make("bert", "/research", {"team": "nlp"})
    e = make("Resnet-upper", "/default", {})
    # d ends (KILLED), a runs.
    manager.kill_job(d)
    drive(manager, a, 0, TO_RUNNING)

    def ids(**kwargs: object) -> set[str]:
        return set(all_ids(manager, JobFilter(**kwargs)))  # type: ignore[arg-type]

    assert ids() == {a, b, c, d, e}
    assert ids(states=frozenset({J.KILLED})) == {d}
    assert ids(states=frozenset({J.PENDING, J.KILLED})) == {b, c, d, e}
    assert ids(states=frozenset({J.SUCCEEDED})) == set()
    # pool: exact, not a prefix
    assert ids(pool="/research/vision") == {a, b}
    assert ids(pool="/research") == {d}
    assert ids(pool="/resea") == set()
    # name prefix: literal, so '_' is not a wildcard and '%' matches nothing
    assert ids(name_prefix="resnet") == {a, b, c}
    assert ids(name_prefix="resnet_") == {b}
    assert ids(name_prefix="resnet-") == {a}
    assert ids(name_prefix="%") == set()
    assert ids(name_prefix="resnet%") == set()
    assert ids(name_prefix="_") == set()
    assert ids(name_prefix="resnet_b") == {b}
    assert ids(name_prefix="bert") == {d}
    assert ids(name_prefix="bertx") == set()
    # ... and case-sensitive on every backend
    assert ids(name_prefix="Resnet") == {e}
    assert ids(name_prefix="RESNET") == set()
    # labels: every one must match
    assert ids(labels={"team": "vision"}) == {a, b}
    assert ids(labels={"tier": "gold"}) == {a, c}
    assert ids(labels={"team": "vision", "tier": "gold"}) == {a}
    assert ids(labels={"team": "nlp", "tier": "silver"}) == set()
    assert ids(labels={"team": "vision", "missing": ""}) == set()
    assert ids(labels={"team": "Vision"}) == set()
    # all filters together
    assert ids(
        states=frozenset({J.RUNNING}),
        pool="/research/vision",
        name_prefix="resnet",
        labels={"team": "vision"},
    ) == {a}
    # listed jobs carry their task counts
    jobs, _ = manager.list_jobs(JobFilter(name_prefix="resnet-a"))
    assert [dict(j.task_counts) for j in jobs] == [{T.RUNNING: 1}]


def test_list_jobs_newest_first_pages_cover_everything_once(
    manager: JobManager, clock: FakeClock
) -> None:
    # Several jobs share each created_at, so the id breaks ties.
    created: list[JobRecord] = []
    for group in (4, 1, 5, 3):
        for _ in range(group):
            created.append(manager.create_job(make_spec(1))[0])
        clock.advance(0.000001 if group == 1 else 60)
    expected = [j.id for j in sorted(created, key=lambda j: (j.created_at, j.id), reverse=True)]
    assert all_ids(manager) == expected

    for size in (1, 2, 3, 4, 5, 12, 13, 14):
        seen: list[str] = []
        token = ""
        pages = 0
        while True:
            jobs, token = manager.list_jobs(JobFilter(), page_size=size, page_token=token)
            pages += 1
            assert len(jobs) <= size
            seen.extend(j.id for j in jobs)
            if not token:
                break
            assert len(jobs) == size
        assert seen == expected, size
        assert pages == max(1, -(-len(expected) // size)), size


def test_list_jobs_pages_with_a_filter_and_while_jobs_are_added(
    manager: JobManager, clock: FakeClock
) -> None:
    ids = []
    for i in range(9):
        job, _ = manager.create_job(make_spec(1, labels={"k": "odd" if i % 2 else "even"}))
        ids.append(job.id)
        if i % 3 == 2:
            clock.advance(1)
    flt = JobFilter(labels={"k": "even"})
    first, token = manager.list_jobs(flt, page_size=2)
    assert token
    # Jobs created after the first page (newer) do not shift later pages.
    clock.advance(10)
    manager.create_job(make_spec(1, labels={"k": "even"}))
    rest: list[str] = []
    while token:
        page, token = manager.list_jobs(flt, page_size=2, page_token=token)
        rest.extend(j.id for j in page)
    even = [ids[i] for i in range(0, 9, 2)]
    expected = [j for j in all_ids(manager, flt) if j in even]
    assert [j.id for j in first] + rest == expected


@pytest.mark.parametrize(
    "token",
    [
        "garbage!!",
        "not base64 at all ~~~",
        repo.encode_token(["only-one"]),
        repo.encode_token([1, 2]),
        repo.encode_token(["not a time", "id"]),
        repo.encode_token(["2026-01-01T00:00:00", "naive-time"]),
        repo.encode_token(["2026-01-01", "date-only"]),
        repo.encode_token([7]),  # a ListTasks token
        "e30=",  # {}
        "bnVsbA==",  # null
        "_w==",  # not UTF-8
    ],
)
def test_list_jobs_refuses_a_bad_page_token(manager: JobManager, token: str) -> None:
    manager.create_job(make_spec(1))
    with pytest.raises(InvalidArgument) as info:
        manager.list_jobs(JobFilter(), page_size=1, page_token=token)
    assert info.value.field == "page_token"


def test_page_size_bounds(manager: JobManager) -> None:
    for _ in range(101):
        manager.create_job(make_spec(1))
    jobs, token = manager.list_jobs(JobFilter())
    assert (len(jobs), bool(token)) == (100, True)
    assert len(manager.list_jobs(JobFilter(), page_size=1000)[0]) == 101
    assert len(manager.list_jobs(JobFilter(), page_size=1)[0]) == 1
    for bad in (-1, 1001, 10**9):
        with pytest.raises(InvalidArgument) as info:
            manager.list_jobs(JobFilter(), page_size=bad)
        assert info.value.field == "page_size"
    job_id = jobs[0].id
    manager.list_tasks(job_id, page_size=10_000)
    for bad in (-5, 10_001):
        with pytest.raises(InvalidArgument) as info:
            manager.list_tasks(job_id, page_size=bad)
        assert info.value.field == "page_size"


def test_list_tasks_pages_and_filters(manager: JobManager) -> None:
    job, _ = manager.create_job(make_spec(25))
    manager.update_tasks(job.id, [TaskUpdate(i, 1, T.READY) for i in range(0, 25, 3)])
    ready = list(range(0, 25, 3))
    for size in (1, 4, 7, 25, 26):
        seen: list[int] = []
        token = ""
        while True:
            page, token = manager.list_tasks(job.id, page_size=size, page_token=token)
            seen.extend(t.instance_id for t in page)
            if not token:
                break
        assert seen == list(range(25)), size
    seen = []
    token = ""
    while True:
        page, token = manager.list_tasks(
            job.id, states=frozenset({T.READY}), page_size=2, page_token=token
        )
        assert all(t.state == T.READY for t in page)
        seen.extend(t.instance_id for t in page)
        if not token:
            break
    assert seen == ready
    both, _ = manager.list_tasks(job.id, states=frozenset({T.READY, T.PENDING}))
    assert len(both) == 25
    none, token = manager.list_tasks(job.id, states=frozenset({T.RUNNING}))
    assert (none, token) == ([], "")
    for bad in ("%%%", repo.encode_token(["x"]), repo.encode_token([1, 2])):
        with pytest.raises(InvalidArgument):
            manager.list_tasks(job.id, page_token=bad)


# ---------------------------------------------------------------------------- task updates


def test_lifecycle_to_succeeded(manager: JobManager, clock: FakeClock) -> None:
    job, _ = manager.create_job(make_spec(2))
    for i in (0, 1):
        for state in LIFECYCLE[:3]:  # READY, PLACING, PLACED
            clock.advance(1)
            got = manager.update_tasks(job.id, [TaskUpdate(i, 1, state)])
            assert got.state == J.PENDING
    clock.advance(1)
    got = manager.update_tasks(job.id, [TaskUpdate(0, 1, T.LAUNCHING, host="h0")])
    assert (got.state, got.version) == (J.RUNNING, 2)
    launched_at = clock.now
    for state in LIFECYCLE[4:7]:
        clock.advance(1)
        manager.update_tasks(job.id, [TaskUpdate(0, 1, state)])
    running_at = clock.now
    drive(manager, job.id, 1, LIFECYCLE[3:7], host="h1")
    clock.advance(1)
    got = manager.update_tasks(job.id, [TaskUpdate(0, 1, T.SUCCEEDED, "exited", "exit 0")])
    assert got.state == J.RUNNING
    assert dict(got.task_counts) == {T.SUCCEEDED: 1, T.RUNNING: 1}
    clock.advance(1)
    got = manager.update_tasks(job.id, [TaskUpdate(1, 1, T.SUCCEEDED)])
    assert got.state == J.SUCCEEDED
    assert got.terminal
    assert got.version == 3
    assert got.updated_at == clock.now
    assert dict(got.task_counts) == {T.SUCCEEDED: 2}

    assert job_hops(manager, job.id) == [
        ("", "PENDING"),
        ("PENDING", "RUNNING"),
        ("RUNNING", "SUCCEEDED"),
    ]
    events = job_events(manager, job.id)
    assert events[1].time == launched_at
    task, evs = manager.get_task(job.id, 0)
    assert task.state == T.SUCCEEDED
    assert task.current.host == "h0"
    assert task.current.started_at == running_at
    assert task.current.ended_at == clock.now - timedelta(seconds=1)
    assert (task.current.reason, task.current.message) == ("exited", "exit 0")
    assert [(e.from_state, e.to_state) for e in evs] == list(
        zip(("PENDING", *LIFECYCLE[:-1]), LIFECYCLE, strict=True)
    )
    assert all(e.attempt_id == f"{job.id}-0-1" for e in evs)
    assert all(e.instance_id == 0 for e in evs)
    # Until LAUNCHING names it, events carry no host; afterwards the task's host.
    assert [e.host for e in evs] == ["", "", "", "h0", "h0", "h0", "h0", "h0"]
    assert task.version == 1 + len(LIFECYCLE)
    check_consistent(manager, job.id)


def test_several_updates_in_one_call(manager: JobManager) -> None:
    job, _ = manager.create_job(make_spec(3))
    got = manager.update_tasks(
        job.id,
        [
            TaskUpdate(0, 1, T.READY),
            TaskUpdate(0, 1, T.PLACING),
            TaskUpdate(1, 1, T.READY),
            TaskUpdate(2, 1, T.FAILED, "unplaceable", "no host has 8 GPUs"),
        ],
    )
    assert dict(got.task_counts) == {T.PLACING: 1, T.READY: 1, T.FAILED: 1}
    assert got.state == J.RUNNING  # an ended task counts as started
    assert [(e.from_state, e.to_state) for e in task_events(manager, job.id, 0)] == [
        ("PENDING", "READY"),
        ("READY", "PLACING"),
    ]
    check_consistent(manager, job.id)


def test_illegal_transition_writes_nothing(manager: JobManager, clock: FakeClock) -> None:
    job, _ = manager.create_job(make_spec(2))
    drive(manager, job.id, 0, TO_RUNNING)
    before = manager.get_job(job.id)
    events_before = manager.job_events(job.id)
    task_before = manager.get_task(job.id, 1)[0]
    generation = manager.events.generation()
    clock.advance(1)
    with pytest.raises(FailedPrecondition, match="RUNNING cannot change to PENDING"):
        manager.update_tasks(
            job.id,
            [TaskUpdate(1, 1, T.READY), TaskUpdate(0, 1, T.PENDING), TaskUpdate(1, 1, T.PLACING)],
        )
    with pytest.raises(FailedPrecondition):
        manager.update_tasks(job.id, [TaskUpdate(1, 1, T.RUNNING)])
    after = manager.get_job(job.id)
    assert after == before
    assert after.version == before.version
    assert manager.job_events(job.id) == events_before
    assert manager.get_task(job.id, 1)[0] == task_before
    assert manager.events.generation() == generation


def test_same_state_update_is_a_no_op(manager: JobManager) -> None:
    job, _ = manager.create_job(make_spec(1))
    drive(manager, job.id, 0, [T.READY])
    events = manager.job_events(job.id)
    task = manager.get_task(job.id, 0)[0]
    manager.update_tasks(job.id, [TaskUpdate(0, 1, T.READY, "again", "dup")])
    assert manager.job_events(job.id) == events
    assert manager.get_task(job.id, 0)[0] == task


def test_terminal_task_cannot_move(manager: JobManager) -> None:
    job, _ = manager.create_job(make_spec(2))
    drive(manager, job.id, 0, LIFECYCLE)
    for state in (T.RUNNING, T.PENDING, T.FAILED, T.KILLED):
        with pytest.raises(FailedPrecondition):
            manager.update_tasks(job.id, [TaskUpdate(0, 1, state)])
    assert manager.get_task(job.id, 0)[0].state == T.SUCCEEDED


def test_stale_attempt_updates_are_ignored(manager: JobManager) -> None:
    job, _ = manager.create_job(make_spec(2))
    before = manager.get_job(job.id)
    # An attempt that does not exist yet is as stale as an old one.
    got = manager.update_tasks(job.id, [TaskUpdate(0, 2, T.READY), TaskUpdate(1, 0, T.FAILED)])
    assert got == before
    assert len(manager.job_events(job.id)) == 1

    drive(manager, job.id, 0, LIFECYCLE)
    drive(manager, job.id, 1, LIFECYCLE)
    manager.restart_job(job.id)
    events = manager.job_events(job.id)
    job_now = manager.get_job(job.id)
    # Late news about attempt 1 changes nothing, even mixed with a current update.
    got = manager.update_tasks(
        job.id,
        [TaskUpdate(0, 1, T.FAILED), TaskUpdate(1, 1, T.LOST), TaskUpdate(1, 2, T.READY)],
    )
    assert dict(got.task_counts) == {T.PENDING: 1, T.READY: 1}
    assert got.version == job_now.version
    new_events = manager.job_events(job.id, after=events[-1].sequence)
    assert [(e.instance_id, e.from_state, e.to_state, e.attempt_id) for e in new_events] == [
        (1, "PENDING", "READY", f"{job.id}-1-2")
    ]
    task = manager.get_task(job.id, 0)[0]
    assert (task.state, task.current.attempt, task.failures) == (T.PENDING, 2, 0)
    check_consistent(manager, job.id)


def test_failed_task_fails_the_job_once_all_ended(manager: JobManager, clock: FakeClock) -> None:
    job, _ = manager.create_job(make_spec(4))
    for i in range(4):
        drive(manager, job.id, i, TO_RUNNING)
    clock.advance(1)
    got = manager.update_tasks(job.id, [TaskUpdate(2, 1, T.FAILED, "oom", "out of memory")])
    assert got.state == J.RUNNING
    assert (got.reason, got.message) == ("", "")
    clock.advance(1)
    manager.update_tasks(job.id, [TaskUpdate(0, 1, T.LOST, "agent-lost", "host h0 gone")])
    clock.advance(1)
    manager.update_tasks(job.id, [TaskUpdate(1, 1, T.SUCCEEDED)])
    clock.advance(1)
    got = manager.update_tasks(job.id, [TaskUpdate(3, 1, T.FAILED, "exit", "exit code 1")])
    assert got.state == J.FAILED
    # The first failure in time (instance 2), not the lowest instance (0).
    assert got.reason == "oom"
    assert got.message == "instance 2: out of memory"
    assert job_hops(manager, job.id)[-1] == ("RUNNING", "FAILED")
    assert job_events(manager, job.id)[-1].reason == "oom"
    assert manager.get_task(job.id, 2)[0].failures == 1
    assert manager.get_task(job.id, 0)[0].failures == 1
    assert manager.get_task(job.id, 1)[0].failures == 0
    check_consistent(manager, job.id)


def test_failure_at_the_same_time_names_the_lowest_instance(manager: JobManager) -> None:
    job, _ = manager.create_job(make_spec(3))
    got = manager.update_tasks(
        job.id,
        [
            TaskUpdate(2, 1, T.FAILED, "unplaceable", "needs 9 GPUs"),
            TaskUpdate(1, 1, T.FAILED),
            TaskUpdate(0, 1, T.KILLED),
        ],
    )
    # A failed task makes the ended job FAILED, even if another was killed.
    assert got.state == J.FAILED
    assert (got.reason, got.message) == ("failed", "instance 1")
    job2, _ = manager.create_job(make_spec(2))
    got = manager.update_tasks(
        job2.id,
        [TaskUpdate(1, 1, T.FAILED, "unplaceable", "needs 9 GPUs"), TaskUpdate(0, 1, T.FAILED)],
    )
    assert got.state == J.FAILED
    assert (got.reason, got.message) == ("failed", "instance 0")
    assert job_hops(manager, job2.id) == [("", "PENDING"), ("PENDING", "FAILED")]


# ---------------------------------------------------------------------------- kill


def test_kill_pending_job_is_killed_at_once(
    manager: JobManager, killer: RecordingKiller, clock: FakeClock
) -> None:
    job, _ = manager.create_job(make_spec(3))
    drive(manager, job.id, 1, [T.READY, T.PLACING, T.PLACED])
    clock.advance(1)
    got = manager.kill_job(job.id, "wrong dataset")
    assert got.state == J.KILLED
    assert got.goal == Goal.KILL
    assert (got.reason, got.message) == ("killed", "wrong dataset")
    assert dict(got.task_counts) == {T.KILLED: 3}
    assert killer.calls == []
    assert job_hops(manager, job.id) == [("", "PENDING"), ("PENDING", "KILLED")]
    task, evs = manager.get_task(job.id, 1)
    assert (task.state, task.goal) == (T.KILLED, Goal.KILL)
    assert task.current.ended_at == clock.now
    assert (evs[-1].from_state, evs[-1].to_state, evs[-1].reason) == ("PLACED", "KILLED", "killed")
    check_consistent(manager, job.id)
    # Default message
    job2, _ = manager.create_job(make_spec(1))
    assert manager.kill_job(job2.id).message == "killed by user"


def test_kill_running_job(manager: JobManager, killer: RecordingKiller, db: Database) -> None:
    job, _ = manager.create_job(make_spec(5, kill_grace_seconds=17))
    drive(manager, job.id, 0, TO_RUNNING, host="h0")
    drive(manager, job.id, 1, LIFECYCLE[:4], host="h1")  # LAUNCHING
    drive(manager, job.id, 2, LIFECYCLE)  # SUCCEEDED
    drive(manager, job.id, 3, [T.READY])
    seen_by_killer: list[JobState] = []
    original_kill = killer.kill

    def kill(attempt_ids: list[str], grace_seconds: int) -> None:
        # The killer is told only after the commit: a fresh reader sees KILLING already.
        seen_by_killer.append(JobManager(db).get_job(job.id).state)
        original_kill(attempt_ids, grace_seconds)

    killer.kill = kill  # type: ignore[method-assign]
    got = manager.kill_job(job.id, "stop")
    assert got.state == J.KILLING
    assert got.goal == Goal.KILL
    assert dict(got.task_counts) == {T.KILLING: 2, T.SUCCEEDED: 1, T.KILLED: 2}
    assert seen_by_killer == [J.KILLING]
    assert len(killer.calls) == 1
    ids, grace = killer.calls[0]
    assert sorted(ids) == sorted([f"{job.id}-0-1", f"{job.id}-1-1"])
    assert grace == 17
    assert manager.get_task(job.id, 0)[0].state == T.KILLING
    assert manager.get_task(job.id, 2)[0].state == T.SUCCEEDED  # ended tasks are left alone

    got = manager.update_tasks(job.id, [TaskUpdate(0, 1, T.KILLED, "killed", "SIGTERM")])
    assert got.state == J.KILLING
    got = manager.update_tasks(job.id, [TaskUpdate(1, 1, T.FAILED, "exit", "exit 143")])
    assert got.state == J.KILLED
    assert (got.reason, got.message) == ("killed", "stop")
    assert job_hops(manager, job.id) == [
        ("", "PENDING"),
        ("PENDING", "RUNNING"),
        ("RUNNING", "KILLING"),
        ("KILLING", "KILLED"),
    ]
    check_consistent(manager, job.id)


def test_killer_registered_later_is_used(db: Database) -> None:
    manager = JobManager(db)
    job, _ = manager.create_job(make_spec(2))
    drive(manager, job.id, 0, TO_RUNNING)
    drive(manager, job.id, 1, TO_RUNNING)
    manager.update_tasks(job.id, [TaskUpdate(1, 1, T.PREEMPTING)])
    killer = RecordingKiller()
    manager.set_killer(killer)
    assert manager.kill_job(job.id).state == J.KILLING
    # PREEMPTING tasks are killed too (their grace is the job's).
    [(ids, grace)] = killer.calls
    assert (sorted(ids), grace) == ([f"{job.id}-0-1", f"{job.id}-1-1"], 30)


def test_kill_twice_is_idempotent(manager: JobManager, killer: RecordingKiller) -> None:
    job, _ = manager.create_job(make_spec(2))
    drive(manager, job.id, 0, TO_RUNNING)
    first = manager.kill_job(job.id)
    events = manager.job_events(job.id)
    second = manager.kill_job(job.id, "again")
    assert second.state == J.KILLING
    assert second.version == first.version
    assert second == first
    assert manager.job_events(job.id) == events
    assert len(killer.calls) == 1


@pytest.mark.parametrize("end", [T.SUCCEEDED, T.FAILED, T.KILLED])
def test_kill_ended_job_is_refused(manager: JobManager, end: TaskState) -> None:
    job, _ = manager.create_job(make_spec(1))
    drive(manager, job.id, 0, [*TO_RUNNING, end])
    before = manager.get_job(job.id)
    assert before.terminal
    with pytest.raises(FailedPrecondition, match="already"):
        manager.kill_job(job.id)
    assert manager.get_job(job.id) == before


def test_kill_killed_job_is_refused(manager: JobManager) -> None:
    job, _ = manager.create_job(make_spec(1))
    manager.kill_job(job.id)
    with pytest.raises(FailedPrecondition, match="KILLED"):
        manager.kill_job(job.id)


def test_kill_preempting_task(manager: JobManager, killer: RecordingKiller) -> None:
    job, _ = manager.create_job(make_spec(1))
    drive(manager, job.id, 0, [*TO_RUNNING, T.PREEMPTING])
    got = manager.kill_job(job.id)
    assert got.state == J.KILLING
    manager.update_tasks(job.id, [TaskUpdate(0, 1, T.KILLED)])
    assert manager.get_job(job.id).state == J.KILLED
    check_consistent(manager, job.id)


# ---------------------------------------------------------------------------- restart


def test_restart_refused_while_pending_or_killing(manager: JobManager) -> None:
    job, _ = manager.create_job(make_spec(2))
    with pytest.raises(FailedPrecondition, match="PENDING"):
        manager.restart_job(job.id)
    drive(manager, job.id, 0, TO_RUNNING)
    manager.kill_job(job.id)
    before = manager.get_job(job.id)
    with pytest.raises(FailedPrecondition, match="KILLING"):
        manager.restart_job(job.id)
    assert manager.get_job(job.id) == before


@pytest.mark.parametrize("end", [T.SUCCEEDED, T.FAILED, T.LOST])
def test_restart_ended_job_starts_attempt_two(
    manager: JobManager, killer: RecordingKiller, clock: FakeClock, end: TaskState
) -> None:
    job, _ = manager.create_job(make_spec(3))
    for i in range(3):
        drive(manager, job.id, i, [*TO_RUNNING, end if i == 1 else T.SUCCEEDED], host=f"h{i}")
    ended = manager.get_job(job.id)
    assert ended.terminal
    clock.advance(1)
    got = manager.restart_job(job.id, "try again")
    assert got.state == J.PENDING
    assert got.goal == Goal.RUN
    assert (got.reason, got.message) == ("restarted", "try again")
    assert dict(got.task_counts) == {T.PENDING: 3}
    assert killer.calls == []
    assert job_hops(manager, job.id)[-1] == (ended.state, "PENDING")
    tasks, _ = manager.list_tasks(job.id)
    for t in tasks:
        assert (t.state, t.goal, t.current.attempt, t.failures) == (T.PENDING, Goal.RUN, 2, 0)
        assert t.current.id == f"{job.id}-{t.instance_id}-2"
        assert t.current.host == ""
        assert t.current.started_at is None and t.current.ended_at is None
        [old] = t.history
        assert old.attempt == 1
        assert old.id == f"{job.id}-{t.instance_id}-1"
        assert old.state == (end if t.instance_id == 1 else T.SUCCEEDED)
        assert old.host == f"h{t.instance_id}"
        assert old.started_at is not None and old.ended_at is not None
    task, evs = manager.get_task(job.id, 1)
    assert task.history == tasks[1].history
    last = evs[-1]
    assert (last.from_state, last.to_state, last.reason) == (end.value, "PENDING", "restarted")
    assert last.attempt_id == f"{job.id}-1-2"
    # The new attempt runs like the first.
    for i in range(3):
        drive(manager, job.id, i, LIFECYCLE, attempt=2)
    assert manager.get_job(job.id).state == J.SUCCEEDED
    check_consistent(manager, job.id)


def test_restart_killed_job(manager: JobManager) -> None:
    job, _ = manager.create_job(make_spec(2))
    manager.kill_job(job.id)
    got = manager.restart_job(job.id)
    assert (got.state, got.goal) == (J.PENDING, Goal.RUN)
    assert manager.get_task(job.id, 0)[0].history[0].state == T.KILLED
    check_consistent(manager, job.id)


def test_restart_running_job_kills_then_restarts(
    manager: JobManager, killer: RecordingKiller
) -> None:
    job, _ = manager.create_job(make_spec(3, kill_grace_seconds=5))
    drive(manager, job.id, 0, TO_RUNNING, host="h0")
    drive(manager, job.id, 1, LIFECYCLE, host="h1")
    drive(manager, job.id, 2, [T.READY])
    got = manager.restart_job(job.id)
    assert got.state == J.RUNNING
    assert dict(got.task_counts) == {T.KILLING: 1, T.PENDING: 1, T.READY: 1}
    assert killer.calls == [([f"{job.id}-0-1"], 5)]
    t0 = manager.get_task(job.id, 0)[0]
    assert (t0.state, t0.goal, t0.current.attempt) == (T.KILLING, Goal.RESTART, 1)
    t1 = manager.get_task(job.id, 1)[0]
    assert (t1.state, t1.current.attempt) == (T.PENDING, 2)
    t2 = manager.get_task(job.id, 2)[0]
    assert (t2.state, t2.current.attempt) == (T.READY, 1)  # not started: left alone

    got = manager.update_tasks(job.id, [TaskUpdate(0, 1, T.KILLED, "killed", "SIGTERM")])
    t0, evs = manager.get_task(job.id, 0)
    assert (t0.state, t0.goal, t0.current.attempt) == (T.PENDING, Goal.RUN, 2)
    assert [(h.attempt, h.state, h.host) for h in t0.history] == [(1, T.KILLED, "h0")]
    assert [(e.from_state, e.to_state, e.attempt_id) for e in evs[-3:]] == [
        ("RUNNING", "KILLING", f"{job.id}-0-1"),
        ("KILLING", "KILLED", f"{job.id}-0-1"),
        ("KILLED", "PENDING", f"{job.id}-0-2"),
    ]
    # Nothing launched or ended any more: the job waits again.
    assert got.state == J.PENDING
    assert dict(got.task_counts) == {T.PENDING: 2, T.READY: 1}
    assert job_hops(manager, job.id)[-1] == ("RUNNING", "PENDING")
    # A late update about the killed attempt is stale.
    manager.update_tasks(job.id, [TaskUpdate(0, 1, T.FAILED)])
    assert manager.get_task(job.id, 0)[0].state == T.PENDING
    check_consistent(manager, job.id)


def test_restart_then_kill_does_not_start_new_attempts(
    manager: JobManager, killer: RecordingKiller
) -> None:
    job, _ = manager.create_job(make_spec(2))
    drive(manager, job.id, 0, TO_RUNNING)
    drive(manager, job.id, 1, TO_RUNNING)
    manager.restart_job(job.id)  # both KILLING, goal RESTART
    got = manager.kill_job(job.id)
    assert got.state == J.KILLING
    assert {t.goal for t in manager.list_tasks(job.id)[0]} == {Goal.KILL}
    manager.update_tasks(job.id, [TaskUpdate(0, 1, T.KILLED)])
    got = manager.update_tasks(job.id, [TaskUpdate(1, 1, T.KILLED)])
    # The kill wins: no new attempt is started for a job being killed.
    assert got.state == J.KILLED
    assert dict(got.task_counts) == {T.KILLED: 2}
    for i in (0, 1):
        task = manager.get_task(job.id, i)[0]
        assert (task.state, task.current.attempt, task.history) == (T.KILLED, 1, ())
    check_consistent(manager, job.id)


# ---------------------------------------------------------------------------- delete


def test_delete_only_ended_jobs(manager: JobManager, db: Database) -> None:
    job, _ = manager.create_job(make_spec(3, labels={"a": "1", "b": "2"}), request_id="del-1")
    with pytest.raises(FailedPrecondition, match="PENDING"):
        manager.delete_job(job.id)
    drive(manager, job.id, 0, TO_RUNNING)
    with pytest.raises(FailedPrecondition, match="RUNNING"):
        manager.delete_job(job.id)
    manager.kill_job(job.id)
    with pytest.raises(FailedPrecondition, match="KILLING"):
        manager.delete_job(job.id)
    manager.update_tasks(job.id, [TaskUpdate(0, 1, T.KILLED)])
    manager.restart_job(job.id)
    for i in range(3):
        drive(manager, job.id, i, LIFECYCLE, attempt=2)
    other, _ = manager.create_job(make_spec(2, labels={"a": "1"}))
    manager.kill_job(other.id)
    counts = row_counts(db, job.id)
    assert counts["jobs"] == 1 and counts["task_attempts"] == 3 and counts["job_labels"] == 2
    other_counts = row_counts(db, other.id)

    manager.delete_job(job.id)
    assert row_counts(db, job.id) == {
        "jobs": 0,
        "tasks": 0,
        "job_events": 0,
        "job_labels": 0,
        "task_attempts": 0,
    }
    assert row_counts(db, other.id) == other_counts
    with pytest.raises(NotFound):
        manager.get_job(job.id)
    with pytest.raises(NotFound):
        manager.delete_job(job.id)
    assert all_ids(manager) == [other.id]
    assert all_ids(manager, JobFilter(labels={"a": "1"})) == [other.id]
    # The request id is free again.
    again, created = manager.create_job(make_spec(3, labels={"a": "1", "b": "2"}), "del-1")
    assert created and again.id != job.id


# ---------------------------------------------------------------------------- tasks


def test_the_agent_and_executor_of_each_attempt_are_kept_with_it(manager: JobManager) -> None:
    # Where an attempt was launched names its sandbox: kept when it ends and when a new attempt
    # starts, one task alone (a failure restarts it) or the whole job (RestartJob, in bulk).
    job, _ = manager.create_job(gang_spec(2, min_instances=1, max_failures=1))

    def run(instance: int, attempt: int, agent: str) -> None:
        where = {"host": f"h-{agent}", "agent_id": agent, "executor_id": f"{agent}-executor"}
        manager.update_tasks(
            job.id, [TaskUpdate(instance, attempt, s, **where) for s in TO_RUNNING]
        )

    def places(instance: int) -> list[tuple[int, str, str, str]]:
        task, _ = manager.get_task(job.id, instance)
        return [
            (a.attempt, a.host, a.agent_id, a.executor_id) for a in (*task.history, task.current)
        ]

    for i in range(2):
        run(i, 1, f"a{i}")
    manager.update_tasks(job.id, [TaskUpdate(0, 1, T.FAILED, "failed", "exit 1")])
    assert places(0) == [(1, "h-a0", "a0", "a0-executor"), (2, "", "", "")]
    run(0, 2, "a2")
    # A status update without them leaves them as recorded.
    manager.update_tasks(job.id, [TaskUpdate(i, 1 + (i == 0), T.SUCCEEDED) for i in range(2)])
    assert places(0) == [(1, "h-a0", "a0", "a0-executor"), (2, "h-a2", "a2", "a2-executor")]
    manager.restart_job(job.id)
    assert places(0)[1:] == [(2, "h-a2", "a2", "a2-executor"), (3, "", "", "")]
    assert places(1) == [(1, "h-a1", "a1", "a1-executor"), (2, "", "", "")]


def test_get_task_returns_history_and_only_its_events(manager: JobManager) -> None:
    job, _ = manager.create_job(make_spec(2))
    drive(manager, job.id, 0, [*TO_RUNNING, T.FAILED])
    drive(manager, job.id, 1, LIFECYCLE)
    manager.restart_job(job.id)
    drive(manager, job.id, 0, [T.READY], attempt=2)
    task, evs = manager.get_task(job.id, 0)
    assert task.instance_id == 0
    assert task.current.attempt == 2 and task.state == T.READY
    assert [(h.attempt, h.state) for h in task.history] == [(1, T.FAILED)]
    assert task.failures == 0  # reset by the restart
    assert {e.instance_id for e in evs} == {0}
    assert [e.to_state for e in evs] == [
        *(s.value for s in TO_RUNNING),
        "FAILED",
        "PENDING",
        "READY",
    ]
    assert [e.sequence for e in evs] == sorted(e.sequence for e in evs)
    assert task_event_chain_problems(evs) == []
    # job_events paging by sequence
    all_events = manager.job_events(job.id)
    tail = manager.job_events(job.id, after=all_events[4].sequence, limit=3)
    assert tail == all_events[5:8]


# ---------------------------------------------------------------------------- property


# One step: which task, a pick among its legal next states (or any state), and what to do.
steps_st = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=2),
        st.integers(min_value=0, max_value=1000),
        st.sampled_from(["legal"] * 4 + ["launch"] * 2 + ["any", "kill", "restart"]),
    ),
    min_size=1,
    max_size=30,
)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=steps_st)
def test_random_operations_keep_the_job_consistent(
    manager: JobManager, steps: list[tuple[int, int, str]]
) -> None:
    """Any sequence of updates, kills and restarts leaves a job whose state, events and versions
    agree; refused operations change nothing; the job can always be ended and deleted."""
    job, _ = manager.create_job(make_spec(3))
    for instance, pick, op in steps:
        before = manager.get_job(job.id)
        task = manager.get_task(job.id, instance)[0]
        legal = sorted(TASK_TRANSITIONS[task.state])
        if op == "legal" and legal:
            target = legal[pick % len(legal)]
        else:
            target = list(TaskState)[pick % len(TaskState)]
        try:
            if op == "kill":
                manager.kill_job(job.id)
            elif op == "restart":
                manager.restart_job(job.id)
            elif op == "launch":
                # The rest of the way to RUNNING, in one batch, if the task is on that way.
                path = ("PENDING", *TO_RUNNING)
                if task.state not in path:
                    continue
                rest = TO_RUNNING[path.index(task.state) :]
                attempt = task.current.attempt
                manager.update_tasks(job.id, [TaskUpdate(instance, attempt, s) for s in rest])
            else:
                manager.update_tasks(job.id, [TaskUpdate(instance, task.current.attempt, target)])
        except FailedPrecondition:
            assert manager.get_job(job.id) == before
            assert op != "launch", "the way to RUNNING is legal"
            if op in ("legal", "any"):
                assert target not in legal
            elif op == "kill":
                assert before.terminal
            else:
                assert before.state in (J.PENDING, J.KILLING)
        else:
            if op in ("legal", "any") and target != task.state:
                assert target in legal
        after = check_consistent(manager, job.id)
        assert after.version >= before.version
    job_now = manager.get_job(job.id)
    if not job_now.terminal:
        manager.kill_job(job.id)
        live, _ = manager.list_tasks(job.id, states=frozenset(TaskState) - TASK_TERMINAL)
        assert {(t.state, t.goal) for t in live} <= {(T.KILLING, Goal.KILL)}
        got = manager.update_tasks(
            job.id, [TaskUpdate(t.instance_id, t.current.attempt, T.KILLED) for t in live]
        )
        assert got.state == J.KILLED
        check_consistent(manager, job.id)
    manager.delete_job(job.id)
    with pytest.raises(NotFound):
        manager.get_job(job.id)


# ---------------------------------------------------------------------------- scale


@pytest.mark.slow
def test_hundred_thousand_tasks(manager: JobManager, killer: RecordingKiller, db: Database) -> None:
    n = 100_000
    job, _ = manager.create_job(make_spec(n))
    assert dict(manager.get_job(job.id).task_counts) == {T.PENDING: n}
    running = [0, 500, 99_999]
    manager.update_tasks(
        job.id,
        [TaskUpdate(i, 1, s) for i in running for s in TO_RUNNING],
    )
    counts = manager.get_job(job.id).task_counts
    assert dict(counts) == {T.PENDING: n - 3, T.RUNNING: 3}
    page, token = manager.list_tasks(job.id, page_size=10_000)
    assert len(page) == 10_000 and token
    got = manager.kill_job(job.id)
    assert got.state == J.KILLING
    assert dict(got.task_counts) == {T.KILLED: n - 3, T.KILLING: 3}
    assert sorted(killer.killed) == sorted(f"{job.id}-{i}-1" for i in running)
    got = manager.update_tasks(job.id, [TaskUpdate(i, 1, T.KILLED) for i in running])
    assert got.state == J.KILLED
    assert Counter(manager.get_job(job.id).task_counts) == Counter({T.KILLED: n})
    assert job_level_events(db, job.id) == [
        ("", "PENDING"),
        ("PENDING", "RUNNING"),
        ("RUNNING", "KILLING"),
        ("KILLING", "KILLED"),
    ]
    manager.delete_job(job.id)
    assert row_counts(db, job.id)["tasks"] == 0
    assert row_counts(db, job.id)["job_events"] == 0
    with pytest.raises(NotFound):
        manager.get_job(job.id)


def test_a_cycle_s_gangs_are_admitted_together_each_task_with_its_event(
    manager: JobManager, db: Database
) -> None:
    """One admit_pending call for many gangs (the resource manager's cycle) shares its
    statements; each gang still moves its job's lowest PENDING tasks, a job's second gang the
    next ones, and a gang of a job gone, killed or short of tasks moves nothing."""
    two_gangs = manager.create_job(make_spec(5))[0].id
    whole = manager.create_job(make_spec(3))[0].id
    single = manager.create_job(make_spec(1))[0].id
    killed = manager.create_job(make_spec(2))[0].id
    manager.kill_job(killed)
    deleted = manager.create_job(make_spec(1))[0].id
    manager.kill_job(deleted)
    manager.delete_job(deleted)
    short = manager.create_job(make_spec(2))[0].id
    versions = {j: manager.get_job(j).version for j in (two_gangs, whole, single, short)}
    gangs = [
        (two_gangs, 2, "first gang"),
        (whole, 3, "whole job"),
        (killed, 2, "killed meanwhile"),
        (two_gangs, 2, "second gang"),
        (deleted, 1, "deleted meanwhile"),
        (single, 1, "alone"),
        (short, 3, "too many"),
    ]
    assert manager.admit_pending(gangs) == [(0, 1), (0, 1, 2), (), (2, 3), (), (0,), ()]

    ready = {TaskState.READY}
    assert manager.instances(two_gangs, ready) == (0, 1, 2, 3)
    assert manager.instances(two_gangs, {TaskState.PENDING}) == (4,)
    assert manager.instances(whole, ready) == (0, 1, 2)
    assert manager.instances(short, ready) == ()
    for job_id, message in ((two_gangs, "second gang"), (whole, "whole job"), (single, "alone")):
        job = manager.get_job(job_id)
        assert (job.state, job.reason, job.message) == (JobState.PENDING, "admitted", message)
        assert job.version == versions[job_id] + 1
    assert manager.get_job(short).version == versions[short]
    # Each admitted task: one event from PENDING with the gang's message (a shared message
    # reads as the text), and the task holds it too.
    for job_id, gang_messages in (
        (two_gangs, {0: "first gang", 1: "first gang", 2: "second gang", 3: "second gang"}),
        (whole, dict.fromkeys(range(3), "whole job")),
        (single, {0: "alone"}),
    ):
        for instance, message in gang_messages.items():
            task, events = manager.get_task(job_id, instance)
            assert (task.current.state, task.current.reason, task.current.message) == (
                TaskState.READY,
                "admitted",
                message,
            )
            admitted = [e for e in events if e.to_state == TaskState.READY.value]
            assert [(e.from_state, e.reason, e.message, e.attempt_id) for e in admitted] == [
                ("PENDING", "admitted", message, f"{job_id}-{instance}-1")
            ]
    for job_id, size in ((two_gangs, 5), (whole, 3), (single, 1), (short, 2)):
        job = manager.get_job(job_id)
        tasks, _ = manager.list_tasks(job_id)
        assert dict(job.task_counts) == dict(Counter(t.state for t in tasks))
        for instance in range(size):
            assert task_event_chain_problems(task_events(manager, job_id, instance)) == []


def test_the_launcher_s_record_writes_what_the_task_updates_would(manager: JobManager) -> None:
    """record_launches is the launcher's record of several gangs in one write, built for its
    case alone: the same tasks, job and events as update_tasks of the same steps; a gang with
    a task taken back meanwhile, or of a job gone, is refused with why and nothing of it is
    written, while the others are recorded."""
    spec = make_spec(3)
    a, b, a2, killed = (manager.create_job(spec)[0].id for _ in range(4))
    manager.admit_pending([(j, 3, "in") for j in (a, b, a2, killed)])
    manager.kill_job(killed)  # between its placement and its record
    before = _written(manager, killed, 3)
    places = {i: Placement(1, f"h{i % 2}", f"agent-{i % 2}", f"ex-{i % 2}") for i in range(3)}
    refused = manager.record_launches({a: places, killed: places, a2: places, "gone": places})
    manager.update_tasks(b, launch_updates(places))

    assert refused == {
        killed: f"3 of the 3 tasks of job {killed} placed are no longer READY in the attempt "
        "placed (instance 0 first)",
        "gone": "job gone not found",
    }
    assert _written(manager, a, 3) == _written(manager, b, 3) == _written(manager, a2, 3)
    assert manager.get_job(a).state == JobState.RUNNING
    assert _written(manager, killed, 3) == before


def test_ready_attempts_of_several_jobs_are_read_at_once(manager: JobManager) -> None:
    """The launcher's read of a round: each job's READY tasks with their attempts; a job
    with none, or none at all, is left out."""
    a, b, pending = (manager.create_job(make_spec(3))[0].id for _ in range(3))
    manager.admit_pending([(a, 2, "in"), (b, 3, "in")])
    manager.kill_job(b)
    found = manager.ready_attempts([a, b, pending, "no-such-job"])
    assert found == {a: {0: 1, 1: 1}}
    assert found == {a: manager.attempts(a, {TaskState.READY})}


def _written(manager: JobManager, job_id: str, size: int) -> object:
    """What is stored of a job, but its id: the job (state, reason, version, counts), its
    tasks, their events and its own events."""
    job = manager.get_job(job_id)
    tasks, _ = manager.list_tasks(job_id)
    return (
        (job.state, job.reason, job.message, job.version, dict(job.task_counts)),
        [(t.state, t.version, replace(t.current, job_id="")) for t in tasks],
        [
            [(e.from_state, e.to_state, e.reason, e.message, e.host) for e in evs]
            + [e.attempt_id.removeprefix(job_id) for e in evs]
            for evs in (task_events(manager, job_id, i) for i in range(size))
        ],
        [(e.from_state, e.to_state, e.reason) for e in job_events(manager, job_id)],
    )


def test_progress_of_several_jobs_is_written_as_the_task_updates_would(
    manager: JobManager, clock: FakeClock
) -> None:
    """record_progress writes several jobs' progress in one transaction: for each, the same
    tasks, versions, events and job (its counts, its state once every task runs) as
    update_tasks of the same updates, a stale one ignored. A job with an update it does not
    take (not progress, not allowed from the task's state, of a task the job lacks) is left
    out with nothing of it written, as is a job that does not exist."""
    spec = make_spec(3)
    a, b, illegal, failure, unknown = (manager.create_job(spec)[0].id for _ in range(5))
    jobs = (a, b, illegal, failure, unknown)
    manager.admit_pending([(j, 3, "in") for j in jobs])
    places = {i: Placement(1, f"h{i % 2}", f"agent-{i % 2}", f"ex-{i % 2}") for i in range(3)}
    assert manager.record_launches({job_id: places for job_id in jobs}) == {}
    T = TaskState
    first = [
        TaskUpdate(0, 1, T.STARTING, "TASK_STARTING"),
        TaskUpdate(0, 1, T.RUNNING, "TASK_RUNNING", "", "h0", "agent-0", "ex-0"),
        TaskUpdate(1, 1, T.RUNNING, "TASK_RUNNING", "up", "", "agent-9"),
        TaskUpdate(2, 7, T.RUNNING, "TASK_RUNNING"),  # stale: attempt 7
        TaskUpdate(2, 1, T.LAUNCHED),
    ]
    assert not task_transition_allowed(T.RUNNING, T.STARTING)
    refused = {
        illegal: [TaskUpdate(0, 1, T.RUNNING), TaskUpdate(0, 1, T.STARTING)],
        failure: [TaskUpdate(0, 1, T.RUNNING), TaskUpdate(1, 1, T.FAILED, "TASK_FAILED")],
        unknown: [TaskUpdate(0, 1, T.RUNNING), TaskUpdate(3, 1, T.RUNNING)],
    }
    before = {job_id: _written(manager, job_id, 3) for job_id in refused}
    clock.advance(5)
    left = manager.record_progress({a: first, **refused, "no-such-job": first})
    manager.update_tasks(b, first)
    assert left == [illegal, failure, unknown, "no-such-job"]
    assert {job_id: _written(manager, job_id, 3) for job_id in refused} == before
    assert _written(manager, a, 3) == _written(manager, b, 3)
    assert manager.get_job(a).task_counts == {T.RUNNING: 2, T.LAUNCHED: 1}

    clock.advance(5)
    last = [TaskUpdate(2, 1, T.STARTING), TaskUpdate(2, 1, T.RUNNING), TaskUpdate(0, 1, T.RUNNING)]
    assert manager.record_progress({a: last}) == []
    manager.update_tasks(b, last)
    assert _written(manager, a, 3) == _written(manager, b, 3)
    assert manager.get_job(a).state == JobState.RUNNING
    assert manager.get_task(a, 0)[0].current.started_at is not None
