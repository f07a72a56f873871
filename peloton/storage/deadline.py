"""Time budgets for database work, carried in context variables so that no caller passes them.

The API interceptor runs each unary RPC under an :class:`RpcScope`: it knows the client's
deadline, and ends it when the RPC ends, however it ends. :class:`peloton.storage.db.Database` reads
the scope to bound each transaction (statement timeout, pool checkout, the driver's waits) and
registers the connections it uses with it, so that an RPC the client cancelled, or whose deadline
passed, cuts the connection its query runs on instead of letting the query run on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

# The share of an RPC's remaining time kept back to answer it (and at most this many seconds),
# so that the client hears UNAVAILABLE from us rather than its own DEADLINE_EXCEEDED.
ANSWER_RESERVE = 0.1
ANSWER_RESERVE_MAX_SECONDS = 0.5


T = TypeVar("T")


class RpcScope:
    """One RPC's deadline and the database connections it holds while it runs."""

    def __init__(self, seconds_left: float | None) -> None:
        self.deadline = None if seconds_left is None else time.monotonic() + seconds_left
        self._lock = threading.Lock()
        self._held: dict[int, Callable[[], None]] = {}
        self.ended = False

    def database_seconds(self) -> float | None:
        """Seconds the database may take, the answer's reserve deducted (None: no deadline)."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        return left - min(left * ANSWER_RESERVE, ANSWER_RESERVE_MAX_SECONDS)

    def hold(self, key: int, cut: Callable[[], None]) -> None:
        """Note a connection this RPC uses; ``cut`` aborts whatever runs on it."""
        with self._lock:
            if self.ended:
                cut()  # the RPC is over: whatever it starts now has nobody to answer
                return
            self._held[key] = cut

    def release(self, key: int) -> None:
        # Under the lock: a connection is never cut once another RPC may have it.
        with self._lock:
            self._held.pop(key, None)

    def end(self) -> None:
        """The RPC is over (answered, cancelled or past its deadline): cut what it still holds."""
        with self._lock:
            self.ended = True
            for cut in self._held.values():
                cut()
            self._held.clear()


_scope: ContextVar[RpcScope | None] = ContextVar("peloton_rpc_scope", default=None)


def current_scope() -> RpcScope | None:
    return _scope.get()


@contextmanager
def _set(var: ContextVar[T | None], value: T) -> Iterator[T]:
    """``var`` is ``value`` within the block (and what it was before after it)."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


def scoped(scope: RpcScope) -> AbstractContextManager[RpcScope]:
    """Run the block's database work under ``scope``."""
    return _set(_scope, scope)


@dataclass(frozen=True)
class Limits:
    """The bounds on the running transaction the driver hooks enforce (monotonic times)."""

    # The whole transaction's end, from an RPC's deadline; None: background work, where each
    # statement gets ``statement_seconds`` instead.
    deadline: float | None
    statement_seconds: float
    connect_seconds: float


_limits: ContextVar[Limits | None] = ContextVar("peloton_db_limits", default=None)


def current_limits() -> Limits | None:
    return _limits.get()


def limits(value: Limits) -> AbstractContextManager[Limits]:
    """Run the block's driver waits under ``value``."""
    return _set(_limits, value)
