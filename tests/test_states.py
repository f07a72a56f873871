"""The task and job state machines in peloton.core.states, as tables and as properties."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from peloton.core.states import (
    JOB_TERMINAL,
    JOB_TRANSITIONS,
    TASK_ACTIVE,
    TASK_TERMINAL,
    TASK_TRANSITIONS,
    TASK_UNLAUNCHED,
    Goal,
    JobState,
    TaskState,
    check_job_transition,
    check_new_attempt,
    check_task_transition,
    derive_job_state,
    task_transition_allowed,
)
from peloton.errors import FailedPrecondition

T = TaskState
J = JobState
ALL_TASK_STATES = list(TaskState)
ALL_JOB_STATES = list(JobState)
NON_TERMINAL = [s for s in TaskState if s not in TASK_TERMINAL]

task_states = st.sampled_from(ALL_TASK_STATES)
goals = st.sampled_from(list(Goal))
# A job's goal is only ever RUN or KILL (RESTART is a task goal); derive must still cope.
job_goals = st.sampled_from([Goal.RUN, Goal.KILL])

# How many tasks of a job are in each state: at least one task in all.
counts_st = st.dictionaries(task_states, st.integers(min_value=0, max_value=4), min_size=1).filter(
    lambda c: sum(c.values()) > 0
)


def _total(counts: Mapping[TaskState, int]) -> int:
    return sum(counts.values())


def _in(counts: Mapping[TaskState, int], states: frozenset[TaskState]) -> int:
    return sum(n for s, n in counts.items() if s in states)


def _move(
    counts: Mapping[TaskState, int], src: TaskState, dst: TaskState, n: int = 1
) -> dict[TaskState, int]:
    out = Counter(counts)
    assert out[src] >= n
    out[src] -= n
    out[dst] += n
    return {s: k for s, k in out.items() if k}


# ---------------------------------------------------------------------------- the task table


def test_task_table_covers_every_state() -> None:
    assert set(TASK_TRANSITIONS) == set(TaskState)
    for src, targets in TASK_TRANSITIONS.items():
        assert targets <= set(TaskState)
        assert src not in targets, f"{src} lists itself"


def test_terminal_task_states_have_no_way_out() -> None:
    assert frozenset({T.SUCCEEDED, T.FAILED, T.LOST, T.KILLED}) == TASK_TERMINAL
    for state in TASK_TERMINAL:
        assert TASK_TRANSITIONS[state] == frozenset()


def test_state_groups_partition_the_task_states() -> None:
    assert set(TaskState) == TASK_UNLAUNCHED | TASK_ACTIVE | TASK_TERMINAL
    assert not TASK_UNLAUNCHED & TASK_ACTIVE
    assert not TASK_UNLAUNCHED & TASK_TERMINAL
    assert not TASK_ACTIVE & TASK_TERMINAL


def _reachable(start: TaskState) -> set[TaskState]:
    seen = {start}
    todo = deque([start])
    while todo:
        for nxt in TASK_TRANSITIONS[todo.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@pytest.mark.parametrize("state", NON_TERMINAL, ids=str)
def test_every_live_task_can_end_and_can_be_killed(state: TaskState) -> None:
    reach = _reachable(state)
    assert reach & TASK_TERMINAL
    assert T.KILLED in reach
    # What kill_job does to it must be a legal hop.
    if state in TASK_UNLAUNCHED:
        assert task_transition_allowed(state, T.KILLED)
    elif state != T.KILLING:
        assert task_transition_allowed(state, T.KILLING)


@given(start=task_states, data=st.data())
def test_random_walk_never_leaves_a_terminal_state(start: TaskState, data: st.DataObject) -> None:
    state = start
    ended = state in TASK_TERMINAL
    for _ in range(30):
        target = data.draw(task_states, label="target")
        if task_transition_allowed(state, target):
            assert not ended, f"left terminal {state} for {target}"
            check_task_transition(state, target)
            state = target
        else:
            with pytest.raises(FailedPrecondition):
                check_task_transition(state, target)
        if state in TASK_TERMINAL:
            ended = True
        assert ended == (state in TASK_TERMINAL)


@given(start=task_states, data=st.data())
def test_random_legal_walk_stays_terminal_once_ended(start: TaskState, data: st.DataObject) -> None:
    state = start
    for _ in range(30):
        targets = sorted(TASK_TRANSITIONS[state])
        if not targets:
            assert state in TASK_TERMINAL
            for target in TaskState:
                with pytest.raises(FailedPrecondition):
                    check_task_transition(state, target)
            return
        assert state not in TASK_TERMINAL
        state = data.draw(st.sampled_from(targets), label="next")


@given(current=task_states, target=task_states)
def test_check_task_transition_raises_exactly_off_the_table(
    current: TaskState, target: TaskState
) -> None:
    if target in TASK_TRANSITIONS[current]:
        check_task_transition(current, target)
        assert task_transition_allowed(current, target)
    else:
        with pytest.raises(FailedPrecondition) as info:
            check_task_transition(current, target)
        assert str(current) in str(info.value) and str(target) in str(info.value)
        assert not task_transition_allowed(current, target)


def test_check_task_transition_every_pair() -> None:
    refused = 0
    for current in TaskState:
        for target in TaskState:
            try:
                check_task_transition(current, target)
            except FailedPrecondition:
                refused += 1
                assert target not in TASK_TRANSITIONS[current]
            else:
                assert target in TASK_TRANSITIONS[current]
    allowed = sum(len(v) for v in TASK_TRANSITIONS.values())
    assert refused + allowed == len(TaskState) ** 2


@pytest.mark.parametrize(
    ("current", "target", "ok"),
    [
        (T.PENDING, T.READY, True),
        (T.PENDING, T.RUNNING, False),
        (T.PENDING, T.FAILED, True),
        (T.LAUNCHING, T.RUNNING, True),  # Mesos may skip updates
        (T.RUNNING, T.LAUNCHED, False),
        (T.RUNNING, T.PENDING, False),
        (T.PLACED, T.READY, True),
        (T.KILLING, T.RUNNING, False),
        (T.KILLING, T.SUCCEEDED, True),
        (T.PREEMPTING, T.KILLED, True),
        (T.SUCCEEDED, T.PENDING, False),  # a new attempt, not a transition
        (T.KILLED, T.RUNNING, False),
    ],
)
def test_task_transition_examples(current: TaskState, target: TaskState, ok: bool) -> None:
    assert task_transition_allowed(current, target) is ok


@pytest.mark.parametrize("state", ALL_TASK_STATES, ids=str)
def test_new_attempt_only_after_the_current_one_ended(state: TaskState) -> None:
    if state in TASK_TERMINAL:
        check_new_attempt(state)
    else:
        with pytest.raises(FailedPrecondition, match="has not ended"):
            check_new_attempt(state)


# ---------------------------------------------------------------------------- the job table


def test_job_table_covers_every_state() -> None:
    assert set(JOB_TRANSITIONS) == set(JobState)
    assert frozenset({J.SUCCEEDED, J.FAILED, J.KILLED}) == JOB_TERMINAL
    assert JOB_TRANSITIONS[J.KILLING] == frozenset({J.KILLED})


@given(current=st.sampled_from(ALL_JOB_STATES), target=st.sampled_from(ALL_JOB_STATES))
def test_check_job_transition_matches_the_table(current: JobState, target: JobState) -> None:
    if current == target or target in JOB_TRANSITIONS[current]:
        check_job_transition(current, target)
    else:
        with pytest.raises(FailedPrecondition):
            check_job_transition(current, target)


# ---------------------------------------------------------------------------- derive_job_state


@given(counts=counts_st, goal=goals)
def test_derive_always_returns_a_job_state(counts: dict[TaskState, int], goal: Goal) -> None:
    assert isinstance(derive_job_state(counts, goal), JobState)


@given(n=st.integers(min_value=1, max_value=10_000), goal=st.sampled_from([Goal.RUN, Goal.RESTART]))
def test_all_succeeded_is_succeeded(n: int, goal: Goal) -> None:
    assert derive_job_state({T.SUCCEEDED: n}, goal) == J.SUCCEEDED


@given(counts=counts_st, goal=goals)
def test_derive_invariants(counts: dict[TaskState, int], goal: Goal) -> None:
    state = derive_job_state(counts, goal)
    total = _total(counts)
    ended = _in(counts, TASK_TERMINAL)
    failed = counts.get(T.FAILED, 0) + counts.get(T.LOST, 0)
    killed = counts.get(T.KILLED, 0)
    launched = _in(counts, TASK_ACTIVE)

    # Terminal exactly when every task ended.
    assert (state in JOB_TERMINAL) == (ended == total)
    if ended == total:
        if goal is Goal.KILL:
            assert state == J.KILLED
        elif failed:
            # A failed gang's other tasks are killed by peloton: the job still failed.
            assert state == J.FAILED
        elif killed:
            assert state == J.KILLED
        else:
            assert counts.get(T.SUCCEEDED, 0) == total
            assert state == J.SUCCEEDED
    if goal is Goal.KILL and ended < total:
        assert state == J.KILLING
    if goal is not Goal.KILL and ended < total:
        if launched == 0 and ended == 0:
            assert state == J.PENDING
        else:
            assert state == J.RUNNING
    if state == J.KILLING:
        assert goal is Goal.KILL
    if state == J.SUCCEEDED:
        assert counts.get(T.SUCCEEDED, 0) == total


def _legal_single_step(counts: Mapping[TaskState, int], data: st.DataObject) -> TaskState:
    """A state that some task is in and that can move; the test is skipped if none can."""
    movable = sorted(s for s, n in counts.items() if n > 0 and TASK_TRANSITIONS[s])
    assume(movable)
    return data.draw(st.sampled_from(movable), label="src")


@given(counts=counts_st, goal=job_goals, data=st.data())
def test_one_task_transition_gives_a_legal_job_transition(
    counts: dict[TaskState, int], goal: Goal, data: st.DataObject
) -> None:
    src = _legal_single_step(counts, data)
    dst = data.draw(st.sampled_from(sorted(TASK_TRANSITIONS[src])), label="dst")
    before = derive_job_state(counts, goal)
    after = derive_job_state(_move(counts, src, dst), goal)
    check_job_transition(before, after)


@given(counts=counts_st, goal=st.sampled_from(list(Goal)), data=st.data())
def test_one_task_transition_gives_a_legal_job_transition_any_goal(
    counts: dict[TaskState, int], goal: Goal, data: st.DataObject
) -> None:
    src = _legal_single_step(counts, data)
    dst = data.draw(st.sampled_from(sorted(TASK_TRANSITIONS[src])), label="dst")
    check_job_transition(
        derive_job_state(counts, goal), derive_job_state(_move(counts, src, dst), goal)
    )


@given(counts=counts_st, data=st.data())
def test_a_new_attempt_of_a_running_job_gives_a_legal_job_transition(
    counts: dict[TaskState, int], data: st.DataObject
) -> None:
    ended = sorted(s for s, n in counts.items() if n > 0 and s in TASK_TERMINAL)
    assume(ended)
    src = data.draw(st.sampled_from(ended), label="src")
    check_new_attempt(src)
    check_job_transition(
        derive_job_state(counts, Goal.RUN),
        derive_job_state(_move(counts, src, T.PENDING), Goal.RUN),
    )


def test_a_new_attempt_while_the_job_is_killed_is_not_a_legal_job_transition() -> None:
    # Why the manager must never start a new attempt of a task of a job being killed: the job
    # would go from KILLED back to KILLING.
    before = derive_job_state({T.KILLED: 2}, Goal.KILL)
    after = derive_job_state({T.KILLED: 1, T.PENDING: 1}, Goal.KILL)
    assert (before, after) == (J.KILLED, J.KILLING)
    with pytest.raises(FailedPrecondition):
        check_job_transition(before, after)


@given(counts=counts_st)
def test_killing_a_live_job_gives_a_legal_job_transition(counts: dict[TaskState, int]) -> None:
    """What kill_job does: unlaunched tasks KILLED, the other live ones KILLING, goal KILL."""
    before = derive_job_state(counts, Goal.RUN)
    assume(before not in JOB_TERMINAL)
    after_counts = dict(counts)
    for s in TASK_UNLAUNCHED:
        if after_counts.get(s):
            after_counts = _move(after_counts, s, T.KILLED, after_counts[s])
    for s in TASK_ACTIVE - {T.KILLING}:
        if after_counts.get(s):
            after_counts = _move(after_counts, s, T.KILLING, after_counts[s])
    after = derive_job_state(after_counts, Goal.KILL)
    assert after in (J.KILLING, J.KILLED)
    assert (after == J.KILLED) == (_in(counts, TASK_ACTIVE) == 0)
    check_job_transition(before, after)


@given(counts=counts_st)
def test_restarting_a_job_gives_a_legal_job_transition(counts: dict[TaskState, int]) -> None:
    """What restart_job does: ended tasks new attempt PENDING, running ones KILLING, goal RUN."""
    for old_goal in (Goal.RUN, Goal.KILL):
        before = derive_job_state(counts, old_goal)
        if before in (J.PENDING, J.KILLING):
            continue  # refused by restart_job
        after_counts = dict(counts)
        for s in TASK_TERMINAL:
            if after_counts.get(s):
                after_counts = _move(after_counts, s, T.PENDING, after_counts[s])
        for s in TASK_ACTIVE - {T.KILLING}:
            if after_counts.get(s):
                after_counts = _move(after_counts, s, T.KILLING, after_counts[s])
        check_job_transition(before, derive_job_state(after_counts, Goal.RUN))


@pytest.mark.parametrize(
    ("counts", "goal", "expected"),
    [
        ({T.PENDING: 4}, Goal.RUN, J.PENDING),
        ({T.INITIALIZED: 1, T.READY: 2, T.PLACED: 1}, Goal.RUN, J.PENDING),
        ({T.PENDING: 3, T.LAUNCHING: 1}, Goal.RUN, J.RUNNING),
        ({T.PENDING: 3, T.SUCCEEDED: 1}, Goal.RUN, J.RUNNING),
        ({T.RUNNING: 3, T.FAILED: 1}, Goal.RUN, J.RUNNING),
        ({T.SUCCEEDED: 4}, Goal.RUN, J.SUCCEEDED),
        ({T.SUCCEEDED: 3, T.FAILED: 1}, Goal.RUN, J.FAILED),
        ({T.SUCCEEDED: 3, T.LOST: 1}, Goal.RUN, J.FAILED),
        ({T.FAILED: 1, T.KILLED: 3}, Goal.RUN, J.FAILED),
        ({T.SUCCEEDED: 3, T.KILLED: 1}, Goal.RUN, J.KILLED),
        ({T.SUCCEEDED: 4}, Goal.KILL, J.KILLED),
        ({T.RUNNING: 1, T.KILLED: 3}, Goal.KILL, J.KILLING),
        ({T.PENDING: 1}, Goal.KILL, J.KILLING),
        ({T.KILLING: 2}, Goal.RUN, J.RUNNING),
        ({}, Goal.RUN, J.PENDING),
    ],
)
def test_derive_examples(counts: dict[TaskState, int], goal: Goal, expected: JobState) -> None:
    assert derive_job_state(counts, goal) == expected


def test_derive_ignores_zero_counts() -> None:
    assert derive_job_state({T.SUCCEEDED: 2, T.RUNNING: 0, T.FAILED: 0}, Goal.RUN) == J.SUCCEEDED
