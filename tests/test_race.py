"""Concurrent writers of one job, on SQLite and PostgreSQL: the job is never corrupted."""

from __future__ import annotations

import contextlib
import random
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest
from support import (
    LIFECYCLE,
    TO_RUNNING,
    drive,
    job_event_chain_problems,
    task_event_chain_problems,
)
from support import (
    independent_spec as make_spec,
)

from peloton.core.records import EventRecord, JobRecord, TaskUpdate
from peloton.core.states import TASK_TERMINAL, Goal, JobState, TaskState, derive_job_state
from peloton.errors import FailedPrecondition
from peloton.jobmgr.manager import JobManager
from peloton.storage.db import Database

T = TaskState
J = JobState
WAIT_S = 60.0  # a safety net for a hung test, never a pause


def run_together(targets: Sequence[Callable[[], None]]) -> list[BaseException]:
    """Run each target in its own thread, released together by a barrier; their exceptions."""
    barrier = threading.Barrier(len(targets))
    errors: list[BaseException] = []
    lock = threading.Lock()

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                barrier.wait(timeout=WAIT_S)
                target()
            except BaseException as exc:
                with lock:
                    errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WAIT_S)
        assert not t.is_alive(), "a writer hung"
    return errors


def all_events(manager: JobManager, job_id: str) -> list[EventRecord]:
    out: list[EventRecord] = []
    while page := manager.job_events(job_id, after=out[-1].sequence if out else 0, limit=1000):
        out.extend(page)
    return out


@dataclass
class KillerThatReports:
    """A TaskKiller standing in for the host manager: it reports each attempt KILLED at once."""

    manager: JobManager | None = None
    calls: list[list[str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def kill(self, attempt_ids: Sequence[str], grace_seconds: int) -> None:
        assert self.manager is not None
        with self.lock:
            self.calls.append(list(attempt_ids))
        for aid in attempt_ids:
            job_id, instance, attempt = aid.rsplit("-", 2)
            # If it ended on its own first (SUCCEEDED), the late KILLED is refused, as it must be.
            with contextlib.suppress(FailedPrecondition):
                self.manager.update_tasks(
                    job_id, [TaskUpdate(int(instance), int(attempt), T.KILLED, "killed", "SIGKILL")]
                )


def check_job_is_sound(manager: JobManager, job_id: str, *, restarted: bool = False) -> JobRecord:
    """Every task ended; state, events and versions agree with each other."""
    job = manager.get_job(job_id)
    tasks, _ = manager.list_tasks(job_id)
    assert all(t.state in TASK_TERMINAL for t in tasks), [t.state for t in tasks]
    assert job.terminal
    assert job.state == derive_job_state(job.task_counts, job.goal)
    assert sum(job.task_counts.values()) == len(tasks)
    # The job's materialized counts agree with its task rows.
    assert dict(job.task_counts) == dict(Counter(t.state for t in tasks))

    events = all_events(manager, job_id)
    sequences = [e.sequence for e in events]
    assert len(set(sequences)) == len(sequences), "duplicate events"
    assert sequences == sorted(sequences)

    job_level = [e for e in events if e.instance_id is None]
    assert job_event_chain_problems(job_level) == []
    assert job_level[-1].to_state == job.state
    hops = [(e.from_state, e.to_state) for e in job_level]
    if not restarted:
        # Without a restart no job state is entered twice.
        assert len(set(hops)) == len(hops), f"a job change was recorded twice: {hops}"
    # The job row changes exactly when a job event is written (creation is version 1).
    assert job.version == len(job_level)

    for task in tasks:
        mine = [e for e in events if e.instance_id == task.instance_id]
        assert task_event_chain_problems(mine) == [], (task.instance_id, mine)
        assert mine[-1].to_state == task.state
        assert mine[-1].attempt_id == task.current.id
        # One version per change of the task, each with its event.
        assert task.version == 1 + len(mine), task.instance_id
    return job


# ---------------------------------------------------------------------------- the main race


@pytest.mark.parametrize("point", ["first", "last", "seed0", "seed1", "seed2", "seed3"])
def test_tasks_race_a_kill(db: Database, point: str) -> None:
    """8 threads each drive one task to SUCCEEDED while another kills the job at a random point
    (or before the first update, or after the last)."""
    killer = KillerThatReports()
    manager = JobManager(db, killer=killer)
    killer.manager = manager
    n = 8
    job, _ = manager.create_job(make_spec(n))
    start = manager.events.generation()
    updates = n * len(LIFECYCLE)
    if point == "first":
        kill_after = 0
    elif point == "last":
        kill_after = updates
    else:
        kill_after = random.Random(point).randint(1, updates - 1)
    outcome: dict[str, object] = {}

    def worker(instance: int) -> Callable[[], None]:
        def run() -> None:
            for state in LIFECYCLE:
                try:
                    manager.update_tasks(
                        job.id, [TaskUpdate(instance, 1, state, host=f"h{instance}")]
                    )
                except FailedPrecondition:
                    # Killed under us. Whatever the task is now, it must be one step from the end.
                    task = manager.get_task(job.id, instance)[0]
                    assert task.state in TASK_TERMINAL | {T.KILLING}, task.state
                    if task.state == T.KILLING:
                        manager.update_tasks(job.id, [TaskUpdate(instance, 1, T.KILLED)])
                    return

        return run

    def kill() -> None:
        # Wait, without sleeping, until the workers have committed `kill_after` updates.
        seen = manager.events.generation()
        while seen - start < kill_after:
            nxt = manager.events.wait(seen, timeout=WAIT_S)
            assert nxt != seen, "the workers stopped before the kill"
            seen = nxt
        try:
            outcome["kill"] = manager.kill_job(job.id, "race")
        except FailedPrecondition as exc:
            outcome["refused"] = exc

    errors = run_together([worker(i) for i in range(n)] + [kill])
    assert errors == []
    final = check_job_is_sound(manager, job.id)
    tasks, _ = manager.list_tasks(job.id)
    events = all_events(manager, job.id)

    if "refused" in outcome:
        # The kill came after the last task ended: nothing was killed.
        assert final.state == J.SUCCEEDED
        assert final.goal == Goal.RUN
        assert all(t.state == T.SUCCEEDED for t in tasks)
        assert killer.calls == []
    else:
        killed = outcome["kill"]
        assert isinstance(killed, JobRecord)
        assert killed.state in (J.KILLING, J.KILLED)
        assert final.state == J.KILLED
        assert final.goal == Goal.KILL
        assert (final.reason, final.message) == ("killed", "race")
        # The host manager was asked to stop exactly the tasks the kill moved to KILLING.
        to_killing = sorted(
            e.attempt_id for e in events if e.instance_id is not None and e.to_state == "KILLING"
        )
        assert sorted(a for call in killer.calls for a in call) == to_killing
        assert len(killer.calls) == (1 if to_killing else 0)
        # Every task the kill found unlaunched went straight to KILLED.
        for t in tasks:
            mine = [e for e in events if e.instance_id == t.instance_id]
            if any(e.to_state == "KILLING" for e in mine):
                assert t.state in (T.KILLED, T.SUCCEEDED, T.FAILED, T.LOST)
            elif t.state == T.KILLED:
                assert mine[-1].reason == "killed"
                assert mine[-1].from_state in {s.value for s in LIFECYCLE[:3]} | {"PENDING"}


# ---------------------------------------------------------------------------- more races


def test_concurrent_kills_kill_once(db: Database) -> None:
    calls: list[tuple[list[str], int]] = []
    lock = threading.Lock()

    class Killer:
        def kill(self, attempt_ids: Sequence[str], grace_seconds: int) -> None:
            with lock:
                calls.append((list(attempt_ids), grace_seconds))

    manager = JobManager(db, killer=Killer())
    job, _ = manager.create_job(make_spec(4))
    for i in range(4):
        drive(manager, job.id, i, TO_RUNNING)
    results: list[JobRecord] = []

    def kill() -> None:
        got = manager.kill_job(job.id)
        with lock:
            results.append(got)

    assert run_together([kill] * 6) == []
    assert len(results) == 6
    assert {r.state for r in results} == {J.KILLING}
    assert len({r.version for r in results}) == 1
    assert len(calls) == 1
    assert sorted(calls[0][0]) == sorted(f"{job.id}-{i}-1" for i in range(4))
    hops = [
        (e.from_state, e.to_state) for e in all_events(manager, job.id) if e.instance_id is None
    ]
    assert hops == [("", "PENDING"), ("PENDING", "RUNNING"), ("RUNNING", "KILLING")]
    manager.update_tasks(job.id, [TaskUpdate(i, 1, T.KILLED) for i in range(4)])
    check_job_is_sound(manager, job.id)


def test_concurrent_restarts_restart_once(db: Database) -> None:
    manager = JobManager(db)
    job, _ = manager.create_job(make_spec(3))
    for i in range(3):
        drive(manager, job.id, i, LIFECYCLE)
    ok: list[JobRecord] = []
    refused: list[FailedPrecondition] = []
    lock = threading.Lock()

    def restart() -> None:
        try:
            got = manager.restart_job(job.id)
        except FailedPrecondition as exc:
            with lock:
                refused.append(exc)
        else:
            with lock:
                ok.append(got)

    assert run_together([restart] * 6) == []
    # The first restart makes the job PENDING; the others find it PENDING and are refused.
    assert len(ok) == 1 and len(refused) == 5
    assert all("PENDING" in str(e) for e in refused)
    tasks, _ = manager.list_tasks(job.id)
    assert [(t.state, t.current.attempt, len(t.history)) for t in tasks] == [(T.PENDING, 2, 1)] * 3
    for i in range(3):
        drive(manager, job.id, i, LIFECYCLE, attempt=2)
    check_job_is_sound(manager, job.id, restarted=True)


def test_duplicate_updates_race_to_one_change(db: Database) -> None:
    manager = JobManager(db)
    job, _ = manager.create_job(make_spec(2))
    drive(manager, job.id, 0, TO_RUNNING)
    drive(manager, job.id, 1, TO_RUNNING)
    # The same status update delivered many times at once, mixed with a conflicting one.
    updates = [TaskUpdate(0, 1, T.SUCCEEDED)] * 6 + [TaskUpdate(0, 1, T.FAILED)] * 2
    failures: list[FailedPrecondition] = []
    lock = threading.Lock()

    def send(u: TaskUpdate) -> Callable[[], None]:
        def run() -> None:
            try:
                manager.update_tasks(job.id, [u])
            except FailedPrecondition as exc:
                with lock:
                    failures.append(exc)

        return run

    assert run_together([send(u) for u in updates]) == []
    task, events = manager.get_task(job.id, 0)
    assert task.state in (T.SUCCEEDED, T.FAILED)
    ends = [e for e in events if e.from_state == "RUNNING"]
    assert len(ends) == 1 and ends[0].to_state == task.state
    # Every update that named the other ending was refused; repeats of the winner were no-ops.
    loser = T.FAILED if task.state == T.SUCCEEDED else T.SUCCEEDED
    assert len(failures) == sum(u.state == loser for u in updates)
    manager.update_tasks(job.id, [TaskUpdate(1, 1, T.SUCCEEDED)])
    check_job_is_sound(manager, job.id)


def test_updates_race_a_restart(db: Database) -> None:
    """Running tasks report while the job is restarted: old-attempt news never leaks into the new
    attempt, and every task ends up on attempt 2."""
    manager = JobManager(db)
    n = 6
    job, _ = manager.create_job(make_spec(n))
    for i in range(n):
        drive(manager, job.id, i, TO_RUNNING)

    def finish(instance: int) -> Callable[[], None]:
        def run() -> None:
            # RUNNING -> SUCCEEDED and KILLING (for the restart) -> SUCCEEDED are both legal.
            manager.update_tasks(job.id, [TaskUpdate(instance, 1, T.SUCCEEDED)])

        return run

    def restart() -> None:
        manager.restart_job(job.id)

    assert run_together([finish(i) for i in range(n)] + [restart]) == []
    # Some tasks ended before the restart (new attempt at once), the others were KILLING and
    # finished with SUCCEEDED (new attempt then). Either way: attempt 2, PENDING.
    tasks, _ = manager.list_tasks(job.id)
    for t in tasks:
        assert (t.state, t.current.attempt) == (T.PENDING, 2), t
        assert [h.state for h in t.history] == [T.SUCCEEDED]
    assert manager.get_job(job.id).state == J.PENDING
    for i in range(n):
        drive(manager, job.id, i, LIFECYCLE, attempt=2)
    job_now = manager.get_job(job.id)
    assert job_now.state == J.SUCCEEDED
    events = all_events(manager, job.id)
    assert job_event_chain_problems([e for e in events if e.instance_id is None]) == []
    for i in range(n):
        assert task_event_chain_problems([e for e in events if e.instance_id == i]) == []
