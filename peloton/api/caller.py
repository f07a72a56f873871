"""The caller of the RPC being served, for the services that check permissions and record
owners. The interceptor sets it around each handler (on the worker thread that runs a unary
RPC, in the task of a stream); outside an RPC it is the anonymous caller."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from peloton.core.access import ANONYMOUS, Caller

_CALLER: ContextVar[Caller] = ContextVar("peloton_caller", default=ANONYMOUS)


def current_caller() -> Caller:
    """Who calls the RPC being served."""
    return _CALLER.get()


@contextmanager
def acting_as(caller: Caller) -> Iterator[None]:
    """Serve the block as ``caller``."""
    token = _CALLER.set(caller)
    try:
        yield
    finally:
        _CALLER.reset(token)


def set_caller(caller: Caller) -> None:
    """Serve the rest of the current asyncio task as ``caller`` (each RPC on the event loop is
    a task of its own, so nothing needs resetting)."""
    _CALLER.set(caller)
