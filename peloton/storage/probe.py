"""A health probe of the database: a trivial query on its own thread and connection.

Health RPCs read what the probe last found and never touch the database, so they answer at once
however the database behaves; the probe's own query is bounded by its timeout.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy import text

from peloton.storage.db import Database, DbTimeouts, make_engine
from peloton.storage.deadline import RpcScope, scoped

log = logging.getLogger(__name__)


class DatabaseProbe:
    """Runs ``SELECT 1`` every ``interval`` seconds and calls ``on_change(reason)`` when the
    answer changes: the empty string once the database answers, why not when it does not."""

    def __init__(
        self,
        url: str,
        timeouts: DbTimeouts,
        interval: float,
        on_change: Callable[[str], None],
    ) -> None:
        # One connection of its own: a pool exhausted by RPCs must not look like an outage.
        self._db = Database(make_engine(url, pool_size=1, timeouts=timeouts), timeouts)
        self._interval = interval
        # A probe slower than this counts as a failure (a stalled database answers nothing).
        self._timeout = min(interval, timeouts.connect_seconds)
        self._on_change = on_change
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="db-probe", daemon=True)
        self._reason = ""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop probing; returns within the probe's timeout."""
        self._stop.set()
        self._db.interrupt()
        if self._thread.is_alive():
            self._thread.join()
        self._db.dispose()

    def check(self) -> str:
        """Ask the database once: the empty string if it answered in time, else why not."""
        try:
            with scoped(RpcScope(self._timeout)), self._db.reading() as session:
                session.execute(text("SELECT 1"))
        except Exception as exc:  # whatever fails, the database did not answer the probe
            return str(exc) or type(exc).__name__
        return ""

    def _run(self) -> None:
        while not self._stop.is_set():
            reason = self.check()
            if reason != self._reason and not self._stop.is_set():
                if reason and not self._reason:
                    log.warning("database unreachable", extra={"error": reason})
                elif not reason:
                    log.info("database reachable again")
                self._reason = reason
                self._on_change(reason)
            self._stop.wait(self._interval)
