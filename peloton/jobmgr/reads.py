"""Reads of jobs, tasks and events, each in one read transaction."""

from __future__ import annotations

from collections.abc import Iterable

from peloton.core import spec as specs
from peloton.core.records import EventRecord, JobFilter, JobRecord, TaskRecord
from peloton.core.states import TaskState
from peloton.errors import InvalidArgument, NotFound
from peloton.jobmgr.work import Part
from peloton.storage import jobs as repo

MAX_PAGE_JOBS = 1000
DEFAULT_PAGE_JOBS = 100
MAX_PAGE_TASKS = 10_000
DEFAULT_PAGE_TASKS = 1000
# Most events GetTask reads of a task (the newest; its answer may keep fewer, by size).
MAX_TASK_EVENTS = 10_000


class Reads(Part):
    """What the API and the other components read of jobs."""

    def get_job(self, job_id: str) -> JobRecord:
        with self._ctx.db.reading() as session:
            job = repo.get_job(session, job_id)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        return job

    def get_jobs(self, job_ids: Iterable[str]) -> list[JobRecord]:
        """The jobs of ``job_ids`` that exist, in one read."""
        with self._ctx.db.reading() as session:
            return repo.get_jobs(session, job_ids)

    def list_jobs(
        self, flt: JobFilter, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[JobRecord], str]:
        size = _page_size(page_size, DEFAULT_PAGE_JOBS, MAX_PAGE_JOBS)
        with self._ctx.db.reading() as session:
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
        with self._ctx.db.reading() as session:
            row = repo.get_task_row(session, job_id, instance_id)
            if row is None:
                _require_job(session, job_id)
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
        with self._ctx.db.reading() as session:
            _require_job(session, job_id)
            return repo.list_tasks(session, job_id, states, size, page_token)

    def job_events(self, job_id: str, after: int = 0, limit: int = 1000) -> list[EventRecord]:
        with self._ctx.db.reading() as session:
            _require_job(session, job_id)
            return repo.events(session, job_id, after=after, limit=limit)

    def newest_event(self) -> int:
        """The sequence of the newest event of any job (0: none yet)."""
        with self._ctx.db.reading() as session:
            return repo.newest_event(session)

    def jobs_changed_after(self, sequence: int) -> dict[str, int]:
        """The jobs with events after ``sequence``, whichever daemon wrote them, each with its
        newest event's sequence (see :class:`peloton.core.eventpoll.EventPoll`)."""
        with self._ctx.db.reading() as session:
            return repo.jobs_with_events_after(session, sequence)

    def unfinished_jobs(self) -> list[JobRecord]:
        """Every job that has not ended (what the resource manager rebuilds its state from)."""
        with self._ctx.db.reading() as session:
            return repo.unfinished_jobs(session)

    def instances(self, job_id: str, states: Iterable[TaskState]) -> tuple[int, ...]:
        """The instance ids of a job's tasks in ``states``, ascending."""
        with self._ctx.db.reading() as session:
            return repo.instances_in(session, job_id, states, limit=specs.MAX_INSTANCES)

    def attempts(self, job_id: str, states: Iterable[TaskState]) -> dict[int, int]:
        """The current attempt number of each of a job's tasks in ``states``, by instance id
        (empty for a job that does not exist)."""
        with self._ctx.db.reading() as session:
            return repo.attempts_in(session, job_id, states)

    def ready_attempts(self, job_ids: Iterable[str]) -> dict[str, dict[int, int]]:
        """The current attempt of each READY task of the jobs, by job and instance id, in one
        read (the launcher reads a round's gangs at once: a read per gang was a tenth of the
        launch path)."""
        with self._ctx.db.reading() as session:
            ready = repo.tasks_in(session, job_ids, TaskState.READY)
        return {j: {i: attempt for i, attempt, _ in tasks} for j, tasks in ready.items()}


def _require_job(session: repo.Tx, job_id: str) -> None:
    if not repo.job_exists(session, job_id):
        raise NotFound(f"job {job_id} not found")


def _page_size(requested: int, default: int, maximum: int) -> int:
    if requested == 0:
        return default
    if requested < 0 or requested > maximum:
        raise InvalidArgument("page_size", f"must be between 1 and {maximum}")
    return requested
