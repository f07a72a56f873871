"""The election: a thread that keeps asking the database for the leader lease, and tells whoever
asks whether this daemon leads now.

Whether it leads is computed on every question from the monotonic clock (see
:class:`~peloton.core.term.Term`), not set by the thread: a thread stuck on a database that
stopped answering, or a whole process paused (SIGSTOP, a long GC, a VM migration), reads "not the
leader" from the first instant after its term, before any other daemon can have taken the lease
over.

Threads: one of its own; every request it sends is bounded by the renewal interval, on a
connection of its own (a pool exhausted by RPCs must not cost the lease).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from peloton.core.term import LeaseTiming, Term
from peloton.ha.metrics import LeaderMetrics
from peloton.storage.deadline import RpcScope, scoped

log = logging.getLogger(__name__)


class LeaseStore(Protocol):
    """The database side of the lease (:class:`peloton.storage.leases.SqlLeaseStore`)."""

    def hold(self, address: str, epoch: int | None, ttl: float) -> int | None: ...

    def release(self, epoch: int) -> None: ...


class Elector:
    """Acquires, renews and on :meth:`stop` releases the lease for this daemon."""

    def __init__(
        self,
        store: LeaseStore,
        address: str,
        timing: LeaseTiming,
        metrics: LeaderMetrics,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        """``on_change(leads)``: called on the election's thread when this daemon becomes the
        leader or stops being it, once per change, as soon as the thread sees it."""
        self._store = store
        self._on_change = on_change
        self._address = address
        self._timing = timing
        self._metrics = metrics
        self._clock = clock
        self._term = Term(timing)
        self._lock = threading.Lock()  # the term: the thread writes it, RPCs and scrapes read it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-elector", daemon=True)
        self._reported = False  # whether the log and the counter last said "leader"
        self._failing = False  # whether the last request failed (logged once per outage)

    def leads(self) -> bool:
        """Whether this daemon may act as leader now."""
        with self._lock:
            return self._term.leads(self._clock())

    @property
    def epoch(self) -> int | None:
        """The epoch of the term this daemon leads in now (None: it does not lead)."""
        with self._lock:
            return self._term.epoch if self._term.leads(self._clock()) else None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop asking, and give the lease up if held so that another daemon takes over now."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        epoch = self.epoch
        with self._lock:
            self._term.refused()
        if self._reported:
            self._reported = False
            self._metrics.changes.inc()
        if epoch is None:
            return
        try:
            with scoped(RpcScope(self._timing.renew_every)):
                self._store.release(epoch)
        except Exception as exc:  # it expires on its own within the time to live
            log.warning("could not release the leader lease", extra={"error": str(exc)})
            return
        log.info("this daemon released the leader lease", extra={"epoch": epoch})

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = self._clock()
            self._ask(sent)
            self._report()
            while not self._stop.is_set():
                now = self._clock()
                with self._lock:
                    wake = self._term.wake_at(now, sent)
                    due = self._term.renewal_due(now, sent)
                if now >= due:
                    break
                self._stop.wait(wake - now)
                # The belief may have ended while waiting: say so before the next request.
                self._report()

    def _ask(self, sent: float) -> None:
        """One request to the database, sent at ``sent``: renew while leading, else acquire."""
        with self._lock:
            epoch = self._term.epoch if self._term.leads(sent) else None
        try:
            with scoped(RpcScope(self._timing.renew_every)):
                held = self._store.hold(self._address, epoch, self._timing.ttl)
        except Exception as exc:  # the term still runs out on time; the next request may pass
            if not self._failing:
                log.warning("cannot reach the leader lease", extra={"error": str(exc)})
            self._failing = True
            return
        finally:
            self._metrics.renew_seconds.observe(self._clock() - sent)
        if self._failing:
            log.info("the leader lease answers again")
        self._failing = False
        with self._lock:
            if held is None:
                self._term.refused()
            else:
                self._term.granted(sent, held)

    def _report(self) -> None:
        """Log and count a change of leadership once, when this thread first sees it."""
        with self._lock:
            now = self._clock()
            leads, epoch = self._term.leads(now), self._term.epoch
        if leads == self._reported:
            return
        self._reported = leads
        self._metrics.changes.inc()
        if leads:
            log.info("this daemon is the leader", extra={"epoch": epoch})
        else:
            log.warning("this daemon is no longer the leader")
        if self._on_change is not None:
            self._on_change(leads)
