"""GPUs follow results: which running elastic trials grow, and to what size, with the GPUs a
sweep's budget has free (HyperSched's idea: capacity goes to the trials most likely to win).

No I/O, no clock. The leading trial (lowest loss) grows first, up to its gang's maximum, then
the next; a trial grows only by whole tasks that fit what is left. Trials without a loss yet,
and fixed gangs, never grow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Running:
    """A running trial: its gang's size now and at most, GPUs per task, and its best loss."""

    trial: str
    size: int
    max_size: int
    gpus_per_task: float
    loss: float | None


def plan_growth(running: Sequence[Running], free_gpus: float) -> dict[str, int]:
    """The new size of every trial that grows (trials that stay as they are are left out)."""
    grows: dict[str, int] = {}
    left = free_gpus
    ranked = sorted(
        (t for t in running if t.loss is not None and t.max_size > t.size),
        key=lambda t: (t.loss, t.trial),
    )
    for t in ranked:
        cost = t.gpus_per_task
        extra = t.max_size - t.size if cost <= 0 else min(t.max_size - t.size, int(left // cost))
        if extra > 0:
            grows[t.trial] = t.size + extra
            left -= extra * cost
    return grows
