"""Job and task state machines, as data.

The transition tables below are the single source of truth: every change of a task's or a job's
state is checked against them before it is written. A task's table covers one *attempt*; a new
attempt (restart) starts again at PENDING from a terminal state and is checked by
:func:`check_new_attempt`. A job's state is never set directly: it is derived from its tasks'
states by :func:`derive_job_state` and the derived change is then checked against the job table.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from peloton.errors import FailedPrecondition


class TaskState(enum.StrEnum):
    INITIALIZED = "INITIALIZED"
    PENDING = "PENDING"
    READY = "READY"
    PLACING = "PLACING"
    PLACED = "PLACED"
    LAUNCHING = "LAUNCHING"
    LAUNCHED = "LAUNCHED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    LOST = "LOST"
    PREEMPTING = "PREEMPTING"
    KILLING = "KILLING"
    KILLED = "KILLED"


class JobState(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLING = "KILLING"
    KILLED = "KILLED"


class Goal(enum.StrEnum):
    """What peloton wants of a job or task: run it, kill it, or kill it and start a new attempt."""

    RUN = "RUN"
    KILL = "KILL"
    RESTART = "RESTART"


T = TaskState
TASK_TERMINAL: frozenset[TaskState] = frozenset({T.SUCCEEDED, T.FAILED, T.LOST, T.KILLED})
# States before anything was sent to Mesos: such a task can be killed without asking a host.
TASK_UNLAUNCHED: frozenset[TaskState] = frozenset(
    {T.INITIALIZED, T.PENDING, T.READY, T.PLACING, T.PLACED}
)
# States in which a process may exist on a host.
TASK_ACTIVE: frozenset[TaskState] = frozenset(
    {T.LAUNCHING, T.LAUNCHED, T.STARTING, T.RUNNING, T.PREEMPTING, T.KILLING}
)
# States a launched attempt goes through on its way to running, as its host reports them: most
# status updates, recorded on a path of their own (see TaskUpdates.record_progress).
TASK_PROGRESS: frozenset[TaskState] = frozenset({T.LAUNCHED, T.STARTING, T.RUNNING})
_ENDINGS = {T.SUCCEEDED, T.FAILED, T.LOST, T.KILLING, T.KILLED}
# Reason of an attempt ended LOST because its launch never reached Mesos (the daemon that led
# stopped between recording the launch and sending it): the task never ran, so its end counts
# as no failure of the task or its gang, and its new attempt waits for no backoff.
NOT_LAUNCHED = "not_launched"

TASK_TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = {
    T.INITIALIZED: frozenset({T.PENDING, T.KILLED, T.FAILED}),
    # PENDING -> FAILED: the gang can never be admitted or placed (fails fast with a reason).
    T.PENDING: frozenset({T.READY, T.KILLED, T.FAILED}),
    # Back to PENDING/READY: preempted or a placement attempt gave up before launch.
    T.READY: frozenset({T.PLACING, T.PENDING, T.KILLED, T.FAILED}),
    T.PLACING: frozenset({T.PLACED, T.READY, T.PENDING, T.KILLED, T.FAILED}),
    T.PLACED: frozenset({T.LAUNCHING, T.READY, T.PENDING, T.KILLED, T.FAILED}),
    # Mesos may skip intermediate updates, so a launching task may jump ahead.
    T.LAUNCHING: frozenset(
        {T.LAUNCHED, T.STARTING, T.RUNNING, T.READY, T.PENDING, T.PREEMPTING} | _ENDINGS
    ),
    T.LAUNCHED: frozenset({T.STARTING, T.RUNNING, T.PREEMPTING} | _ENDINGS),
    T.STARTING: frozenset({T.RUNNING, T.PREEMPTING} | _ENDINGS),
    T.RUNNING: frozenset({T.PREEMPTING} | _ENDINGS),
    T.PREEMPTING: frozenset(_ENDINGS),
    T.KILLING: frozenset({T.SUCCEEDED, T.FAILED, T.LOST, T.KILLED}),
    T.SUCCEEDED: frozenset(),
    T.FAILED: frozenset(),
    T.LOST: frozenset(),
    T.KILLED: frozenset(),
}

J = JobState
JOB_TERMINAL: frozenset[JobState] = frozenset({J.SUCCEEDED, J.FAILED, J.KILLED})
JOB_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    J.PENDING: frozenset({J.RUNNING, J.SUCCEEDED, J.FAILED, J.KILLING, J.KILLED}),
    # RUNNING -> PENDING: every task went back to wait (gang restart or preemption).
    J.RUNNING: frozenset({J.PENDING, J.SUCCEEDED, J.FAILED, J.KILLING, J.KILLED}),
    J.KILLING: frozenset({J.KILLED}),
    # Terminal -> PENDING/RUNNING: RestartJob started new attempts.
    J.SUCCEEDED: frozenset({J.PENDING, J.RUNNING}),
    J.FAILED: frozenset({J.PENDING, J.RUNNING}),
    J.KILLED: frozenset({J.PENDING, J.RUNNING}),
}


def task_transition_allowed(current: TaskState, target: TaskState) -> bool:
    """Whether one attempt of a task may move from ``current`` to ``target``."""
    return target in TASK_TRANSITIONS[current]


def check_task_transition(current: TaskState, target: TaskState) -> None:
    """Raise FailedPrecondition unless ``current -> target`` is in the task table."""
    if not task_transition_allowed(current, target):
        raise FailedPrecondition(f"task state {current} cannot change to {target}")


def check_new_attempt(current: TaskState) -> None:
    """A new attempt may start only once the current one has ended."""
    if current not in TASK_TERMINAL:
        raise FailedPrecondition(
            f"task in state {current} has not ended; cannot start a new attempt"
        )


def check_job_transition(current: JobState, target: JobState) -> None:
    """Raise FailedPrecondition unless ``current -> target`` is in the job table."""
    if target != current and target not in JOB_TRANSITIONS[current]:
        raise FailedPrecondition(f"job state {current} cannot change to {target}")


def derive_job_state(
    counts: Mapping[TaskState, int], goal: Goal, *, elastic: bool = False
) -> JobState:
    """A job's state from how many of its tasks are in each state, and the job's goal.

    - every task ended: KILLED if the job was killed; SUCCEEDED for an elastic gang of which a
      task succeeded (its training finished; slots it never grew into are killed, ranks it lost
      on the way failed); otherwise FAILED if a task failed or was lost (a failed gang's other
      tasks are killed: the job still failed), KILLED if a task was killed, else SUCCEEDED;
    - some task still going: KILLING if the job is being killed, RUNNING if any task has been
      launched or has already ended, otherwise PENDING.
    """
    total = sum(counts.values())
    ended = sum(n for s, n in counts.items() if s in TASK_TERMINAL)
    if total > 0 and ended == total:
        if goal is Goal.KILL:
            return J.KILLED
        if elastic and counts.get(T.SUCCEEDED, 0) > 0:
            return J.SUCCEEDED
        if counts.get(T.FAILED, 0) + counts.get(T.LOST, 0) > 0:
            return J.FAILED
        return J.KILLED if counts.get(T.KILLED, 0) > 0 else J.SUCCEEDED
    if goal is Goal.KILL:
        return J.KILLING
    started = ended + sum(n for s, n in counts.items() if s in TASK_ACTIVE)
    return J.RUNNING if started > 0 else J.PENDING
