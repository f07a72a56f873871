"""A job's lifecycle: create, kill (and kill on expiry), restart, delete; and what the resource
manager does to it: admit its gangs, fail or preempt them, requeue interrupted placements."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence

from peloton.core import spec as specs
from peloton.core.records import JobRecord
from peloton.core.states import (
    JOB_TERMINAL,
    TASK_ACTIVE,
    TASK_TERMINAL,
    TASK_UNLAUNCHED,
    Goal,
    JobState,
    TaskState,
)
from peloton.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from peloton.jobmgr.work import Part, UnitOfWork, shift
from peloton.storage import jobs as repo
from peloton.v1 import job_pb2

log = logging.getLogger(__name__)

MAX_REQUEST_ID = 128
# Reason of tasks and jobs taken back by the resource manager.
PREEMPTED = "preempted"
# Reason of a job stopped because it ran longer than its max_runtime_seconds.
MAX_RUNTIME = "max_runtime_exceeded"
# Reason of tasks no set of the cluster's hosts could ever hold.
UNPLACEABLE = "unplaceable"
# Reason of an admitted gang's tasks and of its job while it waits for placement.
ADMITTED = "admitted"
# Reason of the job event of an elastic gang's new generation.
RESIZED = "resized"


class Lifecycle(Part):
    """Creates, kills, restarts, preempts and deletes jobs."""

    # ------------------------------------------------------------------ create

    def create_job(
        self, spec: job_pb2.JobSpec, request_id: str = "", owner: str = ""
    ) -> tuple[JobRecord, bool]:
        """Validate and persist a job with its tasks, created by ``owner``; idempotent on
        ``request_id``.

        Returns the job and whether it was created now (False: an earlier request made it).
        """
        ctx = self._ctx
        if len(request_id) > MAX_REQUEST_ID:
            raise InvalidArgument("request_id", f"is longer than {MAX_REQUEST_ID} characters")
        full = specs.with_defaults(spec)
        specs.validate_job_spec(full)
        if ctx.scheduler is not None:
            ctx.scheduler.check_pool(full.pool)
        if request_id:
            existing = self._job_for_request(request_id, full, owner)
            if existing is not None:
                return existing, False
        job_id = str(uuid.uuid4())
        try:
            with ctx.db.writing() as session:
                job = repo.insert_job(
                    session,
                    job_id=job_id,
                    spec=full,
                    request_id=request_id or None,
                    now=ctx.clock(),
                    task_state=TaskState.PENDING,
                    job_state=JobState.PENDING,
                    owner=owner,
                )
        except repo.RequestIdTaken:
            # Another request with the same id won the race; answer as it did.
            existing = self._job_for_request(request_id, full, owner)
            if existing is None:
                raise
            return existing, False
        ctx.after_commit(job_id)
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

    def _job_for_request(
        self, request_id: str, spec: job_pb2.JobSpec, owner: str
    ) -> JobRecord | None:
        with self._ctx.db.reading() as session:
            job_id = repo.job_id_for_request(session, request_id)
            if job_id is None:
                return None
            job = repo.get_job(session, job_id)
        if job is None:
            return None
        if job.owner != owner:
            # A request id names one caller's request: another's must not reach its job.
            raise AlreadyExists(f"request_id {request_id!r} was used by another caller")
        if repo.spec_to_bytes(job.spec) != repo.spec_to_bytes(spec):
            raise AlreadyExists(
                f"request_id {request_id!r} was used for job {job.id} with a different spec"
            )
        return job

    # ------------------------------------------------------------------ kill, restart, delete

    def kill_job(self, job_id: str, message: str = "", *, reason: str = "killed") -> JobRecord:
        """Kill every task: unlaunched ones at once, launched ones through the host manager
        (SIGTERM, the job's kill grace, SIGKILL)."""
        message = message or "killed by user"
        with self._ctx.job(job_id) as work:
            if work.state in JOB_TERMINAL:
                raise FailedPrecondition(f"job {job_id} is already {work.state}; nothing to kill")
            if work.goal == Goal.KILL:
                return work.record()
            work.move(
                TASK_UNLAUNCHED, TaskState.KILLED, reason=reason, message=message, goal=Goal.KILL
            )
            # Tasks already KILLING for a restart must now stay killed: no new attempt.
            work.set_goal({TaskState.KILLING}, Goal.KILL)
            to_kill = work.stop_running(reason, message, Goal.KILL)
            work.derive(goal=Goal.KILL, reason=reason, message=message)
            job = work.record()
        self._done(work, to_kill)
        log.info(
            "job kill requested",
            extra={"job_id": job_id, "tasks_to_stop": len(to_kill), "reason": reason},
        )
        return job

    def expire_jobs(self) -> list[str]:
        """Kill every job that has run longer than its ``max_runtime_seconds`` (counted from
        its first task start, restarts included). Returns the jobs it killed."""
        now = self._ctx.clock()
        with self._ctx.db.reading() as session:
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
        reason = "restarted"
        with self._ctx.job(job_id) as work:
            if work.state == JobState.KILLING:
                raise FailedPrecondition(f"job {job_id} is KILLING; restart it once it is KILLED")
            if work.state == JobState.PENDING:
                raise FailedPrecondition(f"job {job_id} is PENDING; no task has started yet")
            work.renew(TASK_TERMINAL, reason=reason, message=message, reset_failures=True)
            to_kill = work.stop_running(reason, message, Goal.RESTART)
            # A new run: the gang's failures, backoff and runtime limit start over.
            work.note(gang_failures=0, not_before=None, deadline_at=None)
            work.derive(goal=Goal.RUN, reason=reason, message=message)
            job = work.record()
        self._done(work, to_kill)
        log.info("job restarted", extra={"job_id": job_id})
        return job

    def delete_job(self, job_id: str) -> None:
        """Delete a job that has ended, with its tasks and history."""
        with self._ctx.job(job_id) as work:
            if work.state not in JOB_TERMINAL:
                raise FailedPrecondition(
                    f"job {job_id} is {work.state}; only SUCCEEDED, FAILED or KILLED jobs can "
                    "be deleted"
                )
            repo.delete_job(work.session, job_id)
        self._ctx.events.publish(job_id)
        log.info("job deleted", extra={"job_id": job_id})

    # ------------------------------------------------------------------ scheduling

    def admit_pending(self, gangs: Sequence[tuple[str, int, str]]) -> list[tuple[int, ...]]:
        """Admit gangs, each ``(job_id, count, message)``: move the ``count`` lowest PENDING
        instances of the job to READY, all or none, in one transaction for all of them. Returns
        each gang's instance ids, in order (empty for a job that no longer has that many PENDING
        tasks, e.g. it was killed or deleted meanwhile).

        A cycle's gangs share the statements (the jobs locked and their PENDING tasks read in
        one each, then one per kind of change): statements per gang made an admission wait on
        the database, and on the interpreter after each answer, for seconds under load."""
        with self._ctx.db.writing() as session:
            self._ctx.fenced(session)
            works = self._ctx.lock_many(session, (job_id for job_id, _, _ in gangs))
            pending = repo.tasks_in(session, works, TaskState.PENDING)
            chosen = [_take(works.get(j), pending.get(j, []), n) for j, n, _ in gangs]
            _admit(session, works, [(j, m) for j, _, m in gangs], chosen)
        for job_id in dict.fromkeys(job_id for job_id, _, _ in gangs):
            self._ctx.after_commit(job_id)
        return [tuple(instance for instance, _, _ in tasks) for tasks in chosen]

    def set_pending_reason(self, job_id: str, reason: str, message: str) -> None:
        """Say why a PENDING job waits (GetJob shows it); no-op for other states."""
        self.set_pending_reasons({job_id: (reason, message)})

    def set_pending_reasons(self, reasons: Mapping[str, tuple[str, str]]) -> None:
        """Say why each PENDING job waits, ``{job_id: (reason, message)}``, in one transaction
        (a scheduling cycle explains every job it looked at: one commit, not one per job);
        jobs in other states are left alone."""
        changed: list[str] = []
        with self._ctx.db.writing() as session:
            self._ctx.fenced(session)
            for job_id in sorted(reasons):  # locked in one order: no deadlock with another
                work = self._ctx.lock(session, job_id)
                if (
                    work.state != JobState.PENDING
                    or (work.row.reason, work.row.message) == (reasons[job_id])
                ):
                    continue
                # Not a change of state or spec: the version (optimistic concurrency) stays.
                reason, message = reasons[job_id]
                work.note(reason=reason, message=message)
                changed.append(job_id)
        for job_id in changed:
            self._ctx.events.publish(job_id)

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
        with self._ctx.job(job_id) as work:
            self._ctx.fenced(work.session)
            work.move(states, TaskState.FAILED, reason=reason, message=message, goal=Goal.RUN)
            work.derive(reason=reason, message=message)
            job = work.record()
        self._ctx.after_commit(job_id)
        log.info("job gang infeasible", extra={"job_id": job_id, "reason": message})
        return job

    def preempt(self, job_id: str, message: str, count: int = 0) -> JobRecord:
        """Take a job's admitted tasks back: unlaunched ones return to PENDING at once;
        launched ones are killed (PREEMPTING: SIGTERM, the job's grace, SIGKILL) and start a new
        PENDING attempt when they have ended. The job is requeued, not failed.

        ``count`` > 0 shrinks an elastic gang by that many tasks instead of taking the whole
        gang: unlaunched ones first, then the running ones of the highest instances (the gang's
        first ranks, which hold its state, stay)."""
        with self._ctx.job(job_id) as work:
            self._ctx.fenced(work.session)
            unlaunched = {TaskState.READY, TaskState.PLACING, TaskState.PLACED}
            running = TASK_ACTIVE - {TaskState.KILLING, TaskState.PREEMPTING}
            back: Sequence[int] | None = None
            stop: Sequence[int] | None = None
            if count:
                back = _highest(work.instances(unlaunched), count)
                stop = _highest(work.instances(running), count - len(back))
            work.move(
                unlaunched,
                TaskState.PENDING,
                reason=PREEMPTED,
                message=message,
                goal=Goal.RUN,
                instances=back,
            )
            before = set(work.attempts({TaskState.PREEMPTING}))
            work.move(
                running,
                TaskState.PREEMPTING,
                reason=PREEMPTED,
                message=message,
                goal=Goal.RESTART,
                instances=stop,
            )
            to_kill = work.attempts({TaskState.PREEMPTING})
            drained = [a for a in to_kill if a not in before]
            work.derive(reason=PREEMPTED, message=message)
            job = work.record()
        if count and self._ctx.elastic is not None:
            # Before the kill: the ranks hear it from their endpoint and commit, then leave.
            self._ctx.elastic.drain(job_id, drained, message)
        self._done(work, to_kill)
        log.info(
            "job preempted",
            extra={"job_id": job_id, "reason": message, "tasks": count or "all"},
        )
        return job

    def record_generation(self, job_id: str, generation: int, size: int, message: str) -> None:
        """An elastic gang's membership changed: store its generation and size, with a job
        event (reason ``resized``, ``message`` saying how and why) that `job watch` shows."""
        with self._ctx.job(job_id) as work:
            if generation <= work.row.generation:
                return  # an older generation reported late
            work.note(generation=generation, gang_size=size)
            repo.insert_events(
                work.session,
                [
                    {
                        "job_id": job_id,
                        "instance_id": None,
                        "time": work.now,
                        "from_state": work.state.value,
                        "to_state": work.state.value,
                        "reason": RESIZED,
                        "message": message,
                    }
                ],
            )
        self._ctx.events.publish(job_id)
        log.info(
            "elastic gang resized",
            extra={"job_id": job_id, "generation": generation, "size": size, "why": message},
        )

    def requeue_placements(self) -> list[str]:
        """Send tasks caught between placement and launch (PLACING, PLACED) back to READY, for a
        daemon that starts: their host leases died with the previous one. Returns the jobs."""
        with self._ctx.db.reading() as session:
            job_ids = repo.jobs_with_tasks_in(session, {TaskState.PLACING, TaskState.PLACED})
        for job_id in job_ids:
            with self._ctx.job(job_id) as work:
                work.move(
                    {TaskState.PLACING, TaskState.PLACED},
                    TaskState.READY,
                    reason="requeued",
                    message="placement was interrupted by a daemon restart",
                    goal=Goal.RUN,
                )
                work.derive()
            self._ctx.after_commit(job_id)
        return job_ids

    def _done(self, work: UnitOfWork, to_kill: Sequence[str]) -> None:
        """After the commit: tell who must know, stopping ``to_kill`` within the job's grace."""
        self._ctx.after_commit(work.job_id, to_kill, work.grace() if to_kill else 0)


def _highest(instances: Sequence[int], count: int) -> tuple[int, ...]:
    """The ``count`` highest of ``instances``."""
    return tuple(sorted(instances)[::-1][: max(0, count)])


def _take(
    work: UnitOfWork | None, pending: list[tuple[int, int, str]], count: int
) -> list[tuple[int, int, str]]:
    """A gang's ``count`` lowest PENDING tasks, taken from the job's ``pending`` (a job's next
    gang gets the next ones); none if the job is gone, killed or has fewer."""
    if work is None or work.goal == Goal.KILL or len(pending) < count:
        return []
    taken = pending[:count]
    del pending[:count]
    return taken


def _admit(
    session: repo.Tx,
    works: Mapping[str, UnitOfWork],
    gangs: Sequence[tuple[str, str]],
    chosen: Sequence[Sequence[tuple[int, int, str]]],
) -> None:
    """PENDING -> READY for the ``chosen`` tasks of each gang, ``(job_id, message)``, with an
    event each and the jobs' counts, reasons and versions."""
    moving = [(j, m, tasks) for (j, m), tasks in zip(gangs, chosen, strict=True) if tasks]
    # A message that several tasks get is stored once, as a bulk move stores it.
    shared = iter(repo.shared_messages(session, [(j, m) for j, m, t in moving if _shares(m, t)]))
    events: list[dict[str, object]] = []
    for job_id, message, tasks in moving:
        work = works[job_id]
        message_id = next(shared) if _shares(message, tasks) else None
        own = "" if message_id is not None else message
        repo.change_tasks(
            session,
            ((job_id, instance) for instance, _, _ in tasks),
            state=TaskState.READY.value,
            goal=Goal.RUN.value,
            reason=ADMITTED,
            message=own,
            message_id=message_id,
            updated_at=work.now,
        )
        events.extend(
            repo.task_event(
                job_id,
                instance,
                attempt,
                work.now,
                TaskState.PENDING,
                TaskState.READY,
                reason=ADMITTED,
                message=own,
                host=host,
                message_id=message_id,
            )
            for instance, attempt, host in tasks
        )
        shift(work.counts, {TaskState.PENDING: len(tasks)}, TaskState.READY)
    repo.insert_events(session, events)
    last = {job_id: message for job_id, message, _ in moving}
    for job_id, message in last.items():
        work = works[job_id]
        work.derive()
        if work.state == JobState.PENDING:
            # Written with the commit, every job's row in one statement.
            work.update(flush=False, reason=ADMITTED, message=message, updated_at=work.now)


def _shares(message: str, tasks: Sequence[object]) -> bool:
    return bool(message) and len(tasks) > 1
