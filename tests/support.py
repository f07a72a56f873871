"""Helpers shared by the job manager tests: specs, a fake clock, a recording killer, checks."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from peloton.core.records import EventRecord, TaskUpdate
from peloton.core.states import (
    JOB_TRANSITIONS,
    TASK_TERMINAL,
    JobState,
    TaskState,
    task_transition_allowed,
)
from peloton.jobmgr.manager import JobManager
from peloton.v1 import job_pb2
from peloton.v1.common_pb2 import Resources

T = TaskState

# The path of one attempt from admission to success, one update per hop.
LIFECYCLE: tuple[TaskState, ...] = (
    T.READY,
    T.PLACING,
    T.PLACED,
    T.LAUNCHING,
    T.LAUNCHED,
    T.STARTING,
    T.RUNNING,
    T.SUCCEEDED,
)
TO_RUNNING: tuple[TaskState, ...] = LIFECYCLE[:-1]


def make_spec(
    instances: int = 2,
    *,
    name: str = "train",
    pool: str = "",
    labels: Mapping[str, str] | None = None,
    command: str = "python train.py",
    gpu: float = 1,
    kill_grace_seconds: int | None = None,
    min_instances: int = 0,
    max_failures: int | None = None,
    backoff_seconds: int | None = None,
    ports: Sequence[str] = (),
    max_runtime_seconds: int = 0,
) -> job_pb2.JobSpec:
    """A valid job spec; ``min_instances`` 0 leaves the default (every instance in one gang)."""
    spec = job_pb2.JobSpec(
        name=name,
        pool=pool,
        instances=instances,
        labels=dict(labels or {}),
        task=job_pb2.TaskSpec(
            command=command, resources=Resources(cpu=1, mem_mb=256, gpu=gpu), ports=list(ports)
        ),
        max_runtime_seconds=max_runtime_seconds,
    )
    if kill_grace_seconds is not None:
        spec.preemption.kill_grace_seconds = kill_grace_seconds
    spec.gang.min_instances = min_instances
    if max_failures is not None:
        spec.restart.max_failures = max_failures
    if backoff_seconds is not None:
        spec.restart.backoff_seconds = backoff_seconds
    return spec


def independent_spec(instances: int = 2, **kw: Any) -> job_pb2.JobSpec:
    """Independent tasks that never restart: a job's lifecycle without the gang rules (those
    are tested in test_gang_lifecycle.py)."""
    return make_spec(instances, min_instances=1, max_failures=0, **kw)


class FakeClock:
    """A settable clock: every call returns ``now`` until it is moved."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float = 1.0) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@dataclass
class RecordingKiller:
    """A TaskKiller that remembers what it was asked to stop."""

    calls: list[tuple[list[str], int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def kill(self, attempt_ids: Sequence[str], grace_seconds: int) -> None:
        with self.lock:
            self.calls.append((list(attempt_ids), grace_seconds))

    @property
    def killed(self) -> list[str]:
        with self.lock:
            return [a for ids, _ in self.calls for a in ids]


def drive(
    manager: JobManager,
    job_id: str,
    instance_id: int,
    states: Sequence[TaskState],
    attempt: int = 1,
    host: str = "host-1",
) -> None:
    """Send one update per state, in order, for one attempt of a task."""
    for state in states:
        manager.update_tasks(job_id, [TaskUpdate(instance_id, attempt, state, host=host)])


def task_event_chain_problems(events: Sequence[EventRecord]) -> list[str]:
    """What is wrong with one task's events (empty: they form a legal chain from PENDING).

    Each event starts where the previous one ended; within an attempt each hop is in the task
    table; a new attempt starts at PENDING from an ended state.
    """
    problems: list[str] = []
    state = T.PENDING
    attempt = ""
    for e in events:
        if e.instance_id is None:
            problems.append(f"job event {e.sequence} among task events")
            continue
        src, dst = TaskState(e.from_state), TaskState(e.to_state)
        if src != state:
            problems.append(f"event {e.sequence}: from {src} but task was {state}")
        new_attempt = attempt and e.attempt_id != attempt
        if new_attempt:
            if not (src in TASK_TERMINAL and dst == T.PENDING):
                problems.append(f"event {e.sequence}: new attempt {e.attempt_id} by {src}->{dst}")
        elif not task_transition_allowed(src, dst):
            problems.append(f"event {e.sequence}: illegal {src}->{dst}")
        state, attempt = dst, e.attempt_id
    return problems


def job_event_chain_problems(events: Sequence[EventRecord]) -> list[str]:
    """What is wrong with a job's job-level events (empty: a legal chain from creation)."""
    problems: list[str] = []
    if not events or events[0].from_state != "" or events[0].reason != "created":
        return ["the first job event is not the creation event"]
    state = JobState(events[0].to_state)
    seen: set[int] = {events[0].sequence}
    for e in events[1:]:
        if e.sequence in seen:
            problems.append(f"duplicate event {e.sequence}")
        seen.add(e.sequence)
        src, dst = JobState(e.from_state), JobState(e.to_state)
        if src != state:
            problems.append(f"event {e.sequence}: from {src} but job was {state}")
        if src == dst:
            problems.append(f"event {e.sequence}: no change {src}->{dst}")
        elif dst not in JOB_TRANSITIONS[src]:
            problems.append(f"event {e.sequence}: illegal {src}->{dst}")
        state = dst
    return problems
