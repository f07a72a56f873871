"""An in-memory job ledger: the job manager's rules without a database, for fast tests.

:class:`MemoryLedger` implements :class:`peloton.core.ledger.JobLedger` (what the resource
manager, the launcher and the host manager need of the job manager) and the few calls tests use
to set up and read jobs (create, kill, get, list tasks, events). It follows the same rules as
:class:`peloton.jobmgr.manager.JobManager`: every change is checked against the state tables and
is all or nothing, the job's state is derived from its tasks', failures follow
:mod:`peloton.jobmgr.restarts`, and the scheduler and the killer are told after the change.
``tests/test_ledger_contract.py`` runs the same script on both and checks they agree.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from peloton.core import spec as specs
from peloton.core.ledger import JobLedger, PoolStore
from peloton.core.pools import PoolConfig
from peloton.core.records import (
    AttemptRecord,
    EventRecord,
    JobRecord,
    Placement,
    TaskRecord,
    TaskUpdate,
    launch_updates,
)
from peloton.core.records import attempt_id as make_attempt_id
from peloton.core.spec import is_elastic
from peloton.core.states import (
    JOB_TERMINAL,
    TASK_ACTIVE,
    TASK_PROGRESS,
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
from peloton.errors import FailedPrecondition, NotFound
from peloton.jobmgr import restarts
from peloton.jobmgr.manager import MAX_RUNTIME, PREEMPTED, UNPLACEABLE
from peloton.v1 import job_pb2

T = TaskState
_FAILURES = frozenset({T.FAILED, T.LOST})


class Killer(Protocol):
    def kill(self, attempt_ids: Sequence[str], grace_seconds: int) -> None: ...


class Scheduler(Protocol):
    def check_pool(self, pool: str) -> None: ...

    def job_changed(self, job_id: str) -> None: ...


@dataclass
class _Task:
    job_id: str
    instance_id: int
    updated_at: datetime
    attempt: int = 1
    state: TaskState = T.PENDING
    goal: Goal = Goal.RUN
    failures: int = 0
    reason: str = ""
    message: str = ""
    host: str = ""
    agent_id: str = ""
    executor_id: str = ""
    started_at: datetime | None = None
    ended_at: datetime | None = None
    version: int = 1
    history: list[AttemptRecord] = field(default_factory=list)

    def current(self) -> AttemptRecord:
        return AttemptRecord(
            job_id=self.job_id,
            instance_id=self.instance_id,
            attempt=self.attempt,
            state=self.state,
            host=self.host,
            reason=self.reason,
            message=self.message,
            started_at=self.started_at,
            ended_at=self.ended_at,
            agent_id=self.agent_id,
            executor_id=self.executor_id,
        )

    def record(self) -> TaskRecord:
        return TaskRecord(
            job_id=self.job_id,
            instance_id=self.instance_id,
            state=self.state,
            goal=self.goal,
            current=self.current(),
            failures=self.failures,
            version=self.version,
            history=tuple(reversed(self.history)),
        )


@dataclass
class _Job:
    id: str
    spec: job_pb2.JobSpec
    created_at: datetime
    updated_at: datetime
    tasks: dict[int, _Task]
    state: JobState = JobState.PENDING
    goal: Goal = Goal.RUN
    reason: str = ""
    message: str = ""
    version: int = 1
    gang_failures: int = 0
    not_before: datetime | None = None
    deadline_at: datetime | None = None

    def counts(self) -> dict[TaskState, int]:
        out: dict[TaskState, int] = {}
        for t in self.tasks.values():
            out[t.state] = out.get(t.state, 0) + 1
        return out

    def in_states(self, states: Iterable[TaskState]) -> list[_Task]:
        wanted = set(states)
        return [t for _, t in sorted(self.tasks.items()) if t.state in wanted]

    def record(self) -> JobRecord:
        return JobRecord(
            id=self.id,
            spec=self.spec,
            state=self.state,
            goal=self.goal,
            reason=self.reason,
            message=self.message,
            created_at=self.created_at,
            updated_at=self.updated_at,
            version=self.version,
            task_counts=self.counts(),
            gang_failures=self.gang_failures,
            not_before=self.not_before,
        )


def utcnow() -> datetime:
    return datetime.now(UTC)


class MemoryLedger:
    """Jobs and tasks in a dict, under one lock (the launcher records from worker threads)."""

    def __init__(
        self, *, clock: Callable[[], datetime] = utcnow, killer: Killer | None = None
    ) -> None:
        self._clock = clock
        self._killer = killer
        self._scheduler: Scheduler | None = None
        self._lock = threading.RLock()
        self._jobs: dict[str, _Job] = {}
        self._events: list[EventRecord] = []
        self._sequence = 0

    def set_killer(self, killer: Killer) -> None:
        self._killer = killer

    def set_scheduler(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    # ------------------------------------------------------------------ set-up and reads

    def create_job(self, spec: job_pb2.JobSpec, request_id: str = "") -> tuple[JobRecord, bool]:
        full = specs.with_defaults(spec)
        specs.validate_job_spec(full)
        if self._scheduler is not None:
            self._scheduler.check_pool(full.pool)
        job_id = str(uuid.uuid4())
        with self._lock:
            now = self._clock()
            tasks = {i: _Task(job_id, i, now) for i in range(full.instances)}
            job = _Job(job_id, full, now, now, tasks)
            self._jobs[job_id] = job
            self._append_event(
                job_id,
                None,
                now,
                "",
                JobState.PENDING.value,
                "created",
                f"{full.instances} tasks in pool {full.pool}",
                "",
                "",
            )
            record = job.record()
        self._after_commit((), 0, job_id)
        return record, True

    def get_job(self, job_id: str) -> JobRecord:
        with self._lock:
            return self._require(job_id).record()

    def get_jobs(self, job_ids: Iterable[str]) -> list[JobRecord]:
        with self._lock:
            return [self._jobs[j].record() for j in sorted(set(job_ids)) if j in self._jobs]

    def unfinished_jobs(self) -> list[JobRecord]:
        with self._lock:
            jobs = [j for j in self._jobs.values() if j.state not in JOB_TERMINAL]
            return [j.record() for j in sorted(jobs, key=lambda j: (j.created_at, j.id))]

    def instances(self, job_id: str, states: Iterable[TaskState]) -> tuple[int, ...]:
        with self._lock:
            job = self._jobs.get(job_id)
            return () if job is None else tuple(t.instance_id for t in job.in_states(states))

    def attempts(self, job_id: str, states: Iterable[TaskState]) -> dict[int, int]:
        with self._lock:
            job = self._jobs.get(job_id)
            return {} if job is None else {t.instance_id: t.attempt for t in job.in_states(states)}

    def ready_attempts(self, job_ids: Iterable[str]) -> dict[str, dict[int, int]]:
        found = {j: self.attempts(j, {T.READY}) for j in job_ids}
        return {j: attempts for j, attempts in found.items() if attempts}

    def list_tasks(
        self,
        job_id: str,
        states: frozenset[TaskState] = frozenset(),
        page_size: int = 0,
        page_token: str = "",
    ) -> tuple[list[TaskRecord], str]:
        """Every task of a job (in ``states``, if given), by instance id; one page."""
        with self._lock:
            job = self._require(job_id)
            tasks = job.in_states(states) if states else [t for _, t in sorted(job.tasks.items())]
            return [t.record() for t in tasks], ""

    def get_task(self, job_id: str, instance_id: int) -> tuple[TaskRecord, list[EventRecord]]:
        with self._lock:
            task = self._require(job_id).tasks.get(instance_id)
            if task is None:
                raise NotFound(f"job {job_id} has no instance {instance_id}")
            events = [e for e in self._events if (e.job_id, e.instance_id) == (job_id, instance_id)]
            return task.record(), events

    def job_events(self, job_id: str, after: int = 0, limit: int = 1000) -> list[EventRecord]:
        with self._lock:
            self._require(job_id)
            return [e for e in self._events if e.job_id == job_id and e.sequence > after][:limit]

    # ------------------------------------------------------------------ kill, delete, expire

    def kill_job(self, job_id: str, message: str = "", *, reason: str = "killed") -> JobRecord:
        message = message or "killed by user"
        with self._writing([job_id]) as (now, jobs):
            job = jobs[0]
            if job.state in JOB_TERMINAL:
                raise FailedPrecondition(f"job {job_id} is already {job.state}; nothing to kill")
            if job.goal == Goal.KILL:
                return job.record()
            self._move(job, TASK_UNLAUNCHED, T.KILLED, now, reason, message, Goal.KILL)
            for t in job.in_states({T.KILLING}):
                t.goal = Goal.KILL
            to_kill = self._stop_running(job, now, reason, message, Goal.KILL)
            self._derive(job, now, goal=Goal.KILL, reason=reason, message=message)
            record = job.record()
        self._after_commit(to_kill, job.spec.preemption.kill_grace_seconds, job_id)
        return record

    def restart_job(self, job_id: str, message: str = "") -> JobRecord:
        message = message or "restarted by user"
        with self._writing([job_id]) as (now, jobs):
            job = jobs[0]
            if job.state == JobState.KILLING:
                raise FailedPrecondition(f"job {job_id} is KILLING; restart it once it is KILLED")
            if job.state == JobState.PENDING:
                raise FailedPrecondition(f"job {job_id} is PENDING; no task has started yet")
            self._renew(job, TASK_TERMINAL, now, "restarted", message, reset_failures=True)
            to_kill = self._stop_running(job, now, "restarted", message, Goal.RESTART)
            job.gang_failures, job.not_before, job.deadline_at = 0, None, None
            self._derive(job, now, goal=Goal.RUN, reason="restarted", message=message)
            record = job.record()
        self._after_commit(to_kill, job.spec.preemption.kill_grace_seconds, job_id)
        return record

    def delete_job(self, job_id: str) -> None:
        with self._writing([job_id]) as (_, jobs):
            if jobs[0].state not in JOB_TERMINAL:
                raise FailedPrecondition(f"job {job_id} is {jobs[0].state}; it has not ended")
            del self._jobs[job_id]

    def expire_jobs(self) -> list[str]:
        """Kill every job past its max runtime (as the job manager's does)."""
        now = self._clock()
        with self._lock:
            expired = [
                j
                for j in self._jobs.values()
                if j.deadline_at is not None
                and j.deadline_at <= now
                and j.goal != Goal.KILL
                and j.state not in JOB_TERMINAL
            ]
        killed = []
        for job in expired:
            limit = job.spec.max_runtime_seconds
            try:
                self.kill_job(
                    job.id, f"ran longer than max_runtime_seconds ({limit} s)", reason=MAX_RUNTIME
                )
                killed.append(job.id)
            except (FailedPrecondition, NotFound):
                pass
        return killed

    # ------------------------------------------------------------------ scheduling

    def admit_pending(self, gangs: Sequence[tuple[str, int, str]]) -> list[tuple[int, ...]]:
        admitted: list[tuple[int, ...]] = []
        with self._writing([job_id for job_id, _, _ in gangs]) as (now, jobs):
            by_id = {j.id: j for j in jobs}
            for job_id, count, message in gangs:
                job = by_id[job_id]
                ids = tuple(t.instance_id for t in job.in_states({T.PENDING})[:count])
                if job.goal == Goal.KILL or len(ids) < count:
                    admitted.append(())
                    continue
                self._move(
                    job, {T.PENDING}, T.READY, now, "admitted", message, Goal.RUN, instances=ids
                )
                self._derive(job, now)
                if job.state == JobState.PENDING:
                    job.reason, job.message, job.updated_at = "admitted", message, now
                    job.version += 1
                admitted.append(ids)
        for job_id in dict.fromkeys(job_id for job_id, _, _ in gangs):
            self._after_commit((), 0, job_id)
        return admitted

    def set_pending_reasons(self, reasons: Mapping[str, tuple[str, str]]) -> None:
        with self._lock:
            for job_id, (reason, message) in reasons.items():
                job = self._require(job_id)
                if job.state == JobState.PENDING:
                    job.reason, job.message = reason, message

    def fail_pending(self, job_id: str, reason: str, message: str) -> JobRecord:
        return self._fail_waiting(job_id, {T.PENDING}, reason, message)

    def fail_unplaceable(self, job_id: str, message: str) -> JobRecord:
        return self._fail_waiting(job_id, {T.PENDING, T.READY}, UNPLACEABLE, message)

    def _fail_waiting(
        self, job_id: str, states: set[TaskState], reason: str, message: str
    ) -> JobRecord:
        with self._writing([job_id]) as (now, jobs):
            job = jobs[0]
            self._move(job, states, T.FAILED, now, reason, message, Goal.RUN)
            self._derive(job, now, reason=reason, message=message)
            record = job.record()
        self._after_commit((), 0, job_id)
        return record

    def preempt(self, job_id: str, message: str, count: int = 0) -> JobRecord:
        with self._writing([job_id]) as (now, jobs):
            job = jobs[0]
            unlaunched = {T.READY, T.PLACING, T.PLACED}
            running = TASK_ACTIVE - {T.KILLING, T.PREEMPTING}
            back = stop = None
            if count:
                back = _highest(job.in_states(unlaunched), count)
                stop = _highest(job.in_states(running), count - len(back))
            self._move(
                job, unlaunched, T.PENDING, now, PREEMPTED, message, Goal.RUN, instances=back
            )
            self._move(
                job, running, T.PREEMPTING, now, PREEMPTED, message, Goal.RESTART, instances=stop
            )
            to_kill = [self._attempt_id(t) for t in job.in_states({T.PREEMPTING})]
            self._derive(job, now, reason=PREEMPTED, message=message)
            record = job.record()
        self._after_commit(to_kill, job.spec.preemption.kill_grace_seconds, job_id)
        return record

    def requeue_placements(self) -> list[str]:
        with self._lock:
            job_ids = sorted(
                j.id for j in self._jobs.values() if j.in_states({T.PLACING, T.PLACED})
            )
        why = "placement was interrupted by a daemon restart"
        for job_id in job_ids:
            with self._writing([job_id]) as (now, jobs):
                self._move(jobs[0], {T.PLACING, T.PLACED}, T.READY, now, "requeued", why, Goal.RUN)
                self._derive(jobs[0], now)
            self._after_commit((), 0, job_id)
        return job_ids

    # ------------------------------------------------------------------ task updates

    def record_launches(self, gangs: Mapping[str, Mapping[int, Placement]]) -> dict[str, str]:
        refused = {}
        for job_id, places in gangs.items():
            ready = self.attempts(job_id, {T.READY})
            gone = sorted(i for i, p in places.items() if ready.get(i) != p.attempt)
            if gone:
                refused[job_id] = f"tasks {gone} of job {job_id} are no longer READY"
            else:
                self.update_tasks(job_id, launch_updates(places))
        return refused

    def record_progress(self, updates: Mapping[str, Sequence[TaskUpdate]]) -> list[str]:
        left = []
        for job_id, job_updates in updates.items():
            try:
                if any(u.state not in TASK_PROGRESS for u in job_updates):
                    raise FailedPrecondition("not progress")
                self.update_tasks(job_id, job_updates)
            except (FailedPrecondition, NotFound):
                left.append(job_id)
        return left

    def update_tasks(self, job_id: str, updates: Sequence[TaskUpdate]) -> JobRecord:
        with self._writing([job_id]) as (now, jobs):
            job = jobs[0]
            failures: list[restarts.Failure] = []
            touched: dict[int, _Task] = {}
            for u in updates:
                task = job.tasks.get(u.instance_id)
                if task is None:
                    raise NotFound(f"job {job_id} has no instance {u.instance_id}")
                touched[u.instance_id] = task
                if u.attempt != task.attempt:
                    continue  # stale
                if task.goal == Goal.RUN and u.state in _FAILURES and u.state != task.state:
                    failures.append(restarts.Failure(u.instance_id, u.state, u.reason, u.message))
                self._apply(job, task, u, now)
            to_kill: list[str] = []
            grace = 0
            if is_elastic(job.spec) and job.counts().get(T.SUCCEEDED, 0) > 0:
                if any(u.state == T.SUCCEEDED for u in updates):
                    why = "the elastic gang finished"
                    self._move(job, TASK_UNLAUNCHED, T.KILLED, now, "gang_finished", why, Goal.KILL)
            elif failures and job.goal == Goal.RUN:
                grace = job.spec.preemption.kill_grace_seconds
                task_failures = {i: t.failures for i, t in touched.items()}
                running = len(job.in_states(TASK_ACTIVE - {T.KILLING, T.PREEMPTING}))
                plan = restarts.plan(
                    job.spec, job.gang_failures, failures, task_failures, now, running
                )
                to_kill = self._after_failures(job, plan, now)
            self._derive(job, now)
            record = job.record()
        self._after_commit(to_kill, grace, job_id)
        return record

    def _apply(self, job: _Job, task: _Task, u: TaskUpdate, now: datetime) -> None:
        current = task.state
        if u.state == current:
            return
        check_task_transition(current, u.state)
        why = (task.reason, task.message)
        self._task_event(task, current, u.state, now, u.reason, u.message, u.host or task.host)
        task.state, task.updated_at = u.state, now
        task.version += 1
        if u.reason or u.message:
            task.reason, task.message = u.reason, u.message
        task.host = u.host or task.host
        task.agent_id = u.agent_id or task.agent_id
        task.executor_id = u.executor_id or task.executor_id
        if u.state == T.RUNNING and task.started_at is None:
            task.started_at = now
        if u.state in TASK_TERMINAL:
            task.ended_at = now
            if u.state in _FAILURES and task.goal == Goal.RUN and restarts.counts(u.reason):
                task.failures += 1
            if task.goal == Goal.RESTART:
                self._new_attempt(task, now, *why)

    def _after_failures(self, job: _Job, plan: restarts.Plan, now: datetime) -> list[str]:
        if plan.action in (restarts.Action.RESTART_TASKS, restarts.Action.SHRINK):
            if plan.restart:
                self._renew(
                    job, _FAILURES, now, restarts.TASK_RESTART, plan.message, instances=plan.restart
                )
                job.not_before = plan.not_before
            return []
        restart = plan.action is restarts.Action.RESTART_GANG
        if restart:
            waiting = TASK_UNLAUNCHED - {T.PENDING, T.INITIALIZED}
            self._move(job, waiting, T.PENDING, now, restarts.GANG_RESTART, plan.message, Goal.RUN)
            self._renew(job, TASK_TERMINAL, now, restarts.GANG_RESTART, plan.message)
            reason = restarts.GANG_RESTART
        else:
            self._move(job, TASK_UNLAUNCHED, T.KILLED, now, "gang_failed", plan.message, Goal.KILL)
            for t in job.in_states({T.KILLING}):
                t.goal = Goal.KILL
            reason = plan.cause.reason
        to_kill = self._stop_running(
            job, now, reason, plan.message, Goal.RESTART if restart else Goal.KILL
        )
        job.gang_failures += int(plan.counted)
        job.not_before = plan.not_before
        job.reason, job.message = reason, plan.message
        return to_kill

    # ------------------------------------------------------------------ the rules

    def _move(
        self,
        job: _Job,
        sources: Iterable[TaskState],
        to: TaskState,
        now: datetime,
        reason: str,
        message: str,
        goal: Goal,
        *,
        instances: Sequence[int] | None = None,
    ) -> None:
        for task in job.in_states(sources):
            if instances is not None and task.instance_id not in instances:
                continue
            check_task_transition(task.state, to)
            self._task_event(task, task.state, to, now, reason, message, task.host)
            task.state, task.goal, task.reason, task.message = to, goal, reason, message
            task.updated_at = now
            task.version += 1
            if to in TASK_TERMINAL:
                task.ended_at = now

    def _renew(
        self,
        job: _Job,
        sources: Iterable[TaskState],
        now: datetime,
        reason: str,
        message: str,
        *,
        instances: Sequence[int] | None = None,
        reset_failures: bool = False,
    ) -> None:
        for task in job.in_states(sources):
            if instances is not None and task.instance_id not in instances:
                continue
            self._new_attempt(task, now, reason, message)
            if reset_failures:
                task.failures = 0

    def _new_attempt(self, task: _Task, now: datetime, reason: str, message: str) -> None:
        check_new_attempt(task.state)
        task.history.append(task.current())
        before = task.state
        task.attempt += 1
        task.state, task.goal, task.reason, task.message = T.PENDING, Goal.RUN, reason, message
        task.host = task.agent_id = task.executor_id = ""
        task.started_at = task.ended_at = None
        task.updated_at = now
        task.version += 1
        self._task_event(task, before, T.PENDING, now, reason, message, "")

    def _stop_running(
        self, job: _Job, now: datetime, reason: str, message: str, goal: Goal
    ) -> list[str]:
        self._move(job, TASK_ACTIVE - {T.KILLING}, T.KILLING, now, reason, message, goal)
        return [self._attempt_id(t) for t in job.in_states({T.KILLING})]

    def _derive(
        self,
        job: _Job,
        now: datetime,
        *,
        goal: Goal | None = None,
        reason: str = "",
        message: str = "",
    ) -> None:
        new_goal = goal or job.goal
        old = job.state
        new = derive_job_state(job.counts(), new_goal, elastic=is_elastic(job.spec))
        if new == old and new_goal == job.goal:
            return
        check_job_transition(old, new)
        if not reason:
            reason, message = self._job_reason(job, new, now)
        if new == JobState.RUNNING and job.deadline_at is None and job.spec.max_runtime_seconds:
            job.deadline_at = now + timedelta(seconds=job.spec.max_runtime_seconds)
        job.state, job.goal, job.reason, job.message = new, new_goal, reason, message
        job.updated_at = now
        job.version += 1
        if new != old:
            self._append_event(job.id, None, now, old.value, new.value, reason, message, "", "")

    @staticmethod
    def _job_reason(job: _Job, state: JobState, now: datetime) -> tuple[str, str]:
        if state in (JobState.KILLING, JobState.KILLED):
            return job.reason, job.message
        if state == JobState.PENDING and job.not_before is not None and job.not_before > now:
            return job.reason, job.message
        if state != JobState.FAILED:
            return "", ""
        if job.gang_failures:
            return job.reason, job.message
        failed = job.in_states(_FAILURES)
        if not failed:
            return "failed", ""
        first = min(failed, key=lambda t: (t.ended_at or now, t.instance_id))
        return first.reason or "failed", f"instance {first.instance_id}: {first.message}".rstrip(
            ": "
        )

    # ------------------------------------------------------------------ plumbing

    def _require(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        return job

    @contextmanager
    def _writing(self, job_ids: Iterable[str]) -> Iterator[tuple[datetime, list[_Job]]]:
        """One transaction over some jobs: all of it or, if it raises, none of it."""
        with self._lock:
            jobs = [self._require(j) for j in dict.fromkeys(job_ids)]
            saved = {j.id: copy.deepcopy(j, {id(j.spec): j.spec}) for j in jobs}
            events, sequence = len(self._events), self._sequence
            try:
                yield self._clock(), jobs
            except BaseException:
                self._jobs.update(saved)
                del self._events[events:]
                self._sequence = sequence
                raise

    def _task_event(
        self,
        task: _Task,
        src: TaskState,
        dst: TaskState,
        now: datetime,
        reason: str,
        message: str,
        host: str,
    ) -> None:
        self._append_event(
            task.job_id,
            task.instance_id,
            now,
            src.value,
            dst.value,
            reason,
            message,
            host,
            self._attempt_id(task),
        )

    def _append_event(
        self,
        job_id: str,
        instance_id: int | None,
        now: datetime,
        src: str,
        dst: str,
        reason: str,
        message: str,
        host: str,
        attempt: str,
    ) -> None:
        self._sequence += 1
        self._events.append(
            EventRecord(
                self._sequence, job_id, instance_id, now, src, dst, reason, message, host, attempt
            )
        )

    @staticmethod
    def _attempt_id(task: _Task) -> str:
        return make_attempt_id(task.job_id, task.instance_id, task.attempt)

    def _after_commit(self, to_kill: Sequence[str], grace: int, job_id: str) -> None:
        if to_kill and self._killer is not None:
            self._killer.kill(to_kill, grace)
        if self._scheduler is not None:
            self._scheduler.job_changed(job_id)


class MemoryPoolStore:
    """A PoolStore in a dict; counts unfinished jobs by pool from a ledger."""

    def __init__(self, ledger: MemoryLedger) -> None:
        self._ledger = ledger
        self._pools: dict[str, PoolConfig] = {}

    def all_pools(self) -> list[PoolConfig]:
        return [self._pools[p] for p in sorted(self._pools)]

    def insert_pool(self, config: PoolConfig, now: datetime) -> None:
        self._pools[config.path] = config

    def update_pool(self, config: PoolConfig, now: datetime) -> None:
        assert config.path in self._pools, config.path
        self._pools[config.path] = config

    def delete_pool(self, path: str) -> None:
        self._pools.pop(path, None)

    def unfinished_jobs_by_pool(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for job in self._ledger.unfinished_jobs():
            out[job.spec.pool] = out.get(job.spec.pool, 0) + 1
        return out


def _conforms(ledger: MemoryLedger, pools: MemoryPoolStore) -> tuple[JobLedger, PoolStore]:
    """Checked by mypy: the in-memory ledger and pool store satisfy the protocols."""
    return ledger, pools


def counts(record: JobRecord) -> Mapping[str, int]:
    """A job's task counts by state name (what tests compare)."""
    return {s.value: n for s, n in record.task_counts.items() if n}


def _highest(tasks: Sequence[_Task], count: int) -> list[int]:
    """The ``count`` highest instance ids of ``tasks``."""
    return sorted((t.instance_id for t in tasks), reverse=True)[: max(0, count)]
