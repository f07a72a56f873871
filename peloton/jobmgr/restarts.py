"""What a failure of a job's tasks leads to: pure rules over the job's spec and failure count.

A job whose gang has more than one task (``gang.min_instances`` > 1) lives and dies as one gang:
when any of its tasks fails or is lost, the rest of the job is killed and, if the gang has failed
no more than ``restart.max_failures`` times, every task starts a new attempt once
``restart.backoff_seconds`` have passed; the next failure fails the job with the reason of the
failure that ended it. A job of independent tasks (``gang.min_instances`` 1) restarts only the
failed task, each task with its own count of failures.

An elastic gang (``gang.max_instances`` set) that keeps at least ``min_instances`` running tasks
after a failure shrinks instead: its survivors go on (the runtime re-forms them from their last
commit) and the failed tasks start new attempts after the backoff, as tasks the gang may grow
back into (each within its own ``restart.max_failures``). Below its minimum it is a gang failure
as above.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from peloton.core.spec import is_elastic, is_gang
from peloton.core.states import NOT_LAUNCHED, TaskState
from peloton.v1 import job_pb2

# The job's reason while its gang restarts, and a task's reason for its new attempt.
GANG_RESTART = "gang_restart"
TASK_RESTART = "restarted"


class Action(enum.Enum):
    RESTART_GANG = "restart_gang"  # kill the rest, new attempts of every task after the backoff
    FAIL_GANG = "fail_gang"  # kill the rest; the job fails
    RESTART_TASKS = "restart_tasks"  # new attempts of the failed tasks still within their limit
    SHRINK = "shrink"  # an elastic gang goes on without them; they restart like RESTART_TASKS


@dataclass(frozen=True)
class Failure:
    """A task attempt that ended FAILED or LOST while peloton wanted it to run."""

    instance_id: int
    state: TaskState
    reason: str
    message: str

    @property
    def counted(self) -> bool:
        """Whether it counts toward ``restart.max_failures`` (see :func:`counts`)."""
        return counts(self.reason)

    def describe(self) -> str:
        detail = f": {self.message}" if self.message else ""
        return f"instance {self.instance_id} {self.state.value.lower()} ({self.reason}){detail}"


def counts(reason: str) -> bool:
    """Whether an attempt that ended with ``reason`` failed: one whose launch never reached
    Mesos never ran, and counts as no failure of its task or gang."""
    return reason != NOT_LAUNCHED


@dataclass(frozen=True)
class Plan:
    action: Action
    # The failure the job's reason names (the first one reported, a FAILED before a LOST).
    cause: Failure
    message: str
    # RESTART_TASKS: which instances start new attempts.
    restart: tuple[int, ...] = ()
    # New attempts wait until then; None: no restart.
    not_before: datetime | None = None
    # Whether the gang's failure count goes up (RESTART_GANG, FAIL_GANG).
    counted: bool = True


def cause_of(failures: Sequence[Failure]) -> Failure:
    """The failure to blame when several are reported at once: a task that failed rather than
    one lost with it (a sibling the executor took down reads as lost), lowest instance first."""
    return min(failures, key=lambda f: (f.state != TaskState.FAILED, f.instance_id))


def plan(
    spec: job_pb2.JobSpec,
    gang_failures: int,
    failures: Sequence[Failure],
    task_failures: Mapping[int, int],
    now: datetime,
    running: int = 0,
) -> Plan:
    """What to do about ``failures`` (reported together) of a job whose gang failed
    ``gang_failures`` times before; ``task_failures`` counts each failed task's failures,
    these included; ``running``: the job's tasks still running after them (elastic gangs)."""
    cause = cause_of(failures)
    if not any(f.counted for f in failures):
        return _relaunch(spec, cause, failures, now, running)
    limit = spec.restart.max_failures
    backoff = spec.restart.backoff_seconds
    after = now + timedelta(seconds=backoff)
    least = spec.gang.min_instances
    if is_elastic(spec) and running >= least:
        restart = _within(failures, task_failures, limit)
        return Plan(
            Action.SHRINK,
            cause,
            f"{cause.describe()}; the elastic gang goes on with {running} tasks (at least "
            f"{least}); {len(restart)} of {len(failures)} failed tasks may rejoin in {backoff} s",
            restart=restart,
            not_before=after if restart else None,
        )
    if is_gang(spec):
        n = gang_failures + 1
        if n <= limit:
            return Plan(
                Action.RESTART_GANG,
                cause,
                f"{cause.describe()}; gang failure {n} of {limit} tolerated, "
                f"restarting the whole gang in {backoff} s",
                not_before=after,
            )
        return Plan(
            Action.FAIL_GANG,
            cause,
            f"{cause.describe()}; the gang failed {n} times (restart.max_failures is {limit})",
        )
    restart = _within(failures, task_failures, limit)
    return Plan(
        Action.RESTART_TASKS,
        cause,
        f"{cause.describe()}; restarting {len(restart)} of {len(failures)} failed tasks "
        f"in {backoff} s (restart.max_failures is {limit} per task)",
        restart=restart,
        not_before=after if restart else None,
    )


def _relaunch(
    spec: job_pb2.JobSpec,
    cause: Failure,
    failures: Sequence[Failure],
    now: datetime,
    running: int,
) -> Plan:
    """:func:`plan` for attempts that never ran (their launch never reached Mesos): they start
    again at once, as they would after a failure, but nothing is counted and nobody waits."""
    why = f"{cause.describe()}; not counted as a failure"
    instances = tuple(sorted(f.instance_id for f in failures))
    if is_elastic(spec) and running >= spec.gang.min_instances:
        message = f"{why}; the elastic gang goes on with {running} tasks, they may rejoin now"
        return Plan(Action.SHRINK, cause, message, restart=instances, not_before=now)
    if is_gang(spec):
        message = f"{why}; restarting the whole gang now"
        return Plan(Action.RESTART_GANG, cause, message, not_before=now, counted=False)
    message = f"{why}; restarting {len(instances)} tasks now"
    return Plan(Action.RESTART_TASKS, cause, message, restart=instances, not_before=now)


def _within(
    failures: Sequence[Failure], task_failures: Mapping[int, int], limit: int
) -> tuple[int, ...]:
    """The failed instances still within ``restart.max_failures`` of their own."""
    return tuple(sorted(f.instance_id for f in failures if task_failures[f.instance_id] <= limit))
