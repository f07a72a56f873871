"""Plain records the job manager hands out: what a job, a task, an attempt and an event are."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from peloton.core.states import JOB_TERMINAL, Goal, JobState, TaskState
from peloton.v1 import job_pb2


def attempt_id(job_id: str, instance_id: int, attempt: int) -> str:
    """The id of one attempt of a task; also its Mesos task id."""
    return f"{job_id}-{instance_id}-{attempt}"


def parse_attempt_id(task_id: str) -> tuple[str, int, int] | None:
    """(job_id, instance, attempt) of a Mesos task id made by :func:`attempt_id`; None if it
    is not one of peloton's."""
    parts = task_id.rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return parts[0], int(parts[1]), int(parts[2])


@dataclass(frozen=True)
class JobRecord:
    id: str
    spec: job_pb2.JobSpec
    state: JobState
    goal: Goal
    reason: str
    message: str
    created_at: datetime
    updated_at: datetime
    version: int
    task_counts: Mapping[TaskState, int] = field(default_factory=dict)
    # Gang failures so far, and when a restarted gang may be admitted again (backoff).
    gang_failures: int = 0
    not_before: datetime | None = None
    # Elastic gangs: the generation of the gang's membership and its size then (0: none yet).
    generation: int = 0
    gang_size: int = 0
    # Who created the job ("" on a daemon without authentication).
    owner: str = ""

    @property
    def terminal(self) -> bool:
        return self.state in JOB_TERMINAL


@dataclass(frozen=True)
class AttemptRecord:
    job_id: str
    instance_id: int
    attempt: int
    state: TaskState
    host: str
    reason: str
    message: str
    started_at: datetime | None
    ended_at: datetime | None
    # The Mesos agent and executor it was launched on ("" until then): they name its sandbox.
    agent_id: str = ""
    executor_id: str = ""

    @property
    def id(self) -> str:
        return attempt_id(self.job_id, self.instance_id, self.attempt)


@dataclass(frozen=True)
class TaskRecord:
    job_id: str
    instance_id: int
    state: TaskState
    goal: Goal
    current: AttemptRecord
    failures: int
    version: int
    history: tuple[AttemptRecord, ...] = ()


@dataclass(frozen=True)
class EventRecord:
    sequence: int
    job_id: str
    instance_id: int | None
    time: datetime
    from_state: str
    to_state: str
    reason: str
    message: str
    host: str
    attempt_id: str


@dataclass(frozen=True)
class JobFilter:
    """ListJobs filters; every given one must match."""

    states: frozenset[JobState] = frozenset()
    pool: str = ""
    name_prefix: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    # Only jobs in these pools (the pools the caller may view); None: any pool.
    pools: frozenset[str] | None = None


@dataclass(frozen=True)
class TaskUpdate:
    """A change of one task's state, as reported for one attempt (stale attempts are ignored).
    ``host``, ``agent_id`` and ``executor_id``: where the attempt was placed or launched (""
    leaves what is recorded)."""

    instance_id: int
    attempt: int
    state: TaskState
    reason: str = ""
    message: str = ""
    host: str = ""
    agent_id: str = ""
    executor_id: str = ""


@dataclass(frozen=True)
class Placement:
    """Where the launcher launches one task's attempt: its host, agent and executor."""

    attempt: int
    host: str
    agent_id: str
    executor_id: str


# The launcher's record of a placed task, step by step: (state, reason).
LAUNCH_STEPS: tuple[tuple[TaskState, str], ...] = (
    (TaskState.PLACING, "placing"),
    (TaskState.PLACED, "placed"),
    (TaskState.LAUNCHING, "launching"),
)


def launch_updates(places: Mapping[int, Placement]) -> list[TaskUpdate]:
    """The record of a launch as task updates: READY -> PLACING -> PLACED -> LAUNCHING of every
    task in ``places`` (instance id -> placement), step by step."""
    return [
        TaskUpdate(i, p.attempt, state, reason, "", p.host, p.agent_id, p.executor_id)
        for state, reason in LAUNCH_STEPS
        for i, p in places.items()
    ]
