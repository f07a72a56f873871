"""Keeps a daemon's in-memory scheduling state in step with what the other daemons write.

Every daemon serves the API, so a job may be created, killed or restarted through a follower:
the leader learns of it here, by polling the job events (one query per poll, whichever daemon
wrote them) and marking those jobs changed for its resource manager. A follower instead re-reads
the pool tree, which only the leader changes, so that it accepts jobs in new pools.

An event's sequence is taken when it is written but becomes visible when its transaction
commits, possibly after newer ones: each poll therefore reads again the events of the last
:data:`RESCAN_SECONDS`, and a job seen twice is only re-read by the resource manager.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

# Longer than a write transaction lasts (the database's statement timeout bounds it): an event
# committed later than a newer one is still found this long after that one.
RESCAN_SECONDS = 10.0


class Sync:
    """Polls every ``interval`` seconds until :meth:`stop`."""

    def __init__(
        self,
        *,
        changes: Callable[[int], tuple[int, set[str]]],
        newest: Callable[[], int],
        leads: Callable[[], bool],
        on_jobs: Callable[[set[str]], None],
        on_pools: Callable[[], None],
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``changes(after)``: the newest event's sequence and the jobs with events after
        ``after``; ``newest()``: the newest sequence now; ``on_jobs``: jobs changed (on the
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
        self._seen: deque[tuple[float, int]] = deque()  # (when, newest sequence then)
        self._failing = False

    def start(self) -> None:
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
        if not self._seen:
            # Jobs written before this daemon led are read by its resource manager's load().
            self._seen.append((now, self._newest()))
            return
        while len(self._seen) > 1 and self._seen[1][0] <= now - RESCAN_SECONDS:
            self._seen.popleft()
        newest, jobs = self._changes(self._seen[0][1])
        self._seen.append((now, newest))
        if self._leads():
            self._on_jobs(jobs)
        else:
            self._on_pools()
