"""The job manager: creates, reads, kills, restarts and deletes jobs, and applies task updates.

Every change happens in one write transaction that (1) locks the job row, (2) checks the change
against the state tables, (3) writes the new states with one event row per change, and (4)
re-derives the job's state from its tasks. Only after the commit are watchers woken and other
components (the host manager's killer) told, so nobody acts on a change that was not persisted.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from peloton.core import spec as specs
from peloton.core.records import (
    EventRecord,
    JobFilter,
    JobRecord,
    TaskRecord,
    TaskUpdate,
    attempt_id,
)
from peloton.core.states import (
    JOB_TERMINAL,
    TASK_ACTIVE,
    TASK_TERMINAL,
    TASK_UNLAUNCHED,
    Goal,
    JobState,
    TaskState,
    check_job_transition,
    check_new_attempt,
    check_task_transition,
    derive_job_state,
)
from peloton.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from peloton.jobmgr import restarts
from peloton.jobmgr.events import EventBus
from peloton.jobmgr.metrics import JobMetrics
from peloton.storage import jobs as repo
from peloton.storage.db import Database
from peloton.storage.models import JobRow, TaskRow
from peloton.v1 import job_pb2

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
MAX_PAGE_JOBS = 1000
DEFAULT_PAGE_JOBS = 100
MAX_PAGE_TASKS = 10_000
DEFAULT_PAGE_TASKS = 1000
MAX_REQUEST_ID = 128
# Most events GetTask reads of a task (the newest; its answer may keep fewer, by size).
MAX_TASK_EVENTS = 10_000
# Reason of tasks and jobs taken back by the resource manager.
PREEMPTED = "preempted"
# Reason of a job stopped because it ran longer than its max_runtime_seconds.
MAX_RUNTIME = "max_runtime_exceeded"
# Reason of tasks no set of the cluster's hosts could ever hold.
UNPLACEABLE = "unplaceable"
_FAILURES = frozenset({TaskState.FAILED, TaskState.LOST})


def utcnow() -> datetime:
    return datetime.now(UTC)


class TaskKiller(Protocol):
    """Stops running attempts on their hosts (the host manager implements it)."""

    def kill(self, attempt_ids: Sequence[str], grace_seconds: int) -> None: ...


class Scheduler(Protocol):
    """The resource manager, as the job manager sees it."""

    def check_pool(self, pool: str) -> None:
        """Raise InvalidArgument naming ``pool`` unless jobs may run in that pool."""
        ...

    def job_changed(self, job_id: str) -> None:
        """A job's tasks or goal changed (committed): its gangs may need (re)queueing or its
        allocation releasing. Must be cheap: it is called on every change."""
        ...


class JobManager:
    """Jobs and tasks, their lifecycle, persisted through :mod:`peloton.storage.jobs`."""

    def __init__(
        self,
        db: Database,
        *,
        clock: Clock = utcnow,
        killer: TaskKiller | None = None,
        events: EventBus | None = None,
        metrics: JobMetrics | None = None,
    ) -> None:
        self._db = db
        self.metrics = metrics or JobMetrics()
        self._clock = clock
        self._killer = killer
        self._scheduler: Scheduler | None = None
        self.events = events or EventBus()

    def set_killer(self, killer: TaskKiller) -> None:
        self._killer = killer

    def set_scheduler(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    # ------------------------------------------------------------------ create and read

    def create_job(self, spec: job_pb2.JobSpec, request_id: str = "") -> tuple[JobRecord, bool]:
        """Validate and persist a job with its tasks; idempotent on ``request_id``.

        Returns the job and whether it was created now (False: an earlier request made it).
        """
        if len(request_id) > MAX_REQUEST_ID:
            raise InvalidArgument("request_id", f"is longer than {MAX_REQUEST_ID} characters")
        full = specs.with_defaults(spec)
        specs.validate_job_spec(full)
        if self._scheduler is not None:
            self._scheduler.check_pool(full.pool)
        if request_id:
            existing = self._job_for_request(request_id, full)
            if existing is not None:
                return existing, False
        job_id = str(uuid.uuid4())
        try:
            with self._db.writing() as session:
                job = repo.insert_job(
                    session,
                    job_id=job_id,
                    spec=full,
                    request_id=request_id or None,
                    now=self._clock(),
                    task_state=TaskState.PENDING,
                    job_state=JobState.PENDING,
                )
        except IntegrityError:
            # Another request with the same id won the race; answer as it did.
            existing = self._job_for_request(request_id, full) if request_id else None
            if existing is None:
                raise
            return existing, False
        self._after_commit((), 0, job_id)
        log.info(
            "job created",
            extra={
                "job_id": job_id,
                "job_name": full.name,
                "pool": full.pool,
                "instances": full.instances,
            },
        )
        # The job as committed (re-reading it would cost a connection and two queries).
        return job, True

    def _job_for_request(self, request_id: str, spec: job_pb2.JobSpec) -> JobRecord | None:
        with self._db.reading() as session:
            job_id = repo.job_id_for_request(session, request_id)
            if job_id is None:
                return None
            job = repo.get_job(session, job_id)
        if job is None:
            return None
        if repo.spec_to_bytes(job.spec) != repo.spec_to_bytes(spec):
            raise AlreadyExists(
                f"request_id {request_id!r} was used for job {job.id} with a different spec"
            )
        return job

    def get_job(self, job_id: str) -> JobRecord:
        with self._db.reading() as session:
            job = repo.get_job(session, job_id)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        return job

    def get_jobs(self, job_ids: Iterable[str]) -> list[JobRecord]:
        """The jobs of ``job_ids`` that exist, in one read."""
        with self._db.reading() as session:
            return repo.get_jobs(session, job_ids)

    def list_jobs(
        self, flt: JobFilter, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[JobRecord], str]:
        size = _page_size(page_size, DEFAULT_PAGE_JOBS, MAX_PAGE_JOBS)
        with self._db.reading() as session:
            return repo.list_jobs(session, flt, size, page_token)

    def get_task(self, job_id: str, instance_id: int) -> tuple[TaskRecord, list[EventRecord]]:
        """A task and its newest events (at most MAX_TASK_EVENTS), oldest first."""
        task, events, _ = self.get_task_events(job_id, instance_id)
        return task, events

    def get_task_events(
        self, job_id: str, instance_id: int, max_events: int = MAX_TASK_EVENTS
    ) -> tuple[TaskRecord, list[EventRecord], int]:
        """A task, its newest ``max_events`` events (oldest first) and how many older events
        were left out."""
        with self._db.reading() as session:
            row = repo.get_task_row(session, job_id, instance_id)
            if row is None:
                self._require_job(session, job_id)
                raise NotFound(f"job {job_id} has no instance {instance_id}")
            task = repo.task_record(session, row)
            events, older = repo.newest_task_events(session, job_id, instance_id, max_events)
        return task, events, older

    def list_tasks(
        self,
        job_id: str,
        states: frozenset[TaskState] = frozenset(),
        page_size: int = 0,
        page_token: str = "",
    ) -> tuple[list[TaskRecord], str]:
        size = _page_size(page_size, DEFAULT_PAGE_TASKS, MAX_PAGE_TASKS)
        with self._db.reading() as session:
            self._require_job(session, job_id)
            return repo.list_tasks(session, job_id, states, size, page_token)

    def job_events(self, job_id: str, after: int = 0, limit: int = 1000) -> list[EventRecord]:
        with self._db.reading() as session:
            self._require_job(session, job_id)
            return repo.events(session, job_id, after=after, limit=limit)

    def newest_event(self) -> int:
        """The sequence of the newest event of any job (0: none yet)."""
        with self._db.reading() as session:
            return repo.newest_event(session)

    def jobs_changed_after(self, sequence: int) -> tuple[int, set[str]]:
        """The newest event's sequence and the jobs with events after ``sequence``, whichever
        daemon wrote them."""
        with self._db.reading() as session:
            return repo.jobs_with_events_after(session, sequence)

    @staticmethod
    def _require_job(session: Session, job_id: str) -> None:
        if session.get(JobRow, job_id) is None:
            raise NotFound(f"job {job_id} not found")

    # ------------------------------------------------------------------ kill, restart, delete

    def kill_job(self, job_id: str, message: str = "", *, reason: str = "killed") -> JobRecord:
        """Kill every task: unlaunched ones at once, launched ones through the host manager
        (SIGTERM, the job's kill grace, SIGKILL)."""
        message = message or "killed by user"
        with self._db.writing() as session:
            row = self._lock(session, job_id)
            state = JobState(row.state)
            if state in JOB_TERMINAL:
                raise FailedPrecondition(f"job {job_id} is already {state}; nothing to kill")
            if row.goal == Goal.KILL:
                return repo.job_record(row)
            now = self._clock()
            counts = repo.counts_of(row)
            _move(
                session,
                job_id,
                counts,
                TASK_UNLAUNCHED,
                TaskState.KILLED,
                now=now,
                reason=reason,
                message=message,
                goal=Goal.KILL,
            )
            # Tasks already KILLING for a restart must now stay killed: no new attempt.
            repo.set_goal(session, job_id, {TaskState.KILLING}, Goal.KILL, now=now)
            to_kill = self._stop_running(session, row, counts, now, reason, message, Goal.KILL)
            self._derive(session, row, now, counts, goal=Goal.KILL, reason=reason, message=message)
            job = repo.job_record(row)
            grace = repo.spec_from_bytes(row.spec).preemption.kill_grace_seconds
        self._after_commit(to_kill, grace, job_id)
        log.info(
            "job kill requested",
            extra={"job_id": job_id, "tasks_to_stop": len(to_kill), "reason": reason},
        )
        return job

    def expire_jobs(self) -> list[str]:
        """Kill every job that has run longer than its ``max_runtime_seconds`` (counted from
        its first task start, restarts included). Returns the jobs it killed."""
        now = self._clock()
        with self._db.reading() as session:
            expired = repo.expired_jobs(session, now)
        killed: list[str] = []
        for job_id, limit in expired:
            try:
                self.kill_job(
                    job_id, f"ran longer than max_runtime_seconds ({limit} s)", reason=MAX_RUNTIME
                )
                killed.append(job_id)
            except (FailedPrecondition, NotFound):
                pass  # it ended or was killed meanwhile
        return killed

    def restart_job(self, job_id: str, message: str = "") -> JobRecord:
        """Start a new attempt of every task: ended tasks now, running ones once they are killed."""
        message = message or "restarted by user"
        with self._db.writing() as session:
            row = self._lock(session, job_id)
            state = JobState(row.state)
            if state == JobState.KILLING:
                raise FailedPrecondition(f"job {job_id} is KILLING; restart it once it is KILLED")
            if state == JobState.PENDING:
                raise FailedPrecondition(f"job {job_id} is PENDING; no task has started yet")
            now = self._clock()
            counts = repo.counts_of(row)
            _renew(
                session,
                job_id,
                counts,
                TASK_TERMINAL,
                now=now,
                reason="restarted",
                message=message,
                reset_failures=True,
            )
            to_kill = self._stop_running(
                session, row, counts, now, "restarted", message, Goal.RESTART
            )
            # A new run: the gang's failures, backoff and runtime limit start over.
            row.gang_failures, row.not_before, row.deadline_at = 0, None, None
            self._derive(
                session, row, now, counts, goal=Goal.RUN, reason="restarted", message=message
            )
            job = repo.job_record(row)
            grace = repo.spec_from_bytes(row.spec).preemption.kill_grace_seconds
        self._after_commit(to_kill, grace, job_id)
        log.info("job restarted", extra={"job_id": job_id})
        return job

    def _stop_running(
        self,
        session: Session,
        row: JobRow,
        counts: dict[TaskState, int],
        now: datetime,
        reason: str,
        message: str,
        goal: Goal,
    ) -> list[str]:
        """Move the job's running tasks to KILLING (PREEMPTING too: this overrides a
        preemption) and return every KILLING attempt, for the host manager to stop."""
        _move(
            session,
            row.id,
            counts,
            TASK_ACTIVE - {TaskState.KILLING},
            TaskState.KILLING,
            now=now,
            reason=reason,
            message=message,
            goal=goal,
        )
        return self._attempts_in(session, row.id, {TaskState.KILLING})

    def delete_job(self, job_id: str) -> None:
        """Delete a job that has ended, with its tasks and history."""
        with self._db.writing() as session:
            row = self._lock(session, job_id)
            state = JobState(row.state)
            if state not in JOB_TERMINAL:
                raise FailedPrecondition(
                    f"job {job_id} is {state}; only SUCCEEDED, FAILED or KILLED jobs can be deleted"
                )
            repo.delete_job(session, job_id)
        self.events.publish(job_id)
        log.info("job deleted", extra={"job_id": job_id})

    # ------------------------------------------------------------------ scheduling

    def unfinished_jobs(self) -> list[JobRecord]:
        """Every job that has not ended (what the resource manager rebuilds its state from)."""
        with self._db.reading() as session:
            return repo.unfinished_jobs(session)

    def instances(self, job_id: str, states: Iterable[TaskState]) -> tuple[int, ...]:
        """The instance ids of a job's tasks in ``states``, ascending."""
        with self._db.reading() as session:
            return repo.instances_in(session, job_id, states, limit=specs.MAX_INSTANCES)

    def attempts(self, job_id: str, states: Iterable[TaskState]) -> dict[int, int]:
        """The current attempt number of each of a job's tasks in ``states``, by instance id
        (empty for a job that does not exist)."""
        with self._db.reading() as session:
            return repo.attempts_in(session, job_id, states)

    def admit_pending(self, gangs: Sequence[tuple[str, int, str]]) -> list[tuple[int, ...]]:
        """Admit gangs, each ``(job_id, count, message)``: move the ``count`` lowest PENDING
        instances of the job to READY, all or none, in one transaction for all of them. Returns
        each gang's instance ids, in order (empty for a job that no longer has that many PENDING
        tasks, e.g. it was killed meanwhile)."""
        admitted: list[tuple[int, ...]] = []
        with self._db.writing() as session:
            for job_id, count, message in gangs:
                admitted.append(self._admit(session, job_id, count, message))
        for job_id in dict.fromkeys(job_id for job_id, _, _ in gangs):
            self._after_commit((), 0, job_id)
        return admitted

    def _admit(self, session: Session, job_id: str, count: int, message: str) -> tuple[int, ...]:
        row = self._lock(session, job_id)
        ids = repo.instances_in(session, job_id, {TaskState.PENDING}, limit=count)
        if Goal(row.goal) == Goal.KILL or len(ids) < count:
            return ()
        now = self._clock()
        counts = repo.counts_of(row)
        _move(
            session,
            job_id,
            counts,
            {TaskState.PENDING},
            TaskState.READY,
            now=now,
            reason="admitted",
            message=message,
            goal=Goal.RUN,
            instances=ids,
        )
        self._derive(session, row, now, counts)
        if JobState(row.state) == JobState.PENDING:
            repo.update_job(session, row, reason="admitted", message=message, updated_at=now)
        return ids

    def set_pending_reason(self, job_id: str, reason: str, message: str) -> None:
        """Say why a PENDING job waits (GetJob shows it); no-op for other states."""
        with self._db.writing() as session:
            row = self._lock(session, job_id)
            if JobState(row.state) != JobState.PENDING or (row.reason, row.message) == (
                reason,
                message,
            ):
                return
            # Not a change of state or spec: the version (optimistic concurrency) stays.
            row.reason, row.message = reason, message
        self.events.publish(job_id)

    def fail_pending(self, job_id: str, reason: str, message: str) -> JobRecord:
        """Fail a job's PENDING tasks: their gang can never be admitted (the job fails if
        nothing else of it runs)."""
        return self._fail_waiting(job_id, {TaskState.PENDING}, reason, message)

    def fail_unplaceable(self, job_id: str, message: str) -> JobRecord:
        """Fail a job's tasks that wait to run (admitted or not): no set of the cluster's
        hosts could ever hold their gang."""
        return self._fail_waiting(
            job_id, {TaskState.PENDING, TaskState.READY}, UNPLACEABLE, message
        )

    def _fail_waiting(
        self, job_id: str, states: set[TaskState], reason: str, message: str
    ) -> JobRecord:
        with self._db.writing() as session:
            row = self._lock(session, job_id)
            now = self._clock()
            counts = repo.counts_of(row)
            _move(
                session,
                job_id,
                counts,
                states,
                TaskState.FAILED,
                now=now,
                reason=reason,
                message=message,
                goal=Goal.RUN,
            )
            self._derive(session, row, now, counts, reason=reason, message=message)
            job = repo.job_record(row)
        self._after_commit((), 0, job_id)
        log.info("job gang infeasible", extra={"job_id": job_id, "reason": message})
        return job

    def preempt(self, job_id: str, message: str) -> JobRecord:
        """Take a job's admitted tasks back as a whole: unlaunched ones return to PENDING at
        once; launched ones are killed (PREEMPTING: SIGTERM, the job's grace, SIGKILL) and start
        a new PENDING attempt when they have ended. The job is requeued, not failed."""
        with self._db.writing() as session:
            row = self._lock(session, job_id)
            now = self._clock()
            counts = repo.counts_of(row)
            _move(
                session,
                job_id,
                counts,
                {TaskState.READY, TaskState.PLACING, TaskState.PLACED},
                TaskState.PENDING,
                now=now,
                reason=PREEMPTED,
                message=message,
                goal=Goal.RUN,
            )
            _move(
                session,
                job_id,
                counts,
                TASK_ACTIVE - {TaskState.KILLING, TaskState.PREEMPTING},
                TaskState.PREEMPTING,
                now=now,
                reason=PREEMPTED,
                message=message,
                goal=Goal.RESTART,
            )
            to_kill = self._attempts_in(session, job_id, {TaskState.PREEMPTING})
            self._derive(session, row, now, counts, reason=PREEMPTED, message=message)
            job = repo.job_record(row)
            grace = repo.spec_from_bytes(row.spec).preemption.kill_grace_seconds
        self._after_commit(to_kill, grace, job_id)
        log.info("job preempted", extra={"job_id": job_id, "reason": message})
        return job

    def requeue_placements(self) -> list[str]:
        """Send tasks caught between placement and launch (PLACING, PLACED) back to READY, for a
        daemon that starts: their host leases died with the previous one. Returns the jobs."""
        with self._db.reading() as session:
            job_ids = repo.jobs_with_tasks_in(session, {TaskState.PLACING, TaskState.PLACED})
        for job_id in job_ids:
            with self._db.writing() as session:
                row = self._lock(session, job_id)
                now = self._clock()
                counts = repo.counts_of(row)
                _move(
                    session,
                    job_id,
                    counts,
                    {TaskState.PLACING, TaskState.PLACED},
                    TaskState.READY,
                    now=now,
                    reason="requeued",
                    message="placement was interrupted by a daemon restart",
                    goal=Goal.RUN,
                )
                self._derive(session, row, now, counts)
            self._after_commit((), 0, job_id)
        return job_ids

    # ------------------------------------------------------------------ task updates

    def update_tasks(self, job_id: str, updates: Sequence[TaskUpdate]) -> JobRecord:
        """Apply state changes reported for tasks of one job (by the host manager, placement…).

        An update for an attempt that is no longer current is stale and ignored. An illegal
        transition raises FailedPrecondition and writes nothing.
        """
        with self._db.writing() as session:
            row = self._lock(session, job_id)
            now = self._clock()
            tasks = repo.task_rows(session, job_id, (u.instance_id for u in updates))
            counts = repo.counts_of(row)
            events: list[dict[str, object]] = []
            failures: list[restarts.Failure] = []
            for u in updates:
                task = tasks.get(u.instance_id)
                if task is None:
                    raise NotFound(f"job {job_id} has no instance {u.instance_id}")
                if u.attempt != task.attempt:
                    log.info(
                        "stale task update ignored",
                        extra={
                            "job_id": job_id,
                            "instance_id": u.instance_id,
                            "attempt": u.attempt,
                            "current_attempt": task.attempt,
                        },
                    )
                    continue
                if task.goal == Goal.RUN and u.state in _FAILURES and u.state != task.state:
                    failures.append(restarts.Failure(u.instance_id, u.state, u.reason, u.message))
                events.extend(self._apply(session, task, u, now, counts))
            repo.insert_events(session, events)
            to_kill: list[str] = []
            grace = 0
            plan: restarts.Plan | None = None
            if failures and Goal(row.goal) == Goal.RUN:
                spec = repo.spec_from_bytes(row.spec)
                grace = spec.preemption.kill_grace_seconds
                plan = restarts.plan(spec, row.gang_failures, failures, _failures_of(tasks), now)
                to_kill = self._after_failures(session, row, plan, now, counts)
            self._derive(session, row, now, counts)
            job = repo.job_record(row)
        self._after_commit(to_kill, grace, job_id)
        if plan is not None:
            if plan.action is restarts.Action.RESTART_GANG:
                self.metrics.gang_restarts.inc()
            log.warning(
                "job tasks failed",
                extra={"job_id": job_id, "action": plan.action.value, "why": plan.message},
            )
        return job

    def _after_failures(
        self,
        session: Session,
        row: JobRow,
        plan: restarts.Plan,
        now: datetime,
        counts: dict[TaskState, int],
    ) -> list[str]:
        """Carry out a :func:`restarts.plan` for failures just written; returns the attempts to
        kill (the rest of a failed gang)."""
        if plan.action is restarts.Action.RESTART_TASKS:
            if plan.restart:
                _renew(
                    session,
                    row.id,
                    counts,
                    _FAILURES,
                    now=now,
                    reason=restarts.TASK_RESTART,
                    message=plan.message,
                    reset_failures=False,
                    instances=plan.restart,
                )
                row.not_before = plan.not_before
            return []
        restart = plan.action is restarts.Action.RESTART_GANG
        if restart:
            self._requeue_gang(session, row.id, now, plan.message, counts)
            reason = restarts.GANG_RESTART
        else:
            self._end_gang(session, row.id, now, plan.message, counts)
            # Tasks already being killed for a restart must now stay killed.
            repo.set_goal(session, row.id, {TaskState.KILLING}, Goal.KILL, now=now)
            reason = plan.cause.reason
        to_kill = self._stop_running(
            session,
            row,
            counts,
            now,
            restarts.GANG_RESTART if restart else reason,
            plan.message,
            Goal.RESTART if restart else Goal.KILL,
        )
        # Not a change of the job's state (that comes with its event when derived): the version
        # stays.
        row.gang_failures += 1
        row.not_before = plan.not_before
        row.reason, row.message = reason, plan.message
        return to_kill

    def _requeue_gang(
        self, session: Session, job_id: str, now: datetime, why: str, counts: dict[TaskState, int]
    ) -> None:
        """Every task of a failed gang that is not running goes back to PENDING: unlaunched
        ones in their attempt, ended ones (the failed, and any that had finished) in a new one."""
        _move(
            session,
            job_id,
            counts,
            TASK_UNLAUNCHED - {TaskState.PENDING, TaskState.INITIALIZED},
            TaskState.PENDING,
            now=now,
            reason=restarts.GANG_RESTART,
            message=why,
            goal=Goal.RUN,
        )
        _renew(
            session,
            job_id,
            counts,
            TASK_TERMINAL,
            now=now,
            reason=restarts.GANG_RESTART,
            message=why,
            reset_failures=False,
        )

    def _end_gang(
        self, session: Session, job_id: str, now: datetime, why: str, counts: dict[TaskState, int]
    ) -> None:
        """A gang out of restarts: what never launched is killed (running tasks are stopped by
        the caller); the job then fails with the failure's reason."""
        _move(
            session,
            job_id,
            counts,
            TASK_UNLAUNCHED,
            TaskState.KILLED,
            now=now,
            reason="gang_failed",
            message=why,
            goal=Goal.KILL,
        )

    def _apply(
        self,
        session: Session,
        task: TaskRow,
        u: TaskUpdate,
        now: datetime,
        counts: dict[TaskState, int],
    ) -> list[dict[str, object]]:
        current = TaskState(task.state)
        if u.state == current:
            return []
        check_task_transition(current, u.state)
        changes: dict[str, object] = {"state": u.state.value, "updated_at": now}
        if u.reason or u.message:
            changes.update(reason=u.reason, message=u.message)
        # Where it was placed or launched; "" leaves what is recorded.
        placed = {"host": u.host, "agent_id": u.agent_id, "executor_id": u.executor_id}
        changes.update((k, v) for k, v in placed.items() if v)
        if u.state == TaskState.RUNNING and task.started_at is None:
            changes["started_at"] = now
        if u.state in TASK_TERMINAL:
            changes["ended_at"] = now
            if u.state in _FAILURES and task.goal == Goal.RUN:
                changes["failures"] = task.failures + 1
        # Why it was being killed (preempted, restarted, its gang failed): its next attempt's
        # reason (a message shared by the gang's tasks stays shared).
        why = (task.reason, task.message, task.message_id)
        events = [self._event(task, current, u.state, now, u.reason, u.message, u.host)]
        repo.set_task(session, task, **changes)
        _shift(counts, {current: 1}, u.state)
        if u.state in TASK_TERMINAL and task.goal == Goal.RESTART:
            events.append(self._new_attempt(session, task, now, *why))
            _shift(counts, {u.state: 1}, TaskState.PENDING, new_attempt=True)
        return events

    def _new_attempt(
        self,
        session: Session,
        task: TaskRow,
        now: datetime,
        reason: str,
        message: str,
        message_id: int | None = None,
    ) -> dict[str, object]:
        current = TaskState(task.state)
        repo.archive_attempt(session, task)
        repo.set_task(
            session,
            task,
            attempt=task.attempt + 1,
            state=TaskState.PENDING.value,
            goal=Goal.RUN.value,
            **repo.UNPLACED,
            reason=reason,
            message=message,
            message_id=message_id,
            started_at=None,
            ended_at=None,
            updated_at=now,
        )
        return self._event(task, current, TaskState.PENDING, now, reason, message, "", message_id)

    @staticmethod
    def _event(
        task: TaskRow,
        src: TaskState,
        dst: TaskState,
        now: datetime,
        reason: str,
        message: str,
        host: str,
        message_id: int | None = None,
    ) -> dict[str, object]:
        """A task event; ``message_id`` names a shared message (``message`` is then "")."""
        return {
            "job_id": task.job_id,
            "instance_id": task.instance_id,
            "time": now,
            "from_state": src.value,
            "to_state": dst.value,
            "reason": reason,
            "message": message,
            "message_id": message_id,
            "host": host or task.host,
            "attempt_id": attempt_id(task.job_id, task.instance_id, task.attempt),
        }

    # ------------------------------------------------------------------ helpers

    def _lock(self, session: Session, job_id: str) -> JobRow:
        row = repo.lock_job(session, job_id)
        if row is None:
            raise NotFound(f"job {job_id} not found")
        return row

    def _derive(
        self,
        session: Session,
        row: JobRow,
        now: datetime,
        counts: dict[TaskState, int],
        *,
        goal: Goal | None = None,
        reason: str = "",
        message: str = "",
    ) -> None:
        """Store a locked job's new task counts, derive its state from them, and write the
        state with an event if it changed."""
        row.task_counts = repo.counts_to_json(counts)
        new_goal = goal or Goal(row.goal)
        old = JobState(row.state)
        new = derive_job_state(counts, new_goal)
        if new == old and new_goal == Goal(row.goal):
            return
        check_job_transition(old, new)
        if not reason:
            reason, message = self._job_reason(session, row, new, now)
        if new == JobState.RUNNING and row.deadline_at is None:
            limit = repo.spec_from_bytes(row.spec).max_runtime_seconds
            if limit:
                row.deadline_at = now + timedelta(seconds=limit)
        repo.update_job(
            session,
            row,
            state=new.value,
            goal=new_goal.value,
            reason=reason,
            message=message,
            updated_at=now,
        )
        if new != old:
            repo.insert_events(
                session,
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

    @staticmethod
    def _job_reason(
        session: Session, row: JobRow, state: JobState, now: datetime
    ) -> tuple[str, str]:
        """Why a job is in ``state``: a killed job keeps the kill's reason, a job waiting out a
        restart backoff keeps the failure's, a failed gang the failure that ended it, another
        failed job gets its first task failure's; other states need none."""
        if state in (JobState.KILLING, JobState.KILLED):
            return row.reason, row.message
        if state == JobState.PENDING and row.not_before is not None and row.not_before > now:
            return row.reason, row.message
        if state != JobState.FAILED:
            return "", ""
        if row.gang_failures:
            return row.reason, row.message
        job_id = row.id
        first = session.scalar(
            select(TaskRow.instance_id)
            .where(
                TaskRow.job_id == job_id,
                TaskRow.state.in_([TaskState.FAILED.value, TaskState.LOST.value]),
            )
            .order_by(TaskRow.ended_at, TaskRow.instance_id)
            .limit(1)
        )
        if first is None:
            return "failed", ""
        task = session.get(TaskRow, (job_id, first))
        assert task is not None
        message = repo.task_message(session, task)
        return task.reason or "failed", f"instance {first}: {message}".rstrip(": ")

    @staticmethod
    def _attempts_in(session: Session, job_id: str, states: Iterable[TaskState]) -> list[str]:
        rows = session.execute(
            select(TaskRow.instance_id, TaskRow.attempt).where(
                TaskRow.job_id == job_id, TaskRow.state.in_([s.value for s in states])
            )
        )
        return [attempt_id(job_id, i, a) for i, a in rows]

    def _after_commit(self, to_kill: Sequence[str], grace: int, job_id: str) -> None:
        self.events.publish(job_id)
        if to_kill and self._killer is not None:
            self._killer.kill(to_kill, grace)
        if self._scheduler is not None:
            self._scheduler.job_changed(job_id)


def _move(
    session: Session,
    job_id: str,
    counts: dict[TaskState, int],
    sources: Iterable[TaskState],
    to: TaskState,
    *,
    now: datetime,
    reason: str,
    message: str,
    goal: Goal,
    instances: Sequence[int] | None = None,
) -> None:
    """Move a job's tasks in ``sources`` (and ``instances``, if given) to ``to``, checked
    against the state table and counted in ``counts``."""
    moved = repo.bulk_transition(
        session,
        job_id,
        sources,
        to,
        now=now,
        reason=reason,
        message=message,
        goal=goal,
        ended=to in TASK_TERMINAL,
        instances=instances,
    )
    _shift(counts, moved, to)


def _renew(
    session: Session,
    job_id: str,
    counts: dict[TaskState, int],
    sources: Iterable[TaskState],
    *,
    now: datetime,
    reason: str,
    message: str,
    reset_failures: bool,
    instances: Sequence[int] | None = None,
) -> None:
    """Start a new PENDING attempt of a job's ended tasks in ``sources`` (and ``instances``)."""
    moved = repo.bulk_new_attempt(
        session,
        job_id,
        sources,
        now=now,
        reason=reason,
        message=message,
        reset_failures=reset_failures,
        instances=instances,
    )
    _shift(counts, moved, TaskState.PENDING, new_attempt=True)


def _shift(
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


def _failures_of(tasks: Mapping[int, TaskRow]) -> dict[int, int]:
    return {i: t.failures for i, t in tasks.items()}


def _page_size(requested: int, default: int, maximum: int) -> int:
    if requested == 0:
        return default
    if requested < 0 or requested > maximum:
        raise InvalidArgument("page_size", f"must be between 1 and {maximum}")
    return requested
