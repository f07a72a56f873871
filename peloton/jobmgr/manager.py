"""The job manager: creates, reads, kills, restarts and deletes jobs, and applies task updates.

A facade made of its parts, which share a :class:`~peloton.jobmgr.work.Context`:

- :mod:`peloton.jobmgr.work`: the unit of work (one write transaction on one locked job: move
  tasks, start new attempts, derive the job's state) and who is told after a commit;
- :mod:`peloton.jobmgr.lifecycle`: create, kill, expire, restart, delete; admit, fail, preempt,
  requeue;
- :mod:`peloton.jobmgr.updates`: task updates, and the restarts failures lead to
  (:mod:`peloton.jobmgr.restarts` holds the rules);
- :mod:`peloton.jobmgr.reads`: reads of jobs, tasks and events;
- :mod:`peloton.jobmgr.events`: the event bus that wakes watchers.

Every SQL statement is in :mod:`peloton.storage.jobs`.
"""

from __future__ import annotations

from peloton.jobmgr.events import EventBus
from peloton.jobmgr.lifecycle import (
    MAX_REQUEST_ID,
    MAX_RUNTIME,
    PREEMPTED,
    UNPLACEABLE,
    Lifecycle,
)
from peloton.jobmgr.metrics import JobMetrics
from peloton.jobmgr.reads import (
    DEFAULT_PAGE_JOBS,
    DEFAULT_PAGE_TASKS,
    MAX_PAGE_JOBS,
    MAX_PAGE_TASKS,
    MAX_TASK_EVENTS,
    Reads,
)
from peloton.jobmgr.updates import TaskUpdates
from peloton.jobmgr.work import (
    Clock,
    Context,
    ElasticGangs,
    Fence,
    Scheduler,
    TaskKiller,
    utcnow,
)
from peloton.storage.db import Database

__all__ = [
    "DEFAULT_PAGE_JOBS",
    "DEFAULT_PAGE_TASKS",
    "MAX_PAGE_JOBS",
    "MAX_PAGE_TASKS",
    "MAX_REQUEST_ID",
    "MAX_RUNTIME",
    "MAX_TASK_EVENTS",
    "PREEMPTED",
    "UNPLACEABLE",
    "Clock",
    "ElasticGangs",
    "Fence",
    "JobManager",
    "Scheduler",
    "TaskKiller",
    "utcnow",
]


class JobManager(Lifecycle, TaskUpdates, Reads):
    """Jobs and tasks, their lifecycle, persisted through :mod:`peloton.storage.jobs`: its
    parts (:class:`Lifecycle`, :class:`TaskUpdates`, :class:`Reads`) over one context."""

    def __init__(
        self,
        db: Database,
        *,
        clock: Clock = utcnow,
        killer: TaskKiller | None = None,
        events: EventBus | None = None,
        metrics: JobMetrics | None = None,
    ) -> None:
        super().__init__(Context(db, clock, killer, events or EventBus(), metrics or JobMetrics()))
        self.metrics = self._ctx.metrics
        self.events = self._ctx.events

    def set_killer(self, killer: TaskKiller) -> None:
        self._ctx.killer = killer

    def set_scheduler(self, scheduler: Scheduler) -> None:
        self._ctx.scheduler = scheduler

    def set_elastic(self, elastic: ElasticGangs) -> None:
        self._ctx.elastic = elastic

    def set_fence(self, fence: Fence) -> None:
        """Refuse the scheduler's writes (admissions, placements, preemptions...) once this
        daemon no longer leads (several daemons); the API's writes are every daemon's."""
        self._ctx.fence = fence
