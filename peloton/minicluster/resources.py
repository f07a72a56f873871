"""Mesos resource arithmetic for the minicluster: scalars (cpus, mem, disk, gpus), ranges (ports).

Pure and immutable. Mesos keeps scalars in fixed point with three decimals; so does this, so that
adding and subtracting the same amounts always gets back where it started.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Range = tuple[int, int]  # inclusive, begin <= end

_TEXT_ITEM = re.compile(r"^\s*([A-Za-z_][\w.-]*)\s*(?:\([^)]*\))?\s*:\s*(.+?)\s*$")
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def _fixed(value: float) -> float:
    return round(value, 3)


def normalize_ranges(ranges: Iterable[Range]) -> tuple[Range, ...]:
    """Sorted, merged (overlapping or adjacent) inclusive ranges."""
    out: list[list[int]] = []
    for begin, end in sorted(ranges):
        if out and begin <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([begin, end])
    return tuple((b, e) for b, e in out)


def subtract_ranges(have: Sequence[Range], take: Sequence[Range]) -> tuple[Range, ...]:
    """``have`` without any value in ``take`` (both normalized)."""
    out: list[Range] = []
    for begin, end in have:
        pieces = [(begin, end)]
        for tb, te in take:
            nxt: list[Range] = []
            for pb, pe in pieces:
                if te < pb or tb > pe:
                    nxt.append((pb, pe))
                    continue
                if pb < tb:
                    nxt.append((pb, tb - 1))
                if te < pe:
                    nxt.append((te + 1, pe))
            pieces = nxt
        out.extend(pieces)
    return tuple(out)


def ranges_contain(have: Sequence[Range], want: Sequence[Range]) -> bool:
    """Whether every value of ``want`` is in ``have`` (both normalized)."""
    return all(any(hb <= wb and we <= he for hb, he in have) for wb, we in want)


def range_count(ranges: Sequence[Range]) -> int:
    """How many values the ranges hold."""
    return sum(e - b + 1 for b, e in ranges)


@dataclass(frozen=True)
class ResourceSet:
    """An amount of agent resources: named scalars and named ranges, zero entries left out."""

    scalars: Mapping[str, float] = field(default_factory=dict)
    ranges: Mapping[str, tuple[Range, ...]] = field(default_factory=dict)

    @staticmethod
    def of(
        scalars: Mapping[str, float] | None = None,
        ranges: Mapping[str, Iterable[Range]] | None = None,
    ) -> ResourceSet:
        """A normalized set (zeros dropped, ranges merged)."""
        sc = {k: _fixed(v) for k, v in (scalars or {}).items() if _fixed(v) != 0}
        rg = {k: normalize_ranges(v) for k, v in (ranges or {}).items()}
        return ResourceSet(sc, {k: v for k, v in rg.items() if v})

    def __hash__(self) -> int:
        return hash((frozenset(self.scalars.items()), frozenset(self.ranges.items())))

    def scalar(self, name: str) -> float:
        """The amount of scalar ``name`` (0 if absent)."""
        return self.scalars.get(name, 0.0)

    def is_empty(self) -> bool:
        return not self.scalars and not self.ranges

    def __add__(self, other: ResourceSet) -> ResourceSet:
        # Fast paths matter: the master adds and subtracts per offer, 10,000 agents at a time.
        if other.is_empty():
            return self
        if self.is_empty():
            return other
        scalars = dict(self.scalars)
        for name, value in other.scalars.items():
            _put(scalars, name, scalars.get(name, 0.0) + value)
        ranges = self.ranges
        if other.ranges:
            ranges = dict(self.ranges)
            for name, more in other.ranges.items():
                ranges[name] = normalize_ranges((*ranges.get(name, ()), *more))
        return ResourceSet(scalars, ranges)

    def __sub__(self, other: ResourceSet) -> ResourceSet:
        """The difference; raises ValueError if ``other`` is not contained (a bookkeeping bug)."""
        if other.is_empty():
            return self
        scalars = dict(self.scalars)
        for name, value in other.scalars.items():
            left = _fixed(scalars.get(name, 0.0) - value)
            if left < 0:
                raise ValueError(f"cannot subtract {other} from {self}")
            _put(scalars, name, left)
        ranges = self.ranges
        if other.ranges:
            ranges = dict(self.ranges)
            for name, less in other.ranges.items():
                have = ranges.get(name, ())
                if not ranges_contain(have, less):
                    raise ValueError(f"cannot subtract {other} from {self}")
                rest = subtract_ranges(have, less)
                if rest:
                    ranges[name] = rest
                else:
                    ranges.pop(name, None)
        return ResourceSet(scalars, ranges)

    def contains(self, other: ResourceSet) -> bool:
        """Whether this set holds at least ``other``."""
        for k, v in other.scalars.items():
            if v > 0 and _fixed(self.scalars.get(k, 0.0) - v) < 0:
                return False
        return all(ranges_contain(self.ranges.get(k, ()), v) for k, v in other.ranges.items())

    def missing(self, other: ResourceSet) -> list[str]:
        """Human descriptions of what ``other`` wants beyond this set (empty if contained)."""
        out = []
        for k, v in sorted(other.scalars.items()):
            have = self.scalars.get(k, 0.0)
            if _fixed(have - v) < 0:
                out.append(f"{k}:{v:g} (only {have:g} offered)")
        for name, want in sorted(other.ranges.items()):
            have_ranges = self.ranges.get(name, ())
            if not ranges_contain(have_ranges, want):
                out.append(f"{name}:{format_ranges(want)} (offered {format_ranges(have_ranges)})")
        return out

    def to_json(self, role: str = "*", allocation_role: str | None = None) -> list[dict[str, Any]]:
        """Mesos v1 Resource messages (JSON), ranges first as a real master orders them."""
        out: list[dict[str, Any]] = []
        for name, rg in sorted(self.ranges.items()):
            out.append(
                {
                    "name": name,
                    "type": "RANGES",
                    "ranges": {"range": [{"begin": b, "end": e} for b, e in rg]},
                    "role": role,
                }
            )
        for name in _scalar_order(self.scalars):
            out.append(
                {
                    "name": name,
                    "type": "SCALAR",
                    "scalar": {"value": self.scalars[name]},
                    "role": role,
                }
            )
        if allocation_role is not None:
            for res in out:
                res["allocation_info"] = {"role": allocation_role}
        return out

    def to_state(self) -> dict[str, Any]:
        """The ``/master/state`` form: ``{"cpus": 8.0, "ports": "[31000-32000]"}``."""
        out: dict[str, Any] = dict(self.scalars)
        for name, rg in self.ranges.items():
            out[name] = format_ranges(rg)
        return out

    def __str__(self) -> str:
        parts = [f"{k}:{self.scalars[k]:g}" for k in _scalar_order(self.scalars)]
        parts += [f"{k}:{format_ranges(v)}" for k, v in sorted(self.ranges.items())]
        return ";".join(parts) or "(none)"


_ORDER = ("cpus", "gpus", "mem", "disk")


def _put(scalars: dict[str, float], name: str, value: float) -> None:
    value = _fixed(value)
    if value:
        scalars[name] = value
    else:
        scalars.pop(name, None)


def _scalar_order(scalars: Mapping[str, float]) -> list[str]:
    known = [k for k in _ORDER if k in scalars]
    return known + sorted(k for k in scalars if k not in _ORDER)


def format_ranges(ranges: Sequence[Range]) -> str:
    """Mesos's text form of ranges, ``[31000-31005, 31010-31010]``."""
    return "[" + ", ".join(f"{b}-{e}" for b, e in ranges) + "]"


# Sets are immutable: 10,000 agents of one spec share one parse.
@functools.lru_cache(maxsize=256)
def parse_text(text: str) -> ResourceSet:
    """Resources in the Mesos agent flag syntax: ``cpus:8;mem:32768;ports:[31000-32000]``.

    Raises ValueError naming the bad item.
    """
    scalars: dict[str, float] = {}
    ranges: dict[str, list[Range]] = {}
    for item in text.split(";"):
        if not item.strip():
            continue
        match = _TEXT_ITEM.match(item)
        if not match:
            raise ValueError(f"resource {item.strip()!r}: expected NAME:VALUE")
        name, value = match.group(1), match.group(2)
        if value.startswith("["):
            if not value.endswith("]"):
                raise ValueError(f"resource {name}: unterminated range list {value!r}")
            ranges[name] = _parse_ranges(name, value[1:-1])
            continue
        try:
            amount = float(value)
        except ValueError:
            raise ValueError(f"resource {name}: {value!r} is not a number") from None
        if amount < 0 or amount != amount:
            raise ValueError(f"resource {name}: must be a non-negative number (got {value})")
        scalars[name] = amount
    if "gpus" in scalars and scalars["gpus"] != int(scalars["gpus"]):
        raise ValueError(f"resource gpus: must be a whole number (got {scalars['gpus']:g})")
    return ResourceSet.of(scalars, ranges)


def _parse_ranges(name: str, text: str) -> list[Range]:
    out: list[Range] = []
    for part in text.split(","):
        if not part.strip():
            continue
        match = _RANGE.match(part)
        if not match:
            raise ValueError(f"resource {name}: bad range {part.strip()!r} (want BEGIN-END)")
        begin, end = int(match.group(1)), int(match.group(2))
        if begin > end:
            raise ValueError(f"resource {name}: range {begin}-{end} ends before it begins")
        out.append((begin, end))
    return out


def from_json(resources: Any, what: str = "resources") -> ResourceSet:
    """A set from Mesos v1 Resource messages (JSON); role, allocation_info and the like are
    ignored. Raises ValueError naming the bad entry."""
    if not isinstance(resources, list):
        raise ValueError(f"'{what}' must be a list of Resource")
    scalars: dict[str, float] = {}
    ranges: dict[str, list[Range]] = {}
    for i, res in enumerate(resources):
        where = f"{what}[{i}]"
        if not isinstance(res, dict) or not isinstance(res.get("name"), str) or not res["name"]:
            raise ValueError(f"{where}: a Resource needs a 'name'")
        name, kind = res["name"], res.get("type", "SCALAR")
        if kind == "SCALAR":
            value = (
                res.get("scalar", {}).get("value") if isinstance(res.get("scalar"), dict) else None
            )
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{where} ({name}): SCALAR needs a non-negative 'scalar.value'")
            scalars[name] = scalars.get(name, 0.0) + float(value)
        elif kind == "RANGES":
            ranges.setdefault(name, []).extend(_json_ranges(where, name, res.get("ranges")))
        else:
            raise ValueError(f"{where} ({name}): type {kind!r} is not supported (SCALAR, RANGES)")
    if "gpus" in scalars and scalars["gpus"] != int(scalars["gpus"]):
        raise ValueError(f"{what}: gpus must be a whole number (got {scalars['gpus']:g})")
    return ResourceSet.of(scalars, ranges)


def _json_ranges(where: str, name: str, value: Any) -> list[Range]:
    items = value.get("range", []) if isinstance(value, dict) else None
    if not isinstance(items, list):
        raise ValueError(f"{where} ({name}): RANGES needs 'ranges.range'")
    out: list[Range] = []
    for r in items:
        begin = r.get("begin") if isinstance(r, dict) else None
        end = r.get("end") if isinstance(r, dict) else None
        if not isinstance(begin, int) or not isinstance(end, int) or begin > end or begin < 0:
            raise ValueError(f"{where} ({name}): bad range {r!r}")
        out.append((begin, end))
    return out
