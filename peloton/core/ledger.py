"""What the components need of the job manager: the job ledger, one protocol per consumer;
and what the resource manager keeps in storage besides (its pools).

The job manager (:class:`peloton.jobmgr.manager.JobManager`) keeps every job's and task's state
and checks each change against the state tables; the other components change that state only
through it. Each of them sees it through the small protocol below that names what it uses, so it
depends on this module, not on the job manager, and its tests can run on an in-memory ledger
(``tests/ledger_memory.py``) instead of a database.

What every implementation promises (the job manager's docstrings say it in full):

- a change is all or nothing, checked against :mod:`peloton.core.states` (an illegal one raises
  :class:`~peloton.errors.FailedPrecondition` and changes nothing), and the job's state is
  derived from its tasks' afterwards;
- once a change is made, the scheduler is told the job changed and attempts that must stop are
  handed to the task killer (after the change, never before);
- an update for an attempt that is no longer current is ignored;
- a job that does not exist raises :class:`~peloton.errors.NotFound` (reads of several jobs
  leave it out).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Protocol

from peloton.core.pools import PoolConfig
from peloton.core.records import EventRecord, JobRecord, Placement, TaskRecord, TaskUpdate
from peloton.core.states import TaskState


class SchedulingLedger(Protocol):
    """What the resource manager needs: read jobs, admit gangs, fail, preempt, explain."""

    def unfinished_jobs(self) -> list[JobRecord]:
        """Every job that has not ended (the resource manager rebuilds its state from them)."""
        ...

    def get_jobs(self, job_ids: Iterable[str]) -> list[JobRecord]:
        """The jobs of ``job_ids`` that exist (deleted ones are left out)."""
        ...

    def instances(self, job_id: str, states: Iterable[TaskState]) -> tuple[int, ...]:
        """The instance ids of a job's tasks in ``states``, ascending."""
        ...

    def admit_pending(self, gangs: Sequence[tuple[str, int, str]]) -> list[tuple[int, ...]]:
        """Admit gangs, each ``(job_id, count, message)``: the ``count`` lowest PENDING
        instances move to READY, all or none. Returns each gang's instance ids in order (empty
        for a job being killed or with fewer PENDING tasks than that)."""
        ...

    def set_pending_reasons(self, reasons: Mapping[str, tuple[str, str]]) -> None:
        """Say why each PENDING job waits, ``{job_id: (reason, message)}``, in one write; jobs
        in another state are left alone."""
        ...

    def fail_pending(self, job_id: str, reason: str, message: str) -> JobRecord:
        """Fail a job's PENDING tasks: their gang can never be admitted."""
        ...

    def preempt(self, job_id: str, message: str, count: int = 0) -> JobRecord:
        """Take a job's admitted tasks back: unlaunched ones return to PENDING, launched ones
        are killed (PREEMPTING) and start a new PENDING attempt once they have ended.
        ``count`` > 0: shrink an elastic gang by that many tasks (unlaunched ones first, then
        those of the highest instances), not the whole gang."""
        ...

    def requeue_placements(self) -> list[str]:
        """Send tasks caught between placement and launch (PLACING, PLACED) back to READY (a
        daemon that starts: the leases died with the previous one). Returns their jobs."""
        ...


class TaskUpdates(Protocol):
    """Applying reported task state changes (the launcher's records, Mesos status updates)."""

    def update_tasks(self, job_id: str, updates: Sequence[TaskUpdate]) -> JobRecord:
        """Apply changes to tasks of one job, in one write: stale attempts are ignored, an
        illegal transition raises FailedPrecondition and writes nothing, and a failure of a
        task that should run follows the job's restart rules (:mod:`peloton.jobmgr.restarts`)."""
        ...


class LaunchLedger(TaskUpdates, Protocol):
    """What the launcher needs: the attempts it launches, their records, unplaceable gangs."""

    def record_launches(self, gangs: Mapping[str, Mapping[int, Placement]]) -> dict[str, str]:
        """READY -> PLACING -> PLACED -> LAUNCHING of each task of placed gangs (job id ->
        instance id -> where its attempt is launched; one gang per job), an event per step,
        in one write, as :meth:`update_tasks` of
        :func:`~peloton.core.records.launch_updates` would for each. Returns the gangs refused
        (job id -> why), nothing of them written: a task no longer READY in the attempt placed
        (taken back meanwhile), or the job gone."""
        ...

    def attempts(self, job_id: str, states: Iterable[TaskState]) -> dict[int, int]:
        """The current attempt number of each of a job's tasks in ``states``, by instance id
        (empty for a job that does not exist)."""
        ...

    def ready_attempts(self, job_ids: Iterable[str]) -> dict[str, dict[int, int]]:
        """The current attempt number of each READY task of the jobs, by job and instance id,
        in one read (a job with none, or that does not exist, is left out)."""
        ...

    def fail_unplaceable(self, job_id: str, message: str) -> JobRecord:
        """Fail a job's tasks that wait to run (PENDING or READY): no set of the cluster's
        hosts could ever hold their gang."""
        ...


class HostLedger(TaskUpdates, Protocol):
    """What the host manager needs: status updates written, and a job's spec."""

    def record_progress(self, updates: Mapping[str, Sequence[TaskUpdate]]) -> list[str]:
        """Apply several jobs' updates (job id -> its updates, in order) in one write, as
        :meth:`update_tasks` of each would, where every update only moves a launched task on
        toward running (``TASK_PROGRESS``). Returns the jobs left out, with nothing of theirs
        written (a job gone, an update of another kind, or one not allowed): the caller writes
        each of them with :meth:`update_tasks`."""
        ...

    def get_job(self, job_id: str) -> JobRecord:
        """One job (NotFound if it does not exist)."""
        ...


class JobLedger(SchedulingLedger, LaunchLedger, HostLedger, Protocol):
    """Everything the components need of the job manager together (what an in-memory ledger
    implements to stand in for it)."""


class PoolStore(Protocol):
    """Where the resource manager keeps pool configurations
    (:class:`peloton.storage.pools.SqlPoolStore` on the database)."""

    def all_pools(self) -> list[PoolConfig]:
        """Every pool, by path."""
        ...

    def insert_pool(self, config: PoolConfig, now: datetime) -> None: ...

    def update_pool(self, config: PoolConfig, now: datetime) -> None: ...

    def delete_pool(self, path: str) -> None: ...

    def unfinished_jobs_by_pool(self) -> dict[str, int]:
        """How many jobs that have not ended each pool holds (pools with none left out)."""
        ...


class GenerationLedger(Protocol):
    """What elastic gangs' rendezvous endpoints need: a job, its tasks' attempts (why a rank
    left), and each new generation recorded."""

    def get_job(self, job_id: str) -> JobRecord:
        """One job (NotFound if it does not exist)."""
        ...

    def get_task(self, job_id: str, instance_id: int) -> tuple[TaskRecord, list[EventRecord]]:
        """A task with its attempt history, and its newest events."""
        ...

    def record_generation(self, job_id: str, generation: int, size: int, message: str) -> None:
        """Store an elastic gang's new generation and size with a job event saying ``message``
        (older generations reported late are ignored)."""
        ...
