"""Polling the job events every daemon writes: where each poll reads from, and which jobs it
has news of.

An event's sequence is taken when it is written but becomes visible when its transaction
commits, possibly after newer ones: a poll that read only what is newer than the newest it had
seen would miss it for good. Each poll therefore reads again from the newest sequence seen
:data:`RESCAN_SECONDS` ago, and tells only the jobs whose newest event it had not told yet (a
job's events commit in sequence order: its writers take the job's lock). Pure: the caller reads
the events and gives the time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

# Longer than a write transaction lasts (the database's statement timeout bounds it): an event
# committed later than a newer one is still found this long after that one.
RESCAN_SECONDS = 10.0


class EventPoll:
    """What the polls of one reader have seen."""

    def __init__(self, newest: int, now: float, window: float = RESCAN_SECONDS) -> None:
        """``newest``: the newest sequence when the reader started (what was written before,
        it reads otherwise)."""
        self._window = window
        self._marks: deque[tuple[float, int]] = deque([(now, newest)])  # (when, newest then)
        self._told: dict[str, int] = {}  # job -> the newest of its sequences told

    def after(self, now: float) -> int:
        """Where the poll at ``now`` reads from: events newer than this sequence."""
        while len(self._marks) > 1 and self._marks[1][0] <= now - self._window:
            self._marks.popleft()
        return self._marks[0][1]

    def news(self, now: float, newest_by_job: Mapping[str, int]) -> set[str]:
        """The jobs with events newer than :meth:`after` (each job's newest sequence) that have
        news: an event not told yet. Call once per poll, after :meth:`after`."""
        floor = self._marks[0][1]
        self._marks.append((now, max([self._marks[-1][1], *newest_by_job.values()])))
        fresh = {job for job, seq in newest_by_job.items() if seq > self._told.get(job, floor)}
        for job in fresh:
            self._told[job] = newest_by_job[job]
        # What is at or below the window's floor is never read again: forget it.
        self._told = {job: seq for job, seq in self._told.items() if seq > floor}
        return fresh

    def retell(self) -> None:
        """Tell again, at the next poll, every job with events in the window (a reader that
        just began to act on them: what it was told before, it ignored)."""
        self._told.clear()
