"""What a daemon believes about its leader lease: when to ask the database again, and until when
it may act as leader. No I/O, no clock: every time is the caller's monotonic clock.

The rules (the database holds the lease row and its expiry on the database's own clock, see
:mod:`peloton.storage.leases`):

- A daemon asks to acquire or renew the lease; the database grants it until its ``now() + ttl``.
  The daemon never learns that expiry on its own clock (the clocks differ), so it counts from the
  moment it *sent* the request, which precedes the database's ``now()``: it leads until
  ``sent + ttl - margin``. Any time the request spent in flight, queued or paused only shortens
  the daemon's belief, never lengthens it.
- ``margin`` covers the clocks' rates differing during one term (a monotonic clock that runs
  faster than the database's by ``margin / ttl`` at most is still safe).
- Another daemon takes the lease over only once the database's ``now()`` is past the expiry, so
  the old leader has stopped believing before then; every takeover gets a higher epoch.
- A failed or refused renewal ends nothing early by itself (the term still runs out on time), but
  a refusal means someone else holds the lease: the daemon stops believing at once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LeaseTiming:
    """The lease's time to live, how often it is renewed, and the safety margin, in seconds."""

    ttl: float
    renew_every: float

    def __post_init__(self) -> None:
        if not 0 < self.renew_every < self.ttl - self.margin:
            raise ValueError(
                f"the lease must be renewed more often than its {self.ttl:g}s time to live less "
                f"the {self.margin:g}s margin (renewing every {self.renew_every:g}s)"
            )

    @property
    def margin(self) -> float:
        # A fifth of the term: several renewals still fit, and clock rates differ far less.
        return self.ttl / 5


@dataclass
class Term:
    """One daemon's belief: the epoch it holds (None: not the leader) and until when."""

    timing: LeaseTiming
    epoch: int | None = None
    # Monotonic time at which the belief ends (meaningful while epoch is not None).
    until: float = 0.0

    def leads(self, now: float) -> bool:
        """Whether the daemon may act as leader at ``now``."""
        return self.epoch is not None and now < self.until

    def granted(self, sent: float, epoch: int) -> None:
        """The database granted (or renewed) the lease under ``epoch`` for a request sent at
        ``sent``."""
        self.epoch = epoch
        self.until = sent + self.timing.ttl - self.timing.margin

    def refused(self) -> None:
        """The database refused: another daemon holds the lease, or ours expired meanwhile."""
        self.epoch = None

    def renewal_due(self, now: float, last_sent: float) -> float:
        """When to send the next request after one sent at ``last_sent``: a leader renews every
        ``renew_every``, and a daemon that does not lead asks as often, to take over promptly."""
        return max(now, last_sent + self.timing.renew_every)

    def wake_at(self, now: float, last_sent: float) -> float:
        """When the daemon must next wake: the next request, or the end of its belief if that
        comes first (so that it stops leading on time even if the database does not answer)."""
        due = self.renewal_due(now, last_sent)
        return min(due, self.until) if self.leads(now) else due
