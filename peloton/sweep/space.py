"""A sweep's search space: named parameters, each uniform, log-uniform, integer or a choice.

No I/O, no clock: sampling takes its random generator, so a seed gives the same trials again.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from peloton.errors import InvalidArgument

Value = float | int | str


@dataclass(frozen=True)
class Uniform:
    """A float drawn evenly from [low, high]."""

    low: float
    high: float


@dataclass(frozen=True)
class LogUniform:
    """A float whose logarithm is drawn evenly from [log low, log high] (low > 0)."""

    low: float
    high: float


@dataclass(frozen=True)
class IntRange:
    """An integer drawn evenly from low..high, both included."""

    low: int
    high: int


@dataclass(frozen=True)
class Choice:
    """One of ``values``."""

    values: tuple[Value, ...]


Param = Uniform | LogUniform | IntRange | Choice
Space = Mapping[str, Param]
Point = dict[str, Value]


def check_space(space: Space, field: str = "space") -> None:
    """Raise InvalidArgument naming the first malformed parameter (``space.<name>.<what>``)."""
    if not space:
        raise InvalidArgument(field, "needs at least one parameter")
    for name, param in space.items():
        where = f"{field}.{name}"
        if not name.isidentifier():
            raise InvalidArgument(where, "a parameter name is letters, digits and _")
        if isinstance(param, Choice):
            if not param.values:
                raise InvalidArgument(f"{where}.values", "needs at least one value")
            continue
        if not (math.isfinite(param.low) and math.isfinite(param.high)):
            raise InvalidArgument(f"{where}.low", "low and high must be finite")
        if param.low > param.high:
            raise InvalidArgument(f"{where}.low", f"{param.low} is above high {param.high}")
        if isinstance(param, LogUniform) and param.low <= 0:
            raise InvalidArgument(f"{where}.low", "a log-uniform range starts above 0")


def sample(space: Space, rng: random.Random) -> Point:
    """One point of ``space``, parameters drawn in name order."""
    return {name: _draw(space[name], rng) for name in sorted(space)}


def _draw(param: Param, rng: random.Random) -> Value:
    if isinstance(param, Uniform):
        return rng.uniform(param.low, param.high)
    if isinstance(param, LogUniform):
        return math.exp(rng.uniform(math.log(param.low), math.log(param.high)))
    if isinstance(param, IntRange):
        return rng.randint(param.low, param.high)
    return param.values[rng.randrange(len(param.values))]


def axis(param: Param, points: int) -> Sequence[Value]:
    """The values a grid takes of ``param``: ``points`` evenly spaced (geometrically for a
    log-uniform range), every integer of a range no longer than that, every choice."""
    if isinstance(param, Choice):
        return param.values
    if isinstance(param, IntRange):
        count = param.high - param.low + 1
        if count <= points:
            return range(param.low, param.high + 1)
        step = (param.high - param.low) / (points - 1)
        return sorted({round(param.low + i * step) for i in range(points)})
    if points == 1 or param.low == param.high:
        return [param.low]
    if isinstance(param, LogUniform):
        lo, hi = math.log(param.low), math.log(param.high)
        return [math.exp(lo + (hi - lo) * i / (points - 1)) for i in range(points)]
    return [param.low + (param.high - param.low) * i / (points - 1) for i in range(points)]


def grid(space: Space, points: int) -> Iterator[Point]:
    """Every point of the grid over ``space`` (:func:`axis` per parameter, names in order)."""
    names = sorted(space)
    for values in itertools.product(*(axis(space[n], points) for n in names)):
        yield dict(zip(names, values, strict=True))
