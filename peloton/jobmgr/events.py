"""The job event bus: who is told, in this process, that a job's events were committed.

Writers publish after their transaction commits, naming the job; threads block on the bus's
generation (tests, tools) and listeners (the WatchJob streams' hub) are called with the job id,
so that only that job's watchers read the database.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Listener = Callable[[str], None]


class EventBus:
    """Wakes waiters and calls listeners after a job's events were committed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0
        self._closed = False
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(job_id)`` after every publish, on the publisher's thread: it must be
        cheap and must not block."""
        with self._cond:
            self._listeners.append(listener)

    def publish(self, job_id: str) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
            listeners = list(self._listeners)
        for listener in listeners:
            listener(job_id)

    def generation(self) -> int:
        with self._cond:
            return self._generation

    def wait(self, seen: int, timeout: float) -> int:
        """Block until something is published after generation ``seen`` (or timeout/close)."""
        with self._cond:
            self._cond.wait_for(lambda: self._generation != seen or self._closed, timeout)
            return self._generation

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed
