"""The open WatchJob streams of one daemon: admitted within quotas, woken only for their job.

A stream is a coroutine on the server's event loop, not a worker thread: thousands cost memory,
not the unary API's threads. It sleeps until its job changes: this daemon's writers publish the
job on the :class:`~peloton.jobmgr.events.EventBus`, and one poller reads which jobs got events
from any daemon (one query a second however many streams are open). A woken stream reads the
database on the shared executor, and the streams of one job woken together share one read (a
thousand streams on one job cost one query, not a thousand); at most ``read_slots`` reads run at
once, so that a burst of wakes leaves the other workers to the unary RPCs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter

from peloton.api.peers import client_of
from peloton.core.eventpoll import EventPoll
from peloton.errors import ResourceExhausted

log = logging.getLogger(__name__)

T = TypeVar("T")

# How often the poller looks for other daemons' events.
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class WatchQuotas:
    """Open streams allowed in all and per client (address); beyond: RESOURCE_EXHAUSTED."""

    total: int = 10_000
    per_client: int = 2_000


@dataclass(eq=False)
class Watch:
    """One open stream: its job and the flag its wakes set."""

    job_id: str
    client: str
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class WatchMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.open = Gauge("peloton_watches_open", "Open WatchJob streams.", registry=registry)
        self.refused = PromCounter(
            "peloton_watches_refused",
            "WatchJob streams refused for a quota (RESOURCE_EXHAUSTED), by quota.",
            ["quota"],
            registry=registry,
        )
        self.reads = PromCounter(
            "peloton_watch_reads",
            "Database reads of WatchJob streams (streams woken together share one).",
            registry=registry,
        )


class WatchHub:
    """Admits, wakes and ends the WatchJob streams; lives on one event loop."""

    def __init__(
        self,
        executor: Executor,
        quotas: WatchQuotas,
        changed_after: Callable[[int], Mapping[str, int]],
        newest: Callable[[], int],
        *,
        read_slots: int = 4,
        metrics: WatchMetrics | None = None,
    ) -> None:
        self._executor = executor
        self._quotas = quotas
        self._changed_after = changed_after
        self._newest = newest
        self._reads = asyncio.Semaphore(read_slots)
        self._metrics = metrics or WatchMetrics()
        self._by_job: dict[str, set[Watch]] = {}
        # Wakes per watched job, and the reads in flight per (job, after): (the wakes when the
        # read was started, its result).
        self._wakes: dict[str, int] = {}
        self._reading: dict[tuple[str, int], tuple[int, asyncio.Future[Any]]] = {}
        self._per_client: Counter[str] = Counter()
        self._open = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poller: asyncio.Task[None] | None = None
        self._poll_failing = False
        self.closed = False

    async def start(self) -> None:
        """Start polling for other daemons' events (call on the hub's loop, before serving)."""
        self._loop = asyncio.get_running_loop()
        self._poller = self._loop.create_task(self._poll(await self._mark()))

    async def _mark(self) -> EventPoll | None:
        """Polls from the newest event now (None: unknown, the database did not answer)."""
        try:
            mark = await self.read(self._newest)
        except Exception as exc:  # the database blinked; the next poll tries again
            self._poll_failed(exc)
            return None
        self._poll_failing = False
        return EventPoll(mark, time.monotonic())

    def _poll_failed(self, exc: Exception) -> None:
        """Log the first failure of a streak only (the database probe reports the outage)."""
        if not self._poll_failing:
            log.warning("watch poll failed", extra={"error": repr(exc)})
        self._poll_failing = True

    @contextmanager
    def open(self, job_id: str, peer: str) -> Iterator[Watch]:
        """Admit a stream of ``peer`` on ``job_id`` for the block, or raise ResourceExhausted."""
        client = client_of(peer)
        if self._open >= self._quotas.total:
            self._refuse("total", f"the server has {self._open} open watches, its most")
        if self._per_client[client] >= self._quotas.per_client:
            self._refuse(
                "per_client",
                f"client {client} has {self._per_client[client]} open watches, its most",
            )
        watch = Watch(job_id, client)
        self._by_job.setdefault(job_id, set()).add(watch)
        self._wakes.setdefault(job_id, 0)
        self._per_client[client] += 1
        self._open += 1
        self._metrics.open.inc()
        try:
            yield watch
        finally:
            self._close(watch)

    def _refuse(self, quota: str, why: str) -> None:
        self._metrics.refused.labels(quota).inc()
        log.warning("watch refused", extra={"quota": quota, "reason": why})
        raise ResourceExhausted(f"{why}; close one or retry later")

    def _close(self, watch: Watch) -> None:
        watchers = self._by_job[watch.job_id]
        watchers.discard(watch)
        if not watchers:
            del self._by_job[watch.job_id]
            del self._wakes[watch.job_id]
        self._per_client[watch.client] -= 1
        if not self._per_client[watch.client]:
            del self._per_client[watch.client]
        self._open -= 1
        self._metrics.open.dec()

    async def read(self, fn: Callable[[], T]) -> T:
        """Run a database read on the executor, within the read slots."""
        async with self._reads:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def wakes(self, job_id: str) -> int:
        """How often ``job_id``'s streams were woken: a stream notes it before it reads."""
        return self._wakes.get(job_id, 0)

    async def read_shared(self, job_id: str, after: int, seen: int, fn: Callable[[], T]) -> T:
        """``fn()``, the read of ``job_id``'s events after ``after``, shared with the other
        streams reading the same: a read in flight is joined only if it started after the wake
        ``seen`` (what it returns then includes every change that wake announced)."""
        key = (job_id, after)
        current = self._reading.get(key)
        if current is None or current[0] < seen:
            future: asyncio.Future[T] = asyncio.ensure_future(self.read(fn))
            self._metrics.reads.inc()
            current = (self.wakes(job_id), future)
            self._reading[key] = current
            future.add_done_callback(lambda done: self._read_done(key, done))
        # One stream going away must not cancel the read the others wait for.
        result: T = await asyncio.shield(current[1])
        return result

    def _read_done(self, key: tuple[str, int], future: asyncio.Future[Any]) -> None:
        if key in self._reading and self._reading[key][1] is future:
            del self._reading[key]
        if not future.cancelled():
            future.exception()  # retrieved: a failed read nobody awaits any more is no warning

    def publish(self, job_id: str) -> None:
        """Wake ``job_id``'s streams; callable from any thread (an EventBus listener)."""
        loop = self._loop
        if loop is None or job_id not in self._by_job:
            return  # nobody watches it; a stream opened meanwhile reads after registering
        with suppress(RuntimeError):  # the loop is closed: the server stopped
            loop.call_soon_threadsafe(self._wake, job_id)

    def _wake(self, job_id: str) -> None:
        watchers = self._by_job.get(job_id)
        if not watchers:
            return
        self._wakes[job_id] += 1
        for watch in watchers:
            watch.changed.set()

    async def close(self) -> None:
        """End every stream after what it is sending (the server is stopping)."""
        self.closed = True
        if self._poller is not None:
            self._poller.cancel()
        for job_id in list(self._by_job):
            self._wake(job_id)

    async def _poll(self, seen: EventPoll | None) -> None:
        """Wake the streams of jobs that got events from any daemon since the last poll (one
        committed after newer ones too: see :class:`EventPoll`). It polls whether or not
        anything is watched: a stream that opens reads its job after the poll's start, so
        every event committed after that read is found."""
        while True:
            await asyncio.sleep(POLL_SECONDS)
            if seen is None:
                seen = await self._mark()
                continue
            now = time.monotonic()
            try:
                newest = await self.read(partial(self._changed_after, seen.after(now)))
            except Exception as exc:  # the database blinked; the next poll tries again
                self._poll_failed(exc)
                continue
            self._poll_failing = False
            for job_id in seen.news(now, newest):
                self._wake(job_id)
