"""Mesos task states onto peloton's task states: a pure table, plus the two cases that depend on
what peloton asked for.

Mesos reports one attempt (one Mesos task). Non-terminal Mesos states move an attempt forward;
every terminal or partition state ends it. UNREACHABLE ends the attempt too (as LOST): peloton
starts a new one rather than wait for the agent, and if the agent comes back the old task is
killed by reconciliation because its attempt is no longer active.
"""

from __future__ import annotations

import re

from peloton.core.states import TASK_TERMINAL, TaskState, task_transition_allowed

# Mesos TaskState (v1 mesos.proto) -> peloton TaskState; None: no change of peloton state.
_TABLE: dict[str, TaskState | None] = {
    "TASK_STAGING": TaskState.LAUNCHED,
    "TASK_STARTING": TaskState.STARTING,
    "TASK_RUNNING": TaskState.RUNNING,
    # Peloton records its own KILLING/PREEMPTING when it asks for the kill.
    "TASK_KILLING": None,
    "TASK_FINISHED": TaskState.SUCCEEDED,
    "TASK_FAILED": TaskState.FAILED,
    "TASK_KILLED": TaskState.KILLED,
    "TASK_ERROR": TaskState.FAILED,
    "TASK_LOST": TaskState.LOST,
    "TASK_DROPPED": TaskState.LOST,
    "TASK_UNREACHABLE": TaskState.LOST,
    "TASK_GONE": TaskState.LOST,
    "TASK_GONE_BY_OPERATOR": TaskState.LOST,
    "TASK_UNKNOWN": TaskState.LOST,
}

MESOS_STATES: tuple[str, ...] = tuple(_TABLE)
# Mesos states in which the task may still run somewhere.
MESOS_ACTIVE: frozenset[str] = frozenset(
    {"TASK_STAGING", "TASK_STARTING", "TASK_RUNNING", "TASK_KILLING", "TASK_UNREACHABLE"}
)
# Peloton states in which peloton asked Mesos to kill the attempt.
_KILL_REQUESTED = frozenset({TaskState.KILLING, TaskState.PREEMPTING})


def to_peloton(mesos_state: str, current: TaskState) -> TaskState | None:
    """The peloton state an update moves an attempt in ``current`` to; None: no change.

    A TASK_KILLED that peloton did not ask for (the default executor took the task group down
    because a sibling failed, or an operator killed it) is a failure of the attempt: LOST, not
    KILLED, so the job fails or restarts instead of reading as killed by its user. Progress
    that arrives out of order is no change.
    Unknown states raise ValueError.
    """
    if mesos_state not in _TABLE:
        raise ValueError(f"unknown Mesos task state {mesos_state!r}")
    target = _TABLE[mesos_state]
    if target is TaskState.KILLED and current not in _KILL_REQUESTED:
        return TaskState.LOST
    if target is None or target == current:
        return None
    if target not in TASK_TERMINAL and not task_transition_allowed(current, target):
        # Progress that arrives late (STAGING after RUNNING, RUNNING of a task being killed).
        return None
    return target


def reason_of(mesos_state: str, mesos_reason: str, message: str) -> tuple[str, str]:
    """The (reason, message) peloton records: the Mesos state as the reason, with Mesos's own
    reason code and message kept in the message so a failure is readable. A container whose image
    the agent's store lacks is ``image_not_found``, its message leading with the image's name."""
    detail = ", ".join(p for p in (mesos_reason, message) if p)
    missing = _MISSING_IMAGE.search(message) if mesos_state == "TASK_FAILED" else None
    if missing is not None:
        return IMAGE_NOT_FOUND, f"image not found: {missing['image']} ({detail})"
    return mesos_state.removeprefix("TASK_").lower(), detail


def never_reached_mesos(mesos_state: str, mesos_reason: str, current: TaskState) -> bool:
    """Whether an update says the master never received the attempt's launch: reconciliation
    finds it unknown (TASK_UNKNOWN to a partition-aware framework, TASK_LOST otherwise) while
    peloton has it LAUNCHING, the state recorded before the ACCEPT is sent. Any task the master
    had seen it would report in its last known state instead."""
    return (
        current == TaskState.LAUNCHING
        and mesos_state in ("TASK_UNKNOWN", "TASK_LOST")
        and mesos_reason == "REASON_RECONCILIATION"
    )


IMAGE_NOT_FOUND = "image_not_found"
# What a Mesos agent's local docker puller (--docker_registry DIR) says of an image it lacks: a
# task group's default executor reports it with no reason, a command task's agent with
# REASON_CONTAINER_LAUNCH_FAILED and "Failed to launch container: " before it.
_MISSING_IMAGE = re.compile(r"Failed to find archive for image '(?P<image>[^']+)'")
