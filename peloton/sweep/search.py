"""The built-in search algorithms, random and grid, behind the :class:`Searcher` protocol that
Optuna's samplers also serve (:mod:`peloton.sweep.optuna_search`).

No I/O, no clock. A built-in searcher keeps no state between trials: trial ``index``'s point
depends only on the seed and the index, so a daemon that restarts suggests the same points.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from peloton.sweep.space import Point, Space, grid, sample

# Grid points per float axis when the sweep names none.
DEFAULT_GRID_POINTS = 3


@dataclass(frozen=True)
class Suggestion:
    """The parameters of a new trial, and the search algorithm's own id of it (Optuna's trial
    number; -1 for the built-in ones, which need none)."""

    params: Point
    ref: int = -1


class Searcher(Protocol):
    """Where a sweep's trials' parameters come from."""

    def suggest(self, index: int) -> Suggestion | None:
        """The parameters of trial ``index`` (0, 1, ...); None: the space is exhausted."""
        ...

    def observe(self, ref: int, loss: float | None) -> None:
        """Trial ``ref`` ended with ``loss`` (lower is better); None: it failed or stopped early
        without one."""
        ...


class RandomSearch:
    """Points drawn independently; trial ``index`` draws from a generator seeded by the sweep's
    seed and the index."""

    def __init__(self, space: Space, seed: int) -> None:
        self._space = space
        self._seed = seed

    def suggest(self, index: int) -> Suggestion | None:
        return Suggestion(sample(self._space, random.Random(f"{self._seed}/{index}")))

    def observe(self, ref: int, loss: float | None) -> None:
        """Random search learns nothing from results."""


class GridSearch:
    """Every point of the grid, in order, then no more."""

    def __init__(self, space: Space, points: int = DEFAULT_GRID_POINTS) -> None:
        self._points = list(grid(space, points))

    def __len__(self) -> int:
        return len(self._points)

    def suggest(self, index: int) -> Suggestion | None:
        return Suggestion(self._points[index]) if index < len(self._points) else None

    def observe(self, ref: int, loss: float | None) -> None:
        """A grid is fixed in advance."""
