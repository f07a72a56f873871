"""What changed, for the console's event streams: each stream collects the changes published
since it last sent, and sends them at most once per interval (a burst of task updates is one
message, and the page refetches once)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

# Most one message per this many seconds per stream.
COALESCE_SECONDS = 0.25
# A comment this often keeps proxies from closing an idle stream.
KEEPALIVE_SECONDS = 15.0

TOPICS = ("cluster", "pools", "queue", "jobs")


@dataclass
class Changes:
    """What changed since a stream last sent: topics and the jobs concerned."""

    topics: set[str] = field(default_factory=set)
    jobs: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.topics or self.jobs)


class Feed:
    """Publishers (any thread, cheap: they never block) and the streams that wait for changes.
    Thread-safe."""

    def __init__(
        self, coalesce: float = COALESCE_SECONDS, keepalive: float = KEEPALIVE_SECONDS
    ) -> None:
        self._cond = threading.Condition()
        self._streams: list[Changes] = []
        self._generation = 0  # publications so far
        self._closed = False
        self._coalesce = coalesce
        self._keepalive = keepalive

    def publish(self, topics: Iterable[str], jobs: Iterable[str] = ()) -> None:
        """Tell every stream that ``topics`` (and ``jobs``) changed."""
        with self._cond:
            self._generation += 1
            for pending in self._streams:
                pending.topics.update(topics)
                pending.jobs.update(jobs)
            self._cond.notify_all()

    def generation(self) -> int:
        """How many changes were published so far (answers built before a change are stale)."""
        with self._cond:
            return self._generation

    def job_changed(self, job_id: str) -> None:
        """The job manager committed events of ``job_id`` (an event bus listener): its tasks
        may have started or ended, so hosts, pools and queues may have changed too."""
        self.publish(TOPICS, (job_id,))

    def close(self) -> None:
        """End every stream (the daemon stops)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @contextmanager
    def stream(self) -> Iterator[Iterator[Changes | None]]:
        """A stream, subscribed as the block begins: iterated, each batch of changes published
        since (at most one per coalescing interval), or None after a keepalive interval without
        any, until the feed closes."""
        mine = Changes()
        with self._cond:
            self._streams.append(mine)
        try:
            yield self._batches(mine)
        finally:
            with self._cond:
                self._streams.remove(mine)

    def _batches(self, mine: Changes) -> Iterator[Changes | None]:
        sent = -self._coalesce
        while True:
            with self._cond:
                if not self._wait(mine, sent + self._coalesce):
                    return
                batch = Changes(set(mine.topics), set(mine.jobs)) if mine else None
                mine.topics.clear()
                mine.jobs.clear()
            if batch is not None:
                sent = time.monotonic()
            yield batch

    def _wait(self, mine: Changes, due: float) -> bool:
        """Wait (holding the lock) until ``mine`` has changes and ``due`` has passed, or a
        keepalive interval passed without changes; False once the feed is closed."""
        quiet_until = time.monotonic() + self._keepalive
        while not self._closed:
            now = time.monotonic()
            if mine and now >= due:
                return True
            if not mine and now >= quiet_until:
                return True
            self._cond.wait((due if mine else quiet_until) - now)
        return False
