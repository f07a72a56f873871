"""Task updates (reported by the host manager, placement…) and what failures among them lead to:
new attempts of the failed tasks, or the whole gang's restart or end (the rules are
:mod:`peloton.jobmgr.restarts`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime

from peloton.core.records import LAUNCH_STEPS, JobRecord, Placement, TaskUpdate, attempt_id
from peloton.core.spec import is_elastic
from peloton.core.states import (
    TASK_ACTIVE,
    TASK_PROGRESS,
    TASK_TERMINAL,
    TASK_UNLAUNCHED,
    Goal,
    TaskState,
    check_task_transition,
    task_transition_allowed,
)
from peloton.errors import NotFound
from peloton.jobmgr import restarts
from peloton.jobmgr.work import FAILURES, Part, UnitOfWork, shift
from peloton.storage import jobs as repo
from peloton.storage.models import TaskRow

log = logging.getLogger(__name__)

# Reason of an elastic gang's tasks that were still waiting to start when it finished.
GANG_FINISHED = "gang_finished"
# Tasks that run and are meant to go on running (not on their way out).
RUNNING = TASK_ACTIVE - {TaskState.PREEMPTING, TaskState.KILLING}
# States only the launcher writes (a placement, or its undoing): their transaction is fenced, so
# that a deposed leader records no placement (see Context.fenced).
PLACEMENT = frozenset({TaskState.READY, TaskState.PLACING, TaskState.PLACED, TaskState.LAUNCHING})


class TaskUpdates(Part):
    """Applies task updates to a job, and restarts what failed."""

    def update_tasks(self, job_id: str, updates: Sequence[TaskUpdate]) -> JobRecord:
        """Apply state changes reported for tasks of one job (by the host manager, placement…).

        An update for an attempt that is no longer current is stale and ignored. An illegal
        transition raises FailedPrecondition and writes nothing.
        """
        with self._ctx.job(job_id) as work:
            if any(u.state in PLACEMENT for u in updates):
                self._ctx.fenced(work.session)
            tasks = repo.task_rows(work.session, job_id, (u.instance_id for u in updates))
            events: list[dict[str, object]] = []
            failures: list[restarts.Failure] = []
            gone: list[str] = []  # their attempts
            for u in updates:
                task = tasks.get(u.instance_id)
                if task is None:
                    raise NotFound(f"job {job_id} has no instance {u.instance_id}")
                if u.attempt != task.attempt:
                    _stale(job_id, u, task.attempt)
                    continue
                if task.goal == Goal.RUN and u.state in FAILURES and u.state != task.state:
                    failures.append(restarts.Failure(u.instance_id, u.state, u.reason, u.message))
                    gone.append(attempt_id(job_id, u.instance_id, u.attempt))
                events.extend(_apply(work, task, u))
            repo.insert_events(work.session, events)
            to_kill: list[str] = []
            grace = 0
            plan: restarts.Plan | None = None
            spec = work.spec()
            finished = is_elastic(spec) and work.counts.get(TaskState.SUCCEEDED, 0) > 0
            if finished:
                _finish_elastic(work, updates, tasks)
            elif failures and work.goal == Goal.RUN:
                grace = spec.preemption.kill_grace_seconds
                running = sum(n for s, n in work.counts.items() if s in RUNNING)
                plan = restarts.plan(
                    spec, work.row.gang_failures, failures, _failures_of(tasks), work.now, running
                )
                to_kill = _after_failures(work, plan)
            work.derive()
            job = work.record()
        if plan is not None and plan.action is restarts.Action.SHRINK and self._ctx.elastic:
            # The gang's endpoint may not have seen them go (a lost host keeps its sockets).
            self._ctx.elastic.drain(job_id, gone, plan.message)
        self._ctx.after_commit(job_id, to_kill, grace)
        if plan is not None:
            if plan.action is restarts.Action.RESTART_GANG:
                self._ctx.metrics.gang_restarts.inc()
            log.warning(
                "job tasks failed",
                extra={"job_id": job_id, "action": plan.action.value, "why": plan.message},
            )
        return job

    def record_launches(self, gangs: Mapping[str, Mapping[int, Placement]]) -> dict[str, str]:
        """The launcher's record of placed gangs, one per job (see
        LaunchLedger.record_launches), in one transaction for all: what :meth:`update_tasks`
        writes for :func:`launch_updates` of each, built for that case alone (no rows loaded as
        objects, no update applied one by one, no transaction per gang: a gang's record was
        the launch path's largest cost). Returns the gangs refused, by job, with why."""
        refused: dict[str, str] = {}
        with self._ctx.db.writing() as session:
            self._ctx.fenced(session)
            works = self._ctx.lock_many(session, gangs)
            ready = repo.tasks_in(session, works, TaskState.READY)
            events: list[dict[str, object]] = []
            for job_id, places in gangs.items():
                work = works.get(job_id)
                attempts = {i: attempt for i, attempt, _ in ready.get(job_id, [])}
                gone = sorted(i for i, p in places.items() if attempts.get(i) != p.attempt)
                if work is None or gone:
                    refused[job_id] = (
                        f"{len(gone)} of the {len(places)} tasks of job {job_id} placed are "
                        f"no longer READY in the attempt placed (instance {gone[0]} first)"
                        if work is not None
                        else f"job {job_id} not found"
                    )
                    continue
                events.extend(_launch_steps(work, places))
                work.derive()
            repo.insert_events(session, events)
        for job_id in gangs:
            if job_id not in refused:
                self._ctx.after_commit(job_id)
        return refused

    def record_progress(self, updates: Mapping[str, Sequence[TaskUpdate]]) -> list[str]:
        """Status updates of several jobs that only move launched tasks on toward running
        (``TASK_PROGRESS``), in one write for all of them: what :meth:`update_tasks` of each
        job's updates writes, without a transaction per job or its tasks loaded as rows (as
        gangs start, their status updates come by the thousand and were most of the daemon's
        writes). Returns the jobs left out, with nothing of theirs written: a job gone, an
        update of another kind, of a task the job lacks, or not allowed from the task's state;
        :meth:`update_tasks` then writes (or refuses) each of them."""
        left: list[str] = []
        written: list[str] = []
        with self._ctx.db.writing() as session:
            works = self._ctx.lock_many(session, updates)
            tasks = repo.task_values(session, works)
            events: list[dict[str, object]] = []
            for job_id, job_updates in updates.items():
                work = works.get(job_id)
                steps = None if work is None else _progress(work, job_updates, tasks)
                if work is None or steps is None:
                    left.append(job_id)
                    continue
                for instance, source, target, values, event in steps:
                    repo.change_tasks(session, [(job_id, instance)], **values)
                    shift(work.counts, {source: 1}, target)
                    events.append(event)
                work.derive()
                written.append(job_id)
            repo.insert_events(session, events)
        for job_id in written:
            self._ctx.after_commit(job_id)
        return left


def _launch_steps(work: UnitOfWork, places: Mapping[int, Placement]) -> list[dict[str, object]]:
    """READY -> PLACING -> PLACED -> LAUNCHING of a gang's tasks (``places``: where each
    attempt is launched), counted; returns their events."""
    job_id = work.job_id
    events: list[dict[str, object]] = []
    for i, p in places.items():
        where = {"host": p.host, "agent_id": p.agent_id, "executor_id": p.executor_id}
        source = TaskState.READY
        for state, reason in LAUNCH_STEPS:
            repo.change_tasks(
                work.session,
                [(job_id, i)],
                state=state.value,
                reason=reason,
                message="",
                message_id=None,
                updated_at=work.now,
                **where,
            )
            events.append(
                repo.task_event(
                    job_id,
                    i,
                    p.attempt,
                    work.now,
                    source,
                    state,
                    reason=reason,
                    message="",
                    host=p.host,
                )
            )
            source = state
    source = TaskState.READY
    for state, _ in LAUNCH_STEPS:
        shift(work.counts, {source: len(places)}, state)
        source = state
    return events


# One checked change of :meth:`TaskUpdates.record_progress`: (instance id, from, to, the task's
# values that change, its event).
_Step = tuple[int, TaskState, TaskState, dict[str, object], dict[str, object]]


def _progress(
    work: UnitOfWork,
    updates: Sequence[TaskUpdate],
    tasks: Mapping[tuple[str, int], Mapping[str, object]],
) -> list[_Step] | None:
    """The changes one job's progress updates make, as :func:`_apply` makes them, worked out
    before any is written; None if one of them is not progress, names no task of the job or is
    not allowed. ``tasks``: the job's tasks' ``PROGRESS_COLUMNS`` by (job id, instance id)."""
    job_id, now = work.job_id, work.now
    steps: list[_Step] = []
    seen: dict[int, dict[str, object]] = {}  # tasks as this job's earlier updates left them
    for u in updates:
        if u.state not in TASK_PROGRESS:
            return None
        task = seen.get(u.instance_id) or tasks.get((job_id, u.instance_id))
        if task is None:
            return None
        if u.attempt != task["attempt"]:
            _stale(job_id, u, task["attempt"])
            continue
        current = TaskState(str(task["state"]))
        if u.state == current:
            continue
        if not task_transition_allowed(current, u.state):
            return None
        changes = _changes(u, now, task["started_at"] is not None)
        if "message" in changes:
            changes["message_id"] = None  # its own message replaces a shared one (as set_task)
        event = repo.task_event(
            job_id,
            u.instance_id,
            u.attempt,
            now,
            current,
            u.state,
            reason=u.reason,
            message=u.message,
            host=u.host or str(task["host"]),
        )
        # Values the task has already need no writing (as set_task leaves them out).
        values = {k: v for k, v in changes.items() if task.get(k) != v}
        seen[u.instance_id] = {**task, **changes}
        steps.append((u.instance_id, current, u.state, values, event))
    return steps


def _stale(job_id: str, u: TaskUpdate, current: object) -> None:
    log.info(
        "stale task update ignored",
        extra={
            "job_id": job_id,
            "instance_id": u.instance_id,
            "attempt": u.attempt,
            "current_attempt": current,
        },
    )


def _finish_elastic(
    work: UnitOfWork, updates: Sequence[TaskUpdate], tasks: Mapping[int, TaskRow]
) -> None:
    """An elastic gang's task succeeded: its training is over (the gang's ranks end together),
    so the tasks it has not grown into yet are killed; ranks still running end on their own
    (the rendezvous endpoint tells latecomers the gang finished)."""
    done = [u.instance_id for u in updates if u.state == TaskState.SUCCEEDED]
    if not done or not work.counts.keys() & TASK_UNLAUNCHED:
        return
    work.move(
        TASK_UNLAUNCHED,
        TaskState.KILLED,
        reason=GANG_FINISHED,
        message=f"the elastic gang finished (instance {min(done)} succeeded)",
        goal=Goal.KILL,
    )


def _after_failures(work: UnitOfWork, plan: restarts.Plan) -> list[str]:
    """Carry out a :func:`restarts.plan` for failures just written; returns the attempts to
    kill (the rest of a failed gang)."""
    if plan.action in (restarts.Action.RESTART_TASKS, restarts.Action.SHRINK):
        if plan.restart:
            work.renew(
                FAILURES,
                reason=restarts.TASK_RESTART,
                message=plan.message,
                reset_failures=False,
                instances=plan.restart,
            )
            work.note(not_before=plan.not_before)
        return []
    restart = plan.action is restarts.Action.RESTART_GANG
    if restart:
        _requeue_gang(work, plan.message)
        reason = restarts.GANG_RESTART
    else:
        _end_gang(work, plan.message)
        # Tasks already being killed for a restart must now stay killed.
        work.set_goal({TaskState.KILLING}, Goal.KILL)
        reason = plan.cause.reason
    to_kill = work.stop_running(
        restarts.GANG_RESTART if restart else reason,
        plan.message,
        Goal.RESTART if restart else Goal.KILL,
    )
    # Not a change of the job's state (that comes with its event when derived): the version
    # stays.
    work.note(
        gang_failures=work.row.gang_failures + int(plan.counted),
        not_before=plan.not_before,
        reason=reason,
        message=plan.message,
    )
    return to_kill


def _requeue_gang(work: UnitOfWork, why: str) -> None:
    """Every task of a failed gang that is not running goes back to PENDING: unlaunched ones
    in their attempt, ended ones (the failed, and any that had finished) in a new one."""
    work.move(
        TASK_UNLAUNCHED - {TaskState.PENDING, TaskState.INITIALIZED},
        TaskState.PENDING,
        reason=restarts.GANG_RESTART,
        message=why,
        goal=Goal.RUN,
    )
    work.renew(TASK_TERMINAL, reason=restarts.GANG_RESTART, message=why, reset_failures=False)


def _end_gang(work: UnitOfWork, why: str) -> None:
    """A gang out of restarts: what never launched is killed (running tasks are stopped by
    the caller); the job then fails with the failure's reason."""
    work.move(TASK_UNLAUNCHED, TaskState.KILLED, reason="gang_failed", message=why, goal=Goal.KILL)


def _apply(work: UnitOfWork, task: TaskRow, u: TaskUpdate) -> list[dict[str, object]]:
    current = TaskState(task.state)
    if u.state == current:
        return []
    check_task_transition(current, u.state)
    now = work.now
    changes = _changes(u, now, task.started_at is not None)
    if u.state in TASK_TERMINAL:
        changes["ended_at"] = now
        if u.state in FAILURES and task.goal == Goal.RUN and restarts.counts(u.reason):
            changes["failures"] = task.failures + 1
    # Why it was being killed (preempted, restarted, its gang failed): its next attempt's
    # reason (a message shared by the gang's tasks stays shared).
    why = (task.reason, task.message, task.message_id)
    events = [_event(task, current, u.state, now, u.reason, u.message, u.host)]
    repo.set_task(work.session, task, **changes)
    shift(work.counts, {current: 1}, u.state)
    if u.state in TASK_TERMINAL and task.goal == Goal.RESTART:
        events.append(_new_attempt(work, task, *why))
        shift(work.counts, {u.state: 1}, TaskState.PENDING, new_attempt=True)
    return events


def _changes(u: TaskUpdate, now: datetime, started: bool) -> dict[str, object]:
    """What an update changes of its task's row (``started``: the attempt has a start time)."""
    changes: dict[str, object] = {"state": u.state.value, "updated_at": now}
    if u.reason or u.message:
        changes.update(reason=u.reason, message=u.message)
    # Where it was placed or launched; "" leaves what is recorded.
    placed = {"host": u.host, "agent_id": u.agent_id, "executor_id": u.executor_id}
    changes.update((k, v) for k, v in placed.items() if v)
    if u.state == TaskState.RUNNING and not started:
        changes["started_at"] = now
    return changes


def _new_attempt(
    work: UnitOfWork, task: TaskRow, reason: str, message: str, message_id: int | None = None
) -> dict[str, object]:
    current = TaskState(task.state)
    now = work.now
    repo.archive_attempt(work.session, task)
    repo.set_task(
        work.session,
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
    return _event(task, current, TaskState.PENDING, now, reason, message, "", message_id)


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
    return repo.task_event(
        task.job_id,
        task.instance_id,
        task.attempt,
        now,
        src,
        dst,
        reason=reason,
        message=message,
        host=host or task.host,
        message_id=message_id,
    )


def _failures_of(tasks: Mapping[int, TaskRow]) -> dict[int, int]:
    return {i: t.failures for i, t in tasks.items()}
