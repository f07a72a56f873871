"""Keeps a daemon's in-memory scheduling state in step with what the other daemons write.

Every daemon serves the API, so a job may be created, killed or restarted through a follower:
the leader learns of it here, by polling the job events (one query per poll, whichever daemon
wrote them) and marking those jobs changed for its resource manager. A follower instead re-reads
the pool tree, which only the leader changes, so that it accepts jobs in new pools.

An event committed after newer ones is still found (:class:`peloton.core.eventpoll.EventPoll`),
and a job is told once per event, not once per poll that reads it again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from peloton.core.eventpoll import EventPoll

log = logging.getLogger(__name__)


class Sync:
    """Polls every ``interval`` seconds until :meth:`stop`."""

    def __init__(
        self,
        *,
        changes: Callable[[int], Mapping[str, int]],
        newest: Callable[[], int],
        leads: Callable[[], bool],
        on_jobs: Callable[[set[str]], None],
        on_pools: Callable[[], None],
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``changes(after)``: the jobs with events after ``after``, each with its newest
        event's sequence; ``newest()``: the newest sequence now; ``on_jobs``: jobs changed (on the
        leader); ``on_pools``: re-read the pools (on a follower)."""
        self._changes = changes
        self._newest = newest
        self._leads = leads
        self._on_jobs = on_jobs
        self._on_pools = on_pools
        self._interval = interval
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ha-sync", daemon=True)
        self._seen: EventPoll | None = None
        self._led = False  # whether it led at the last poll
        self._failing = False

    def start(self) -> None:
        """Start polling. The first poll, which marks where the later ones read from, runs
        now: the daemon's resource manager loads the jobs after it, so none written between
        the two is missed (if the database does not answer, the thread's first poll marks)."""
        try:
            self.poll()
        except Exception as exc:
            log.warning("cannot read what other daemons wrote", extra={"error": str(exc)})
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.poll()
            except Exception as exc:  # the next poll reads the same window again
                if not self._failing:
                    log.warning("cannot read what other daemons wrote", extra={"error": str(exc)})
                self._failing = True
                continue
            self._failing = False

    def poll(self) -> None:
        """One poll: the leader's changed jobs, or a follower's pools."""
        now = self._clock()
        if self._seen is None:
            # Jobs written before this daemon led are read by its resource manager's load().
            self._seen = EventPoll(self._newest(), now)
            return
        leads = self._leads()
        if leads and not self._led:
            self._seen.retell()  # what a follower was told, it did not act on
        self._led = leads
        jobs = self._seen.news(now, self._changes(self._seen.after(now)))
        if leads:
            self._on_jobs(jobs)
        else:
            self._on_pools()
