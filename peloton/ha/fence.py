"""The fence of a leader's scheduling writes: an admission or a placement commits only in a
transaction that found the lease still this daemon's, under the epoch it leads in now.

The elector's own belief (:meth:`~peloton.ha.elector.Elector.epoch`, on the monotonic clock) is
asked first, then the database (:func:`peloton.storage.leases.holds`): a leader paused past its
term (SIGSTOP, a stalled VM) and resumed fails the first check at once, and one whose belief is
somehow late still fails the second once another daemon has taken over.
"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy.orm import Session

from peloton.errors import FailedPrecondition
from peloton.storage.leases import holds


class Leading(Protocol):
    """The elector, as the fence asks it."""

    @property
    def epoch(self) -> int | None: ...


class Deposed(FailedPrecondition):
    """This daemon no longer leads: its scheduling write is refused."""


class LeaderFence:
    """Called in a scheduling write's open transaction; raises :class:`Deposed` unless this
    daemon leads."""

    def __init__(self, elector: Leading, daemon_id: str) -> None:
        self._elector = elector
        self._me = daemon_id

    def __call__(self, session: Session) -> None:
        epoch = self._elector.epoch
        if epoch is None:
            raise Deposed(f"daemon {self._me} no longer leads: it schedules nothing")
        if not holds(session, self._me, epoch):
            raise Deposed(f"daemon {self._me} no longer holds the leader lease (epoch {epoch})")
