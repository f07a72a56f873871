"""The cluster's capacity as judged over what it has had recently.

An agent that goes away (a reboot, a kernel upgrade, a network blip) usually comes back within
minutes, as Mesos itself assumes: it marks such agents unreachable, not gone, and keeps their
tasks. So a host lost less than a grace period ago still counts toward the capacity that decides
whether a gang can *ever* fit (a gang that needs it waits, with a reason naming the missing
hosts); only what is there now is admitted and placed into. Pure: the time is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from peloton.core.resources import ZERO, Resources


@dataclass(frozen=True)
class LostHost:
    """A host lost recently enough to still count toward the cluster's capacity."""

    hostname: str
    total: Resources
    lost_at: datetime
    counted_until: datetime


@dataclass(frozen=True)
class Lost:
    """A host the cluster lost: its name, total and when (input to :func:`recently_lost`)."""

    hostname: str
    total: Resources
    lost_at: datetime


def recently_lost(
    lost: Iterable[Lost], present: Iterable[str], now: datetime, grace_seconds: float
) -> tuple[LostHost, ...]:
    """The hosts of ``lost`` lost less than ``grace_seconds`` before ``now`` and not back
    (no host of ``present``, the hostnames there now, has their name: an agent that restarts
    comes back under a new id), by hostname."""
    back = set(present)
    grace = timedelta(seconds=grace_seconds)
    recent = {
        h.hostname: LostHost(h.hostname, h.total, h.lost_at, h.lost_at + grace)
        for h in sorted(lost, key=lambda h: h.lost_at)
        if h.hostname not in back and now < h.lost_at + grace
    }
    return tuple(recent[name] for name in sorted(recent))


def lost_total(lost: Sequence[LostHost]) -> Resources:
    """What the recently lost hosts had in all."""
    return sum((h.total for h in lost), ZERO)
