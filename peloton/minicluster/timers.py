"""One thread that runs callbacks at given times (re-sends, allocation, simulated tasks)."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Timer:
    """A scheduled callback; ``cancel()`` stops it if it has not run."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """Runs callbacks on one daemon thread in deadline order (``clock`` is monotonic seconds).

    Callbacks must be quick; an exception is logged and the thread goes on.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, name: str = "timers") -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, Timer, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        """Run ``fn`` after ``delay`` seconds."""
        timer = Timer()
        with self._cond:
            heapq.heappush(self._heap, (self.clock() + max(0.0, delay), next(self._seq), timer, fn))
            self._cond.notify()
        return timer

    def stop(self) -> None:
        """Stop the thread; pending callbacks never run. Idempotent."""
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if self._heap:
                        wait = self._heap[0][0] - self.clock()
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait()
                if self._stopped:
                    return
                _, _, timer, fn = heapq.heappop(self._heap)
            if timer.cancelled:
                continue
            try:
                fn()
            except Exception:
                log.exception("minicluster timer callback failed")
