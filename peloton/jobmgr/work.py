"""The unit of work: one write transaction on one locked job, and what the job manager's parts
share (the database, the clock, who is told after a commit).

A change of a job (1) locks the job row, (2) checks the change against the state tables, (3)
writes the new states with one event row per change, and (4) re-derives the job's state from its
tasks. :class:`UnitOfWork` holds what that takes (the transaction, the locked row, the job's task
counts, the time of the change) and does steps 2 to 4: :meth:`~UnitOfWork.move` tasks within
their attempt, :meth:`~UnitOfWork.renew` them in a new one, :meth:`~UnitOfWork.derive` the job.
Every statement is in :mod:`peloton.storage.jobs`. Only after the commit does
:meth:`Context.after_commit` wake watchers and tell other components (the host manager's killer,
the resource manager), so nobody acts on a change that was not persisted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from peloton.core.records import JobRecord, attempt_id
from peloton.core.spec import is_elastic
from peloton.core.states import (
    TASK_ACTIVE,
    TASK_TERMINAL,
    Goal,
    JobState,
    TaskState,
    check_job_transition,
    check_new_attempt,
    check_task_transition,
    derive_job_state,
)
from peloton.errors import NotFound
from peloton.jobmgr.events import EventBus
from peloton.jobmgr.metrics import JobMetrics
from peloton.storage import jobs as repo
from peloton.storage.db import Database
from peloton.storage.models import JobRow
from peloton.v1 import job_pb2

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
# Raises FailedPrecondition, in a scheduling write's open transaction, unless this daemon still
# leads (see peloton.storage.leases.holds): a deposed leader's decisions (admissions, pending
# reasons, failures of gangs that never fit, preemptions, placements) are refused.
Fence = Callable[[repo.Tx], None]
# Task states that count as a failure of the attempt (toward restart.max_failures).
FAILURES = frozenset({TaskState.FAILED, TaskState.LOST})


def utcnow() -> datetime:
    return datetime.now(UTC)


class TaskKiller(Protocol):
    """Stops running attempts on their hosts (the host manager implements it)."""

    def kill(self, attempt_ids: Sequence[str], grace_seconds: int) -> None: ...


class ElasticGangs(Protocol):
    """Where elastic gangs learn their membership (the daemon's rendezvous endpoints)."""

    def drain(self, job_id: str, attempt_ids: Sequence[str], why: str) -> None:
        """The gang is shrunk: these ranks leave it at their next commit (they are then
        stopped within the job's kill grace)."""
        ...


class Scheduler(Protocol):
    """The resource manager, as the job manager sees it."""

    def check_pool(self, pool: str) -> None:
        """Raise InvalidArgument naming ``pool`` unless jobs may run in that pool."""
        ...

    def job_changed(self, job_id: str) -> None:
        """A job's tasks or goal changed (committed): its gangs may need (re)queueing or its
        allocation releasing. Must be cheap: it is called on every change."""
        ...


class UnitOfWork:
    """One job, locked in a write transaction, and its task counts as the change goes on."""

    def __init__(self, session: repo.Tx, row: JobRow, now: datetime) -> None:
        self.session = session
        self.row = row
        self.job_id: str = row.id
        self.now = now
        self.counts = repo.counts_of(row)
        self._spec: job_pb2.JobSpec | None = None

    @property
    def state(self) -> JobState:
        return JobState(self.row.state)

    @property
    def goal(self) -> Goal:
        return Goal(self.row.goal)

    def spec(self) -> job_pb2.JobSpec:
        # A job's spec never changes: parsed once per unit of work.
        if self._spec is None:
            self._spec = repo.spec_from_bytes(self.row.spec)
        return self._spec

    def grace(self) -> int:
        """The job's kill grace: how long a stopped task gets between SIGTERM and SIGKILL."""
        return self.spec().preemption.kill_grace_seconds

    def record(self) -> JobRecord:
        return repo.job_record(self.row)

    def move(
        self,
        sources: Iterable[TaskState],
        to: TaskState,
        *,
        reason: str,
        message: str,
        goal: Goal,
        instances: Sequence[int] | None = None,
    ) -> None:
        """Move the job's tasks in ``sources`` (and ``instances``, if given) to ``to``, checked
        against the state table and counted."""
        moved = repo.bulk_transition(
            self.session,
            self.job_id,
            sources,
            to,
            now=self.now,
            reason=reason,
            message=message,
            goal=goal,
            ended=to in TASK_TERMINAL,
            instances=instances,
        )
        shift(self.counts, moved, to)

    def renew(
        self,
        sources: Iterable[TaskState],
        *,
        reason: str,
        message: str,
        reset_failures: bool,
        instances: Sequence[int] | None = None,
    ) -> None:
        """Start a new PENDING attempt of the job's ended tasks in ``sources`` (and
        ``instances``)."""
        moved = repo.bulk_new_attempt(
            self.session,
            self.job_id,
            sources,
            now=self.now,
            reason=reason,
            message=message,
            reset_failures=reset_failures,
            instances=instances,
        )
        shift(self.counts, moved, TaskState.PENDING, new_attempt=True)

    def set_goal(self, states: Iterable[TaskState], goal: Goal) -> None:
        """Change the goal of the job's tasks in ``states``, not their state."""
        repo.set_goal(self.session, self.job_id, states, goal, now=self.now)

    def instances(self, states: Iterable[TaskState]) -> tuple[int, ...]:
        """The instance ids of the job's tasks in ``states``, ascending."""
        return tuple(sorted(repo.attempts_in(self.session, self.job_id, states)))

    def attempts(self, states: Iterable[TaskState]) -> list[str]:
        """The current attempts of the job's tasks in ``states``."""
        found = repo.attempts_in(self.session, self.job_id, states)
        return [attempt_id(self.job_id, i, a) for i, a in found.items()]

    def stop_running(self, reason: str, message: str, goal: Goal) -> list[str]:
        """Move the job's running tasks to KILLING (PREEMPTING too: this overrides a
        preemption) and return every KILLING attempt, for the host manager to stop."""
        self.move(
            TASK_ACTIVE - {TaskState.KILLING},
            TaskState.KILLING,
            reason=reason,
            message=message,
            goal=goal,
        )
        return self.attempts({TaskState.KILLING})

    def note(self, **values: object) -> None:
        """Change the job row without a new version (not a change of its state or spec)."""
        repo.note_job(self.row, **values)

    def update(self, *, flush: bool = True, **values: object) -> None:
        """Change the job row with a new version (``flush=False``: written with the next
        flush, with other jobs')."""
        repo.update_job(self.session, self.row, flush=flush, **values)

    def derive(self, *, goal: Goal | None = None, reason: str = "", message: str = "") -> None:
        """Store the job's new task counts, derive its state from them, and write the state
        with an event if it changed."""
        row, now = self.row, self.now
        self.note(task_counts=repo.counts_to_json(self.counts))
        new_goal = goal or self.goal
        old = self.state
        new = derive_job_state(self.counts, new_goal, elastic=is_elastic(self.spec()))
        if new == old and new_goal == self.goal:
            return
        check_job_transition(old, new)
        if not reason:
            reason, message = self._reason(new)
        if new == JobState.RUNNING and row.deadline_at is None:
            limit = self.spec().max_runtime_seconds
            if limit:
                self.note(deadline_at=now + timedelta(seconds=limit))
        self.update(
            state=new.value,
            goal=new_goal.value,
            reason=reason,
            message=message,
            updated_at=now,
        )
        if new != old:
            repo.insert_events(
                self.session,
                [
                    {
                        "job_id": row.id,
                        "instance_id": None,
                        "time": now,
                        "from_state": old.value,
                        "to_state": new.value,
                        "reason": reason,
                        "message": message,
                    }
                ],
            )
            log.info(
                "job state changed",
                extra={"job_id": row.id, "from": old.value, "to": new.value, "reason": reason},
            )

    def _reason(self, state: JobState) -> tuple[str, str]:
        """Why the job is in ``state``: a killed job keeps the kill's reason, a job waiting out
        a restart backoff keeps the failure's, a failed gang the failure that ended it, another
        failed job gets its first task failure's; other states need none."""
        row = self.row
        if state in (JobState.KILLING, JobState.KILLED):
            return row.reason, row.message
        if state == JobState.PENDING and row.not_before is not None and row.not_before > self.now:
            return row.reason, row.message
        if state != JobState.FAILED:
            return "", ""
        if row.gang_failures:
            return row.reason, row.message
        task = repo.first_failed_task(self.session, self.job_id)
        if task is None:
            return "failed", ""
        message = repo.task_message(self.session, task)
        return task.reason or "failed", f"instance {task.instance_id}: {message}".rstrip(": ")


@dataclass
class Context:
    """What the job manager's parts share: the database and clock they work with, and who is
    told after a commit (the event bus, the task killer, the scheduler)."""

    db: Database
    clock: Clock = utcnow
    killer: TaskKiller | None = None
    events: EventBus = field(default_factory=EventBus)
    metrics: JobMetrics = field(default_factory=JobMetrics)
    scheduler: Scheduler | None = None
    elastic: ElasticGangs | None = None
    fence: Fence | None = None  # None: the only daemon, always the leader

    def fenced(self, session: repo.Tx) -> None:
        """Check, in a scheduling write's transaction, that this daemon may still schedule."""
        if self.fence is not None:
            self.fence(session)

    @contextmanager
    def job(self, job_id: str) -> Iterator[UnitOfWork]:
        """A write transaction on ``job_id``, locked: committed if the block returns."""
        with self.db.writing() as session:
            yield self.lock(session, job_id)

    def lock(self, session: repo.Tx, job_id: str) -> UnitOfWork:
        """Lock ``job_id`` in an open write transaction (several jobs may share one)."""
        row = repo.lock_job(session, job_id)
        if row is None:
            raise NotFound(f"job {job_id} not found")
        return UnitOfWork(session, row, self.clock())

    def lock_many(self, session: repo.Tx, job_ids: Iterable[str]) -> dict[str, UnitOfWork]:
        """Lock jobs in an open write transaction, in one statement; a job that does not exist
        is left out."""
        now = self.clock()
        return {
            i: UnitOfWork(session, row, now) for i, row in repo.lock_jobs(session, job_ids).items()
        }

    def after_commit(self, job_id: str, to_kill: Sequence[str] = (), grace: int = 0) -> None:
        """Tell who must know that ``job_id`` changed; stop ``to_kill`` within ``grace``."""
        self.events.publish(job_id)
        if to_kill and self.killer is not None:
            self.killer.kill(to_kill, grace)
        if self.scheduler is not None:
            self.scheduler.job_changed(job_id)


class Part:
    """A part of the job manager (lifecycle, task updates, reads): it works in a shared
    :class:`Context`."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx


def shift(
    counts: dict[TaskState, int],
    moved: Mapping[TaskState, int],
    to: TaskState,
    *,
    new_attempt: bool = False,
) -> None:
    """Check that tasks may leave the states in ``moved`` for ``to`` (within an attempt, or by
    starting a new one) and account for them in the job's counts. A bulk move is checked here
    against the same tables as a single one; a failed check rolls the transaction back."""
    for state, n in moved.items():
        if new_attempt:
            check_new_attempt(state)
        else:
            check_task_transition(state, to)
        left = counts.get(state, 0) - n
        if left < 0:
            raise AssertionError(f"task counts went negative for {state}: {counts}")
        if left:
            counts[state] = left
        else:
            counts.pop(state, None)
        counts[to] = counts.get(to, 0) + n
