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

_TEXT_ITEM = re.compile(r"^\s*([A-Za-z_][\w.-]*)\s*(?:\(([^)]*)\))?\s*:\s*(.+?)\s*$")
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
    """An amount of agent resources: named scalars and named ranges (unreserved), and what is
    statically reserved for each role (``reserved``: role -> amounts, as an agent's
    ``--resources 'gpus(gpu):2;cpus:4'`` declares them). Zero entries are left out.

    Arithmetic and containment are per reservation: 2 cpus reserved for ``gpu`` do not hold
    1 unreserved cpu, as in Mesos.
    """

    scalars: Mapping[str, float] = field(default_factory=dict)
    ranges: Mapping[str, tuple[Range, ...]] = field(default_factory=dict)
    reserved: Mapping[str, ResourceSet] = field(default_factory=dict)

    @staticmethod
    def of(
        scalars: Mapping[str, float] | None = None,
        ranges: Mapping[str, Iterable[Range]] | None = None,
        reserved: Mapping[str, ResourceSet] | None = None,
    ) -> ResourceSet:
        """A normalized set (zeros dropped, ranges merged, empty reservations dropped)."""
        sc = {k: _fixed(v) for k, v in (scalars or {}).items() if _fixed(v) != 0}
        rg = {k: normalize_ranges(v) for k, v in (ranges or {}).items()}
        res = {
            role: ResourceSet.of(r.scalars, r.ranges)
            for role, r in (reserved or {}).items()
            if role != "*" and not r.is_empty()
        }
        unreserved = ResourceSet(sc, {k: v for k, v in rg.items() if v})
        star = (reserved or {}).get("*")
        if star is not None:
            unreserved = unreserved + ResourceSet.of(star.scalars, star.ranges)
        return ResourceSet(unreserved.scalars, unreserved.ranges, res)

    def __hash__(self) -> int:
        return hash(
            (
                frozenset(self.scalars.items()),
                frozenset(self.ranges.items()),
                frozenset(self.reserved.items()),
            )
        )

    def scalar(self, name: str) -> float:
        """The amount of scalar ``name``, reserved or not (0 if absent)."""
        value = self.scalars.get(name, 0.0)
        for part in self.reserved.values():
            value += part.scalars.get(name, 0.0)
        return _fixed(value)

    def is_empty(self) -> bool:
        return not self.scalars and not self.ranges and not self.reserved

    def unreserved(self) -> ResourceSet:
        """The unreserved part."""
        return self if not self.reserved else ResourceSet(self.scalars, self.ranges)

    def for_role(self, role: str) -> ResourceSet:
        """What a framework of ``role`` may be offered of this: the unreserved part and what is
        reserved for ``role`` (``*``: the unreserved part only)."""
        if not self.reserved:
            return self
        mine = self.reserved.get(role)
        return ResourceSet(self.scalars, self.ranges, {role: mine} if mine is not None else {})

    def pools(self) -> list[tuple[str, ResourceSet]]:
        """(role, amounts) for each reservation (sorted by role), then ``("*", unreserved)``."""
        out = [(role, self.reserved[role]) for role in sorted(self.reserved)]
        if self.scalars or self.ranges:
            out.append(("*", self.unreserved()))
        return out

    def __add__(self, other: ResourceSet) -> ResourceSet:
        # Fast paths matter: the master adds and subtracts per offer, 10,000 agents at a time.
        if other.is_empty():
            return self
        if self.is_empty():
            return other
        scalars, ranges = _plus(self, other)
        reserved = self.reserved
        if other.reserved:
            reserved = dict(self.reserved)
            for role, more in other.reserved.items():
                have = reserved.get(role)
                reserved[role] = more if have is None else have + more
        return ResourceSet(scalars, ranges, reserved)

    def __sub__(self, other: ResourceSet) -> ResourceSet:
        """The difference; raises ValueError if ``other`` is not contained (a bookkeeping bug)."""
        if other.is_empty():
            return self
        scalars, ranges = _minus(self, other)
        reserved = self.reserved
        if other.reserved:
            reserved = dict(self.reserved)
            for role, less in other.reserved.items():
                have = reserved.get(role)
                if have is None:
                    raise ValueError(f"cannot subtract {other} from {self}")
                rest = have - less
                if rest.is_empty():
                    del reserved[role]
                else:
                    reserved[role] = rest
        return ResourceSet(scalars, ranges, reserved)

    def contains(self, other: ResourceSet) -> bool:
        """Whether this set holds at least ``other``, reservation by reservation."""
        for k, v in other.scalars.items():
            if v > 0 and _fixed(self.scalars.get(k, 0.0) - v) < 0:
                return False
        if not all(ranges_contain(self.ranges.get(k, ()), v) for k, v in other.ranges.items()):
            return False
        for role, want in other.reserved.items():
            have = self.reserved.get(role)
            if have is None or not have.contains(want):
                return False
        return True

    def to_json(
        self, allocation_role: str | None = None, refinement: bool = False
    ) -> list[dict[str, Any]]:
        """Mesos v1 Resource messages (JSON): reservations first (by role), then the unreserved
        part, ranges first in each as a real master orders them.

        As a Mesos 1.11 master shows them to a framework with the RESERVATION_REFINEMENT
        capability (``refinement``): ``reservations: [{type: STATIC, role}]`` on reserved
        entries, no ``role``; to one without: the legacy ``role`` (``*`` when unreserved).
        ``allocation_role`` adds ``allocation_info`` (offers to MULTI_ROLE frameworks).
        """
        out: list[dict[str, Any]] = []
        for role, part in self.pools():
            entries: list[dict[str, Any]] = [
                {
                    "name": name,
                    "type": "RANGES",
                    "ranges": {"range": [{"begin": b, "end": e} for b, e in rg]},
                }
                for name, rg in sorted(part.ranges.items())
            ]
            entries += [
                {"name": name, "type": "SCALAR", "scalar": {"value": part.scalars[name]}}
                for name in _scalar_order(part.scalars)
            ]
            for res in entries:
                if not refinement:
                    res["role"] = role
                elif role != "*":
                    res["reservations"] = [{"type": "STATIC", "role": role}]
                if allocation_role is not None:
                    res["allocation_info"] = {"role": allocation_role}
            out += entries
        return out

    def to_state(self) -> dict[str, Any]:
        """The ``/master/state`` form, reserved and unreserved together:
        ``{"cpus": 8.0, "ports": "[31000-32000]"}``."""
        if not self.reserved:
            return _state(self)
        total = ResourceSet(self.scalars, self.ranges)
        for part in self.reserved.values():
            total = total + part
        return _state(total)

    def reserved_state(self) -> dict[str, dict[str, Any]]:
        """``/master/state``'s ``reserved_resources``: role -> its reserved amounts."""
        return {role: _state(part) for role, part in sorted(self.reserved.items())}

    def __str__(self) -> str:
        """Mesos agent flag syntax (``gpus(gpu):2;cpus:4;ports:[31000-32000]``)."""
        parts = []
        for role, part in self.pools():
            suffix = "" if role == "*" else f"({role})"
            parts += [f"{k}{suffix}:{part.scalars[k]:g}" for k in _scalar_order(part.scalars)]
            parts += [f"{k}{suffix}:{format_ranges(v)}" for k, v in sorted(part.ranges.items())]
        return ";".join(parts) or "(none)"


def _plus(
    a: ResourceSet, b: ResourceSet
) -> tuple[dict[str, float], Mapping[str, tuple[Range, ...]]]:
    """The unreserved parts of ``a`` and ``b`` added."""
    scalars = dict(a.scalars)
    for name, value in b.scalars.items():
        _put(scalars, name, scalars.get(name, 0.0) + value)
    ranges = a.ranges
    if b.ranges:
        ranges = dict(a.ranges)
        for name, more in b.ranges.items():
            ranges[name] = normalize_ranges((*ranges.get(name, ()), *more))
    return scalars, ranges


def _minus(
    a: ResourceSet, b: ResourceSet
) -> tuple[dict[str, float], Mapping[str, tuple[Range, ...]]]:
    """The unreserved part of ``b`` taken from ``a``'s; ValueError if not contained."""
    scalars = dict(a.scalars)
    for name, value in b.scalars.items():
        left = _fixed(scalars.get(name, 0.0) - value)
        if left < 0:
            raise ValueError(f"cannot subtract {b} from {a}")
        _put(scalars, name, left)
    ranges = a.ranges
    if b.ranges:
        ranges = dict(a.ranges)
        for name, less in b.ranges.items():
            have = ranges.get(name, ())
            if not ranges_contain(have, less):
                raise ValueError(f"cannot subtract {b} from {a}")
            rest = subtract_ranges(have, less)
            if rest:
                ranges[name] = rest
            else:
                ranges.pop(name, None)
    return scalars, ranges


def _state(part: ResourceSet) -> dict[str, Any]:
    out: dict[str, Any] = dict(part.scalars)
    for name, rg in part.ranges.items():
        out[name] = format_ranges(rg)
    return out


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
    """Resources in the Mesos agent flag syntax: ``cpus:8;mem:32768;ports:[31000-32000]``;
    ``NAME(ROLE):VALUE`` is statically reserved for ROLE (``gpus(gpu):2``; ``(*)`` is
    unreserved).

    Raises ValueError naming the bad item.
    """
    pools = _Pools()
    for item in text.split(";"):
        if not item.strip():
            continue
        match = _TEXT_ITEM.match(item)
        if not match:
            raise ValueError(f"resource {item.strip()!r}: expected NAME:VALUE")
        name, role, value = match.group(1), match.group(2), match.group(3)
        if role is not None:
            role = role.strip()
            if not role or any(c.isspace() for c in role) or role in (".", ".."):
                raise ValueError(f"resource {name}: bad role {role!r}")
        scalars, ranges = pools.of(role or "*")
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
    return pools.build("resource gpus")


class _Pools:
    """Scalars and ranges being gathered per reservation role (``*``: unreserved)."""

    def __init__(self) -> None:
        self.by_role: dict[str, tuple[dict[str, float], dict[str, list[Range]]]] = {}

    def of(self, role: str) -> tuple[dict[str, float], dict[str, list[Range]]]:
        return self.by_role.setdefault(role, ({}, {}))

    def build(self, gpus_what: str) -> ResourceSet:
        for scalars, _ in self.by_role.values():
            gpus = scalars.get("gpus", 0.0)
            if gpus != int(gpus):
                raise ValueError(f"{gpus_what}: must be a whole number (got {gpus:g})")
        scalars, ranges = self.by_role.get("*", ({}, {}))
        reserved = {
            role: ResourceSet.of(sc, rg) for role, (sc, rg) in self.by_role.items() if role != "*"
        }
        return ResourceSet.of(scalars, ranges, reserved)


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
    """A set from Mesos v1 Resource messages (JSON). The reservation is read from
    ``reservations`` (its last, the refined role) or else the legacy ``role`` (as a master
    upgrades it); allocation_info is ignored (see :func:`allocation_roles`). Raises ValueError
    naming the bad entry."""
    if not isinstance(resources, list):
        raise ValueError(f"'{what}' must be a list of Resource")
    pools = _Pools()
    for i, res in enumerate(resources):
        where = f"{what}[{i}]"
        if not isinstance(res, dict) or not isinstance(res.get("name"), str) or not res["name"]:
            raise ValueError(f"{where}: a Resource needs a 'name'")
        name, kind = res["name"], res.get("type", "SCALAR")
        scalars, ranges = pools.of(reservation_role(res, where))
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
    return pools.build(f"{what}: gpus")


def reservation_role(res: Mapping[str, Any], where: str = "resource") -> str:
    """The role a Resource (JSON) is reserved for, ``*`` if unreserved."""
    reservations = res.get("reservations")
    if reservations:
        last = reservations[-1] if isinstance(reservations, list) else None
        role = last.get("role") if isinstance(last, dict) else None
        if not isinstance(role, str) or not role:
            raise ValueError(f"{where}: 'reservations' must be a list of {{type, role}}")
        return role
    role = res.get("role", "*")
    if not isinstance(role, str) or not role:
        raise ValueError(f"{where}: 'role' must be a role name")
    return role


def allocation_roles(resources: Any) -> set[str]:
    """The roles named by the ``allocation_info`` of Resources (JSON) that carry one."""
    out: set[str] = set()
    for res in resources if isinstance(resources, list) else []:
        info = res.get("allocation_info") if isinstance(res, dict) else None
        role = info.get("role") if isinstance(info, dict) else None
        if isinstance(role, str):
            out.add(role)
    return out


def mesos_text(resources: Sequence[Mapping[str, Any]], allocation_role: str | None) -> str:
    """Resources (valid JSON) as a Mesos master prints them in its messages, equal entries
    merged in order: ``cpus(allocated: gpu)(reservations: [(STATIC,gpu)]):4; ports(allocated:
    gpu):[31000-32000]``. ``allocation_role`` is set on entries without allocation_info (the
    master injects the offer's)."""
    merged: dict[tuple[str, str, str | None, str], ResourceSet] = {}
    for res in resources:
        info = res.get("allocation_info")
        alloc = info.get("role") if isinstance(info, dict) else allocation_role
        key = (str(res["name"]), str(res.get("type", "SCALAR")), alloc, reservation_role(res))
        amount = from_json([{k: v for k, v in res.items() if k not in ("role", "reservations")}])
        merged[key] = merged[key] + amount if key in merged else amount
    parts = []
    for (name, kind, alloc, role), amount in merged.items():
        text = name
        if alloc is not None:
            text += f"(allocated: {alloc})"
        if role != "*":
            text += f"(reservations: [(STATIC,{role})])"
        if kind == "RANGES":
            value = format_ranges(amount.ranges.get(name, ()))
        else:
            value = f"{amount.scalar(name):.15g}"
        parts.append(f"{text}:{value}")
    return "; ".join(parts) or "{}"


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
