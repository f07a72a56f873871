"""Polling job events that commit out of sequence order (peloton.core.eventpoll): every event
is found, and a job is told once per event, not once per poll that reads it again."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.core.eventpoll import RESCAN_SECONDS, EventPoll

# (job, delay in polls between taking its sequence and committing)
Event = tuple[str, int]


def run(events: list[list[Event]], polls: int) -> tuple[list[set[str]], dict[int, int]]:
    """Events written at each poll interval (sequences in order of writing), committed after
    their delay; a poll a second. Returns what each poll told, and each sequence's visible
    poll."""
    rows: list[tuple[int, str, int]] = []  # (sequence, job, visible from poll)
    seq = 0
    for at, written in enumerate(events):
        for job, delay in written:
            seq += 1
            rows.append((seq, job, at + delay))
    poll = EventPoll(0, 0.0)
    told: list[set[str]] = []
    for p in range(1, polls + 1):
        after = poll.after(float(p))
        newest: dict[str, int] = {}
        for s, job, visible in rows:
            if visible <= p and s > after:
                newest[job] = max(s, newest.get(job, 0))
        told.append(poll.news(float(p), newest))
    return told, {s: visible for s, _, visible in rows}


jobs = st.sampled_from(["a", "b", "c"])
# Commits come at most a few seconds late: well within the window.
delays = st.integers(min_value=1, max_value=int(RESCAN_SECONDS) - 2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(jobs, delays), max_size=4), min_size=1, max_size=15))
def test_every_event_is_told_once_it_is_visible(events: list[list[Event]]) -> None:
    # A job's events commit in sequence order (its writers hold its lock): later ones of a job
    # are never visible before earlier ones.
    last: dict[str, int] = {}
    ordered: list[list[Event]] = []
    for at, written in enumerate(events):
        fixed = []
        for job, delay in written:
            visible = max(at + delay, last.get(job, 0))
            last[job] = visible
            fixed.append((job, visible - at))
        ordered.append(fixed)
    polls = len(ordered) + int(RESCAN_SECONDS) + 2
    told, visible = run(ordered, polls)
    seq = 0
    for written in ordered:
        for job, _ in written:
            seq += 1
            when = visible[seq]
            assert any(job in told[p - 1] for p in range(max(when, 1), polls + 1)), (seq, job)
    # Told at most once per poll at which a new event of the job became visible.
    for job in "abc":
        newly = {v for s, v in visible.items() if _job_of(ordered, s) == job}
        assert sum(job in t for t in told) <= len(newly)


def _job_of(events: list[list[Event]], seq: int) -> str:
    flat = [job for written in events for job, _ in written]
    return flat[seq - 1]


def test_a_late_commit_is_found_and_the_rest_is_not_told_again() -> None:
    poll = EventPoll(0, 0.0)
    assert poll.after(1.0) == 0
    assert poll.news(1.0, {"c": 3}) == {"c"}  # 1 and 2 are not committed yet
    assert poll.after(2.0) == 0
    assert poll.news(2.0, {"a": 1, "c": 3}) == {"a"}
    assert poll.news(3.0, {"a": 1, "b": 2, "c": 3}) == {"b"}
    # Past the window it reads from the newest it had seen then.
    assert poll.after(3.0 + RESCAN_SECONDS) == 3
    poll.retell()
    assert poll.news(3.0 + RESCAN_SECONDS, {"c": 4}) == {"c"}
