"""The simulator's job ledger: jobs and tasks in memory, the job manager's state rules, no
database.

:class:`SimLedger` implements :class:`peloton.core.ledger.SchedulingLedger` (what the
production :class:`~peloton.resmgr.manager.ResourceManager` reads and writes) and
:class:`peloton.core.ledger.PoolStore` through :class:`SimPoolStore`, plus the few changes the
simulator's loop makes itself in place of the launcher and Mesos: :meth:`SimLedger.launch`
(READY -> PLACING -> PLACED -> LAUNCHING -> RUNNING at once), :meth:`SimLedger.finish`
(RUNNING -> SUCCEEDED), :meth:`SimLedger.stop_preempted` (PREEMPTING -> KILLED and a new
PENDING attempt: the simulated kill is instant) and :meth:`SimLedger.fail_unplaceable`.

Every change is checked against :mod:`peloton.core.states` before anything is written (an
illegal one raises :class:`~peloton.errors.FailedPrecondition` and changes nothing), the job's
state is derived from its tasks' with :func:`~peloton.core.states.derive_job_state` and that
change checked against the job table; then the scheduler is told the job changed and preempted
attempts are handed to the killer (after the change, never before).

Lean on purpose (it is on the simulator's hot path): a task is its state, goal and attempt
number, a job keeps its task counts up to date as tasks move, and no events or attempt history
are kept. Elastic gangs are not simulated beyond :meth:`preempt`'s ``count`` (the highest
instances are taken). Times are the simulator's virtual clock (epoch seconds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from peloton.core.ledger import PoolStore, SchedulingLedger
from peloton.core.pools import PoolConfig
from peloton.core.records import JobRecord
from peloton.core.spec import is_elastic
from peloton.core.states import (
    JOB_TERMINAL,
    TASK_ACTIVE,
    TASK_UNLAUNCHED,
    Goal,
    JobState,
    TaskState,
    check_job_transition,
    check_new_attempt,
    check_task_transition,
    derive_job_state,
)
from peloton.errors import AlreadyExists, NotFound
from peloton.v1 import job_pb2

T = TaskState
# Job reasons, as the job manager writes them (peloton.jobmgr.lifecycle).
PREEMPTED = "preempted"
UNPLACEABLE = "unplaceable"
_UNLAUNCHED_ADMITTED = frozenset({T.READY, T.PLACING, T.PLACED})
_RUNNING = TASK_ACTIVE - {T.KILLING, T.PREEMPTING}
# The launcher's path from admitted to running, every step checked (Mesos may skip updates:
# LAUNCHING -> RUNNING is in the table).
_LAUNCH_PATH = (T.PLACING, T.PLACED, T.LAUNCHING, T.RUNNING)


@dataclass(eq=False)
class _Job:
    id: str
    spec: job_pb2.JobSpec
    created_at: float
    updated_at: float
    states: list[TaskState]
    goals: list[Goal]
    attempts: list[int]
    counts: dict[TaskState, int]
    state: JobState = JobState.PENDING
    goal: Goal = Goal.RUN
    reason: str = ""
    message: str = ""
    version: int = 1
    elastic: bool = False
    hosts: list[str] = field(default_factory=list)

    def in_states(self, states: Iterable[TaskState]) -> list[int]:
        wanted = states if isinstance(states, (set, frozenset)) else set(states)
        return [i for i, s in enumerate(self.states) if s in wanted]

    def record(self) -> JobRecord:
        return JobRecord(
            id=self.id,
            spec=self.spec,
            state=self.state,
            goal=self.goal,
            reason=self.reason,
            message=self.message,
            created_at=_at(self.created_at),
            updated_at=_at(self.updated_at),
            version=self.version,
            task_counts={s: n for s, n in self.counts.items() if n},
        )


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class SimLedger:
    """Jobs and tasks in dicts. ``clock``: the virtual time in epoch seconds (the same clock
    the resource manager is given). Single-threaded, like the simulator."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._jobs: dict[str, _Job] = {}
        self._unfinished: dict[str, _Job] = {}  # in creation order
        self._ending: list[_Job] = []  # ended by the change being made, told after it
        # Changes made (the scheduler was told of each), and preemptions asked, so far.
        self.changes = 0
        self.preemptions = 0
        self._changed: Callable[[str], None] = lambda _job_id: None
        self._killer: Callable[[str, tuple[int, ...]], None] = lambda _job_id, _ids: None
        self._admitted: Callable[[], None] = lambda: None
        self._ended: Callable[[JobRecord], None] = lambda _job: None
        self._reasons: Callable[[Mapping[str, tuple[str, str]]], None] = lambda _reasons: None

    def set_scheduler(self, job_changed: Callable[[str], None]) -> None:
        """Who is told that a job changed (the resource manager's ``job_changed``)."""
        self._changed = job_changed

    def set_killer(self, kill: Callable[[str, tuple[int, ...]], None]) -> None:
        """Who is handed a job's instances that must stop (PREEMPTING), after the change."""
        self._killer = kill

    def set_admission_listener(self, listener: Callable[[], None]) -> None:
        """Who is told that gangs were admitted (after the change)."""
        self._admitted = listener

    def set_end_listener(self, listener: Callable[[JobRecord], None]) -> None:
        """Who is told of every job that ended (SUCCEEDED, FAILED, KILLED), after the change."""
        self._ended = listener

    def set_reason_listener(
        self, listener: Callable[[Mapping[str, tuple[str, str]]], None]
    ) -> None:
        """Who is shown every batch of pending reasons written (the simulator watches for
        waits that preemption may end)."""
        self._reasons = listener

    # ------------------------------------------------------------------ set-up and reads

    def create_job(self, job_id: str, spec: job_pb2.JobSpec) -> JobRecord:
        """A job of ``spec`` (defaults filled in and validated by the caller), every task
        PENDING."""
        if job_id in self._jobs:
            raise AlreadyExists(f"job {job_id} already exists")
        now = self._clock()
        n = spec.instances
        job = _Job(
            id=job_id,
            spec=spec,
            created_at=now,
            updated_at=now,
            states=[T.PENDING] * n,
            goals=[Goal.RUN] * n,
            attempts=[1] * n,
            counts={T.PENDING: n},
            elastic=is_elastic(spec),
            hosts=[""] * n,
        )
        self._jobs[job_id] = self._unfinished[job_id] = job
        self._tell(job_id)
        return job.record()

    def get_job(self, job_id: str) -> JobRecord:
        return self._require(job_id).record()

    def get_jobs(self, job_ids: Iterable[str]) -> list[JobRecord]:
        jobs = self._jobs
        return [jobs[j].record() for j in sorted(set(job_ids)) if j in jobs]

    def unfinished_jobs(self) -> list[JobRecord]:
        return [j.record() for j in self._unfinished.values()]

    def instances(self, job_id: str, states: Iterable[TaskState]) -> tuple[int, ...]:
        job = self._jobs.get(job_id)
        return () if job is None else tuple(job.in_states(states))

    def attempts(self, job_id: str, states: Iterable[TaskState]) -> dict[int, int]:
        job = self._jobs.get(job_id)
        if job is None:
            return {}
        return {i: job.attempts[i] for i in job.in_states(states)}

    def hosts(self, job_id: str) -> list[str]:
        """Where each task of a job was last placed, by instance ("" if never)."""
        return list(self._require(job_id).hosts)

    def task_states(self, job_id: str) -> list[TaskState]:
        return list(self._require(job_id).states)

    def has_unfinished(self) -> bool:
        return bool(self._unfinished)

    def unfinished_by_pool(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for job in self._unfinished.values():
            out[job.spec.pool] = out.get(job.spec.pool, 0) + 1
        return out

    # ------------------------------------------------------------------ SchedulingLedger

    def admit_pending(self, gangs: Sequence[tuple[str, int, str]]) -> list[tuple[int, ...]]:
        admitted: list[tuple[int, ...]] = []
        touched: list[str] = []
        for job_id, count, message in gangs:
            job = self._require(job_id)
            ids = tuple(job.in_states((T.PENDING,))[:count])
            if job.goal == Goal.KILL or len(ids) < count:
                admitted.append(())
                continue
            self._move(job, ids, T.READY, Goal.RUN)
            self._derive(job)
            if job.state == JobState.PENDING:
                job.reason, job.message = "admitted", message
            admitted.append(ids)
            touched.append(job_id)
        for job_id in dict.fromkeys(touched):
            self._tell(job_id)
        if touched:
            self._admitted()
        return admitted

    def set_pending_reasons(self, reasons: Mapping[str, tuple[str, str]]) -> None:
        for job_id, (reason, message) in reasons.items():
            job = self._require(job_id)
            if job.state == JobState.PENDING:
                job.reason, job.message = reason, message
        self._reasons(reasons)

    def fail_pending(self, job_id: str, reason: str, message: str) -> JobRecord:
        return self._fail_waiting(job_id, (T.PENDING,), reason, message)

    def fail_unplaceable(self, job_id: str, message: str) -> JobRecord:
        """Fail a job's tasks that wait to run (PENDING or READY): no set of the cluster's
        hosts could ever hold their gang."""
        return self._fail_waiting(job_id, (T.PENDING, T.READY), UNPLACEABLE, message)

    def preempt(self, job_id: str, message: str, count: int = 0) -> JobRecord:
        job = self._require(job_id)
        self.preemptions += 1
        back = job.in_states(_UNLAUNCHED_ADMITTED)
        stop = job.in_states(_RUNNING)
        if count:
            back = sorted(back, reverse=True)[:count]
            stop = sorted(stop, reverse=True)[: max(0, count - len(back))]
        self._check(job, back, T.PENDING)
        self._check(job, stop, T.PREEMPTING)
        self._move(job, back, T.PENDING, Goal.RUN, checked=True)
        self._move(job, stop, T.PREEMPTING, Goal.RESTART, checked=True)
        self._derive(job, PREEMPTED, message)
        record = job.record()
        self._tell(job_id)
        stopping = tuple(job.in_states((T.PREEMPTING,)))
        if stopping:
            self._killer(job_id, stopping)
        return record

    def requeue_placements(self) -> list[str]:
        requeued = []
        for job in list(self._unfinished.values()):
            ids = job.in_states((T.PLACING, T.PLACED))
            if ids:
                self._move(job, ids, T.READY, Goal.RUN)
                self._derive(job)
                requeued.append(job.id)
                self._tell(job.id)
        return requeued

    # ------------------------------------------------------------------ the simulated cluster

    def launch(self, job_id: str, instances: Sequence[int], hosts: Sequence[str]) -> JobRecord:
        """A placed gang starts: its READY tasks go PLACING -> PLACED -> LAUNCHING -> RUNNING
        (each step checked), on ``hosts`` by rank."""
        job = self._require(job_id)
        for to in _LAUNCH_PATH:
            self._check(job, instances, to)
            self._move(job, instances, to, Goal.RUN, checked=True)
        for i, host in zip(instances, hosts, strict=True):
            job.hosts[i] = host
        self._derive(job)
        self._tell(job_id)
        return job.record()

    def finish(self, job_id: str, instances: Sequence[int]) -> JobRecord:
        """Tasks that ran to the end: RUNNING -> SUCCEEDED."""
        job = self._require(job_id)
        self._move(job, instances, T.SUCCEEDED, Goal.RUN)
        self._derive(job)
        self._tell(job_id)
        return job.record()

    def stop_preempted(self, job_id: str, instances: Sequence[int]) -> JobRecord:
        """The killer's report: the PREEMPTING tasks ended (KILLED) and, their goal being a
        restart, each starts a new attempt at PENDING."""
        job = self._require(job_id)
        ids = [i for i in instances if job.states[i] == T.PREEMPTING]
        self._move(job, ids, T.KILLED, Goal.RESTART)
        for i in ids:
            check_new_attempt(job.states[i])
            job.attempts[i] += 1
            self._set(job, i, T.PENDING, Goal.RUN)
            job.hosts[i] = ""
        self._derive(job, PREEMPTED, job.message)
        self._tell(job_id)
        return job.record()

    def kill(self, job_id: str, reason: str, message: str) -> JobRecord:
        """Kill a job at once (the simulated kill takes no time): tasks not launched go
        KILLED, running ones KILLING then KILLED; the job ends KILLED."""
        job = self._require(job_id)
        unlaunched = job.in_states(TASK_UNLAUNCHED)
        active = job.in_states(TASK_ACTIVE - {T.KILLING})
        self._check(job, unlaunched, T.KILLED)
        self._check(job, active, T.KILLING)
        job.goal = Goal.KILL
        self._move(job, unlaunched, T.KILLED, Goal.KILL, checked=True)
        self._move(job, active, T.KILLING, Goal.KILL, checked=True)
        self._derive(job, reason, message)
        self._move(job, job.in_states((T.KILLING,)), T.KILLED, Goal.KILL)
        self._derive(job, reason, message)
        self._tell(job_id)
        return job.record()

    # ------------------------------------------------------------------ the rules

    def _fail_waiting(
        self, job_id: str, states: Iterable[TaskState], reason: str, message: str
    ) -> JobRecord:
        job = self._require(job_id)
        self._move(job, job.in_states(states), T.FAILED, Goal.RUN)
        self._derive(job, reason, message)
        self._tell(job_id)
        return job.record()

    @staticmethod
    def _check(job: _Job, instances: Iterable[int], to: TaskState) -> None:
        for i in instances:
            check_task_transition(job.states[i], to)

    def _move(
        self,
        job: _Job,
        instances: Sequence[int],
        to: TaskState,
        goal: Goal,
        *,
        checked: bool = False,
    ) -> None:
        """Move tasks to ``to``, all or none: every transition is checked before any is made."""
        if not checked:
            self._check(job, instances, to)
        for i in instances:
            self._set(job, i, to, goal)

    @staticmethod
    def _set(job: _Job, i: int, to: TaskState, goal: Goal) -> None:
        counts = job.counts
        before = job.states[i]
        counts[before] -= 1
        counts[to] = counts.get(to, 0) + 1
        job.states[i], job.goals[i] = to, goal
        job.version += 1

    def _derive(self, job: _Job, reason: str = "", message: str = "") -> None:
        new = derive_job_state(job.counts, job.goal, elastic=job.elastic)
        job.updated_at = self._clock()
        if new == job.state:
            if reason:
                job.reason, job.message = reason, message
            return
        check_job_transition(job.state, new)
        job.state = new
        if reason:
            job.reason, job.message = reason, message
        elif new != JobState.FAILED:
            job.reason, job.message = "", ""
        if new in JOB_TERMINAL:
            self._unfinished.pop(job.id, None)
            self._ending.append(job)
        elif job.id not in self._unfinished:
            self._unfinished[job.id] = job

    def _tell(self, job_id: str) -> None:
        """After a change: the scheduler hears the job changed, the end listener of jobs that
        ended."""
        self.changes += 1
        self._changed(job_id)
        ending, self._ending = self._ending, []
        for job in ending:
            self._ended(job.record())

    def _require(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        return job


class SimPoolStore:
    """Pool configurations in a dict; unfinished jobs counted from a :class:`SimLedger`."""

    def __init__(self, ledger: SimLedger, pools: Iterable[PoolConfig] = ()) -> None:
        self._ledger = ledger
        self._pools: dict[str, PoolConfig] = {p.path: p for p in pools}

    def all_pools(self) -> list[PoolConfig]:
        return [self._pools[p] for p in sorted(self._pools)]

    def insert_pool(self, config: PoolConfig, now: datetime) -> None:
        self._pools[config.path] = config

    def update_pool(self, config: PoolConfig, now: datetime) -> None:
        self._pools[config.path] = config

    def delete_pool(self, path: str) -> None:
        self._pools.pop(path, None)

    def unfinished_jobs_by_pool(self) -> dict[str, int]:
        return self._ledger.unfinished_by_pool()


def _conforms(ledger: SimLedger, pools: SimPoolStore) -> tuple[SchedulingLedger, PoolStore]:
    """Checked by mypy: the ledger and the pool store satisfy the protocols the resource
    manager is built on."""
    return ledger, pools
