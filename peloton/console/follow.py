"""Live updates on a daemon that does not lead (several daemons): the jobs the other daemons
change publish on their own event buses, not on this one's, so the console polls the job events
every daemon writes (as :mod:`peloton.ha.sync` does for the leader) and tells its feed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from peloton.core.eventpoll import EventPoll

log = logging.getLogger(__name__)

# How often a daemon that does not lead looks for what the others wrote.
POLL_SECONDS = 1.0


class OthersWrites:
    """Polls every ``interval`` seconds while this daemon does not lead, calling
    ``changed(job_id)`` for each job with new events (a :class:`~peloton.console.web.Worker`)."""

    def __init__(
        self,
        *,
        changes: Callable[[int], Mapping[str, int]],
        newest: Callable[[], int],
        leads: Callable[[], bool],
        changed: Callable[[str], None],
        interval: float = POLL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``changes(after)``: the jobs with events after ``after``, each with its newest
        event's sequence; ``newest()``: the newest sequence now."""
        self._changes = changes
        self._newest = newest
        self._leads = leads
        self._changed = changed
        self._interval = interval
        self._clock = clock
        self._seen: EventPoll | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Mark where the polls read from (what is written from now on is told; a daemon
        begins as a follower, and a leader never becomes one again), then poll."""
        try:
            self._mark()
        except Exception as exc:  # the first poll marks instead
            log.info("console: other daemons' writes unread", extra={"error": str(exc)})
        self._thread = threading.Thread(target=self._run, name="console-follow", daemon=True)
        self._thread.start()

    def _mark(self) -> None:
        self._seen = EventPoll(self._newest(), self._clock())

    def stop(self) -> None:
        """Stop polling (returns once the poll under way ended)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.poll()
            except Exception as exc:  # the next poll reads the same window again
                log.info(
                    "the console could not read other daemons' writes", extra={"error": str(exc)}
                )

    def poll(self) -> None:
        """One poll: nothing while this daemon leads (every change reaches its own bus); else
        the jobs with events not told yet."""
        if self._leads():
            return
        if self._seen is None:
            self._mark()
            return
        now = self._clock()
        for job_id in sorted(self._seen.news(now, self._changes(self._seen.after(now)))):
            self._changed(job_id)
