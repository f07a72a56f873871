"""Runtime expiry: the job manager's own timer that kills jobs past their max runtime.

Every ``interval`` seconds, on a thread of its own, :meth:`JobManager.expire_jobs` kills the jobs
that have run longer than their ``max_runtime_seconds``. A round that fails (the database is
unreachable) is logged and the next one tries again.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

log = logging.getLogger(__name__)

# How often jobs past their max runtime are looked for: a job runs at most this much too long.
EXPIRY_INTERVAL_SECONDS = 1.0


class Expiring(Protocol):
    """What the timer needs of the job manager."""

    def expire_jobs(self) -> list[str]: ...


class ExpiryTimer:
    """Calls ``jobs.expire_jobs()`` every ``interval`` seconds between start() and stop()."""

    def __init__(self, jobs: Expiring, interval: float = EXPIRY_INTERVAL_SECONDS) -> None:
        self._jobs = jobs
        self._interval = interval
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="jobmgr-expiry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop; waits for a round in progress to end."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()

    def run_once(self) -> list[str]:
        """One round: the jobs it killed (none if the round failed)."""
        try:
            killed = self._jobs.expire_jobs()
        except Exception:  # keep the timer; the next round looks again
            log.exception("runtime expiry failed")
            return []
        if killed:
            log.info("jobs past their max runtime killed", extra={"jobs": len(killed)})
        return killed

    def _loop(self) -> None:
        while not self._stopped.wait(self._interval):
            self.run_once()
