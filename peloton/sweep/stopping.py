"""Early stopping: ASHA (asynchronous successive halving, rungs on ``step``) and the median
stopping rule.

No I/O, no clock, no state: each decision is worked out from the reported metrics alone, so a
daemon that restarts decides as the one before it. Values are *losses*: lower is better (a
sweep that maximizes negates its objective first, see :func:`loss_of`). A trial's value at a
step is the last it reported at or before that step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# One trial's reports: (step, loss), in step order.
History = Sequence[tuple[int, float]]


def loss_of(value: float, maximize: bool) -> float:
    """The loss of objective ``value``: itself when minimizing, negated when maximizing."""
    return -value if maximize else value


def value_at(history: History, step: int) -> float | None:
    """The trial's value at ``step``: its last report at or before it (None: none yet)."""
    found = None
    for s, loss in history:
        if s > step:
            break
        found = loss
    return found


def best(history: History) -> float | None:
    """The lowest loss the trial reported (None: none)."""
    return min((loss for _, loss in history), default=None)


def last_step(history: History) -> int:
    """The highest step the trial reported (-1: none)."""
    return history[-1][0] if history else -1


@dataclass(frozen=True)
class Asha:
    """Rungs at ``min_step * eta**k`` up to ``max_step``. A trial is judged at the highest rung
    it reached, against every trial's value at that rung (theirs included, stopped or ended):
    it goes on only while it is among the best ``max(1, n // eta)`` of the ``n`` (ties broken
    by trial id, so exactly that many go on)."""

    min_step: int
    max_step: int
    eta: int = 3

    def __post_init__(self) -> None:
        if self.min_step < 1 or self.max_step < self.min_step or self.eta < 2:
            raise ValueError("ASHA needs 1 <= min_step <= max_step and eta >= 2")

    def rungs(self) -> list[int]:
        """The rung steps, lowest first (the last one below max_step: reaching max_step ends
        the trial anyway)."""
        out: list[int] = []
        step = self.min_step
        while step < self.max_step:
            out.append(step)
            step *= self.eta
        return out

    def rung_of(self, history: History) -> int | None:
        """The highest rung the trial reached (None: not the first yet)."""
        reached = [r for r in self.rungs() if last_step(history) >= r]
        return reached[-1] if reached else None

    def keeps(self, rung: int, histories: Mapping[str, History]) -> set[str]:
        """The trials the rung keeps: the best ``max(1, n // eta)`` of the ``n`` there."""
        at = sorted(
            (v, trial)
            for trial, h in histories.items()
            if last_step(h) >= rung and (v := value_at(h, rung)) is not None
        )
        return {trial for _, trial in at[: max(1, len(at) // self.eta)]}

    def stop(self, trial: str, histories: Mapping[str, History]) -> str:
        """Why ``trial`` stops now ("": it goes on)."""
        rung = self.rung_of(histories[trial])
        if rung is None or trial in self.keeps(rung, histories):
            return ""
        reached = sum(1 for h in histories.values() if last_step(h) >= rung)
        return (
            f"ASHA: not in the best {max(1, reached // self.eta)} of {reached} trials "
            f"at rung step {rung}"
        )


@dataclass(frozen=True)
class MedianStopping:
    """A trial past ``grace_steps`` stops when its best loss so far is worse than the median of
    the other trials' best losses up to the same step, among at least ``min_trials`` others
    that reached it."""

    grace_steps: int = 0
    min_trials: int = 3

    def stop(self, trial: str, histories: Mapping[str, History]) -> str:
        """Why ``trial`` stops now ("": it goes on)."""
        mine = histories[trial]
        step = last_step(mine)
        if step < self.grace_steps:
            return ""
        own = best(mine)
        others = [
            b
            for other, h in histories.items()
            if other != trial and last_step(h) >= step
            if (b := best([(s, v) for s, v in h if s <= step])) is not None
        ]
        if own is None or len(others) < self.min_trials:
            return ""
        median = statistics.median(others)
        if own > median:
            return (
                f"median rule: best {own:.6g} at step {step} is worse than the median "
                f"{median:.6g} of {len(others)} other trials"
            )
        return ""


def is_number(value: float) -> bool:
    """Whether a reported value counts: NaN and infinities do not (README "Sweeps")."""
    return math.isfinite(value)
