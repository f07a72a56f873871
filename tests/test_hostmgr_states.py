"""Mesos task states onto peloton's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peloton.core.states import TASK_ACTIVE, TASK_TRANSITIONS, TaskState
from peloton.hostmgr.states import MESOS_STATES, never_reached_mesos, reason_of, to_peloton

T = TaskState


@pytest.mark.parametrize(
    ("mesos", "current", "expected"),
    [
        ("TASK_STAGING", T.LAUNCHING, T.LAUNCHED),
        ("TASK_STARTING", T.LAUNCHED, T.STARTING),
        ("TASK_RUNNING", T.LAUNCHING, T.RUNNING),
        ("TASK_RUNNING", T.RUNNING, None),
        ("TASK_KILLING", T.KILLING, None),
        ("TASK_FINISHED", T.RUNNING, T.SUCCEEDED),
        ("TASK_FAILED", T.RUNNING, T.FAILED),
        ("TASK_ERROR", T.LAUNCHING, T.FAILED),
        ("TASK_KILLED", T.KILLING, T.KILLED),
        ("TASK_KILLED", T.PREEMPTING, T.KILLED),
        # Not asked for: the group went down with a failed sibling.
        ("TASK_KILLED", T.RUNNING, T.LOST),
        ("TASK_LOST", T.RUNNING, T.LOST),
        ("TASK_DROPPED", T.LAUNCHING, T.LOST),
        ("TASK_UNREACHABLE", T.RUNNING, T.LOST),
        ("TASK_GONE", T.RUNNING, T.LOST),
        ("TASK_GONE_BY_OPERATOR", T.RUNNING, T.LOST),
        ("TASK_UNKNOWN", T.RUNNING, T.LOST),
    ],
)
def test_mapping(mesos: str, current: TaskState, expected: TaskState | None) -> None:
    assert to_peloton(mesos, current) == expected


def test_unknown_state_is_an_error() -> None:
    with pytest.raises(ValueError, match="TASK_BOGUS"):
        to_peloton("TASK_BOGUS", T.RUNNING)


@given(st.sampled_from(MESOS_STATES), st.sampled_from(sorted(TASK_ACTIVE)))
def test_every_mapped_change_of_a_launched_task_is_a_legal_transition(
    mesos: str, current: TaskState
) -> None:
    target = to_peloton(mesos, current)
    assert target is None or target in TASK_TRANSITIONS[current]


def test_late_progress_is_no_change() -> None:
    assert to_peloton("TASK_STAGING", T.RUNNING) is None
    assert to_peloton("TASK_RUNNING", T.KILLING) is None


def test_reason_keeps_the_mesos_detail() -> None:
    assert reason_of("TASK_FAILED", "REASON_COMMAND_EXECUTOR_FAILED", "exit 1") == (
        "failed",
        "REASON_COMMAND_EXECUTOR_FAILED, exit 1",
    )


def test_a_missing_image_names_the_image() -> None:
    # A task group's task (the default executor sets no reason), then a command task.
    missing = (
        "Failed to find archive for image 'team/trainer:1.0' at '/srv/images/team/trainer:1.0.tar'"
    )
    assert reason_of("TASK_FAILED", "", missing) == (
        "image_not_found",
        f"image not found: team/trainer:1.0 ({missing})",
    )
    message = f"Failed to launch container: {missing}"
    reason, detail = reason_of("TASK_FAILED", "REASON_CONTAINER_LAUNCH_FAILED", message)
    assert reason == "image_not_found"
    assert detail.startswith("image not found: team/trainer:1.0 (REASON_CONTAINER_LAUNCH_FAILED, ")
    # Another launch failure is a plain failure.
    assert reason_of("TASK_FAILED", "REASON_CONTAINER_LAUNCH_FAILED", "Failed to mount")[0] == (
        "failed"
    )


@pytest.mark.parametrize(
    ("mesos", "reason", "current", "expected"),
    [
        ("TASK_UNKNOWN", "REASON_RECONCILIATION", T.LAUNCHING, True),  # partition-aware
        ("TASK_LOST", "REASON_RECONCILIATION", T.LAUNCHING, True),
        # The master had seen it: it reports it as it was, or it ran and was lost.
        ("TASK_UNKNOWN", "REASON_RECONCILIATION", T.LAUNCHED, False),
        ("TASK_UNKNOWN", "REASON_RECONCILIATION", T.RUNNING, False),
        ("TASK_LOST", "REASON_AGENT_REMOVED", T.LAUNCHING, False),
        ("TASK_DROPPED", "REASON_INVALID_OFFERS", T.LAUNCHING, False),
    ],
)
def test_a_launch_never_reached_mesos_only_when_reconciliation_finds_a_launching_task_unknown(
    mesos: str, reason: str, current: TaskState, expected: bool
) -> None:
    assert never_reached_mesos(mesos, reason, current) is expected
