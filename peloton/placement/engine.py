"""Gang placement: a host for every task of a gang or none, packed to keep GPUs whole.

Pure: it reads a snapshot of the offer pool and returns hostnames by rank; leasing is the
launcher's job. For one gang:

1. **Filter.** Hosts whose attributes satisfy the task's constraints and that can hold at least one
   task (every kind, named ports, and the default executor's share once per host). A task without
   GPUs first tries hosts without free GPUs, so GPU hosts stay for GPU work unless nothing else
   fits. A GPU gang runs on one ``gpu_model``: hosts are grouped by it and each group is tried.
2. **Fewest hosts, then fewest racks.** Within a group, every rack (``rack`` attribute) that can
   hold the whole gang is tried; if none can, the racks with the most room are combined, as few
   as possible.
3. **Best fit.** Hosts are taken largest first until what is left fits on one host, and that last
   host is the *smallest* that holds the rest, so partly used hosts fill up and whole hosts stay
   whole (the fragmentation GPU users complain about).

Candidates are compared by (hosts, racks, GPUs left free on the hosts used): lower is better.
A task without GPUs trades this for keeping off GPU hosts (step 1).
Ranks are contiguous per host (local ranks 0..k-1 on each), hosts in the order chosen. Hosts with
the same free resources and attributes form one class, so a round costs per class, not per host.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from peloton.gang import Gang
from peloton.hostmgr.offers import HostOffers, port_count
from peloton.placement.firstfit import EXECUTOR_RESOURCES, Placement, matches
from peloton.resmgr.admission import describe
from peloton.resources import EPSILON, KINDS, Resources

# A task asking for nothing fits any number of times; count it as this many.
_UNBOUNDED = 1 << 20


@dataclass(eq=False)
class HostClass:
    """Hosts that are interchangeable for placement: the same free resources, free port count
    and attributes. Placement works on classes, so 10,000 identical hosts cost like one."""

    free: Resources
    ports: int
    attributes: Mapping[str, str]
    hostnames: list[str] = field(default_factory=list)
    # capacity() per (task resources, ports): a round asks the same for many gangs.
    _fits: dict[tuple[float, float, float, float, int], int] = field(default_factory=dict)

    @property
    def rack(self) -> str:
        return self.attributes.get("rack", "")

    @property
    def model(self) -> str:
        return self.attributes.get("gpu_model", "")

    def capacity(self, per_task: Resources, ports: int) -> int:
        """How many tasks of ``per_task`` (each with ``ports`` named ports) fit on one of these
        hosts, in one task group (whose executor takes its own share)."""
        # A plain tuple: hashing the dataclass on every lookup costs more than the lookup.
        key = (per_task.cpu, per_task.mem_mb, per_task.disk_mb, per_task.gpu, ports)
        known = self._fits.get(key)
        if known is None:
            known = self._fits[key] = self._capacity(per_task, ports)
        return known

    def _capacity(self, per_task: Resources, ports: int) -> int:
        room = self.free - EXECUTOR_RESOURCES
        fit = math.inf
        for k in KINDS:
            need = per_task.get(k)
            if need > EPSILON:
                fit = min(fit, math.floor((room.get(k) + EPSILON) / need))
            elif room.get(k) < -EPSILON:
                return 0
        if ports:
            fit = min(fit, self.ports // ports)
        return max(0, int(min(fit, _UNBOUNDED)))


@dataclass(frozen=True)
class Choice:
    """Where a gang goes: (class, tasks on each host, how many of its hosts), in rank order."""

    parts: tuple[tuple[HostClass, int, int], ...]

    def score(self, gpu_per_task: float) -> tuple[int, int, float]:
        """(hosts, racks, GPUs left idle on the hosts used): lower is better."""
        hosts = sum(h for _, _, h in self.parts)
        racks = len({c.rack for c, _, _ in self.parts})
        idle = sum(h * (c.free.gpu - t * gpu_per_task) for c, t, h in self.parts)
        return hosts, racks, idle


class Snapshot:
    """The offer pool's snapshot as one placement round sees it, hosts grouped into classes;
    a committed placement moves its hosts to the classes of what they have left."""

    def __init__(self, hosts: Iterable[HostOffers]) -> None:
        self._classes: dict[tuple[object, ...], HostClass] = {}
        self._class_of: dict[str, HostClass] = {}
        for h in hosts:
            self._add(h.hostname, h.free, port_count(h.ports), h.attributes)

    def classes(self) -> list[HostClass]:
        return [c for c in self._classes.values() if c.hostnames]

    def _add(self, name: str, free: Resources, ports: int, attrs: Mapping[str, str]) -> None:
        key = (free, ports, tuple(sorted(attrs.items())))
        cls = self._classes.get(key)
        if cls is None:
            cls = self._classes[key] = HostClass(free, ports, dict(attrs))
        cls.hostnames.append(name)
        self._class_of[name] = cls

    def drop(self, hostnames: Iterable[str]) -> None:
        """Leave these hosts out of the rest of the round (e.g. leased whole by a placement)."""
        for name in hostnames:
            cls = self._class_of.pop(name, None)
            if cls is not None:
                cls.hostnames.remove(name)

    def take(self, choice: Choice, per: Resources, nports: int) -> list[str]:
        """Hostnames by rank for ``choice``; their free resources shrink accordingly."""
        by_rank: list[str] = []
        for cls, tasks, hosts in choice.parts:
            names = [cls.hostnames.pop(0) for _ in range(hosts)]  # in snapshot order
            for name in names:
                del self._class_of[name]
            left = cls.free - per.scale(tasks) - EXECUTOR_RESOURCES
            for name in names:
                self._add(name, left, cls.ports - nports * tasks, cls.attributes)
                by_rank += [name] * tasks
        return by_rank


def place(gang: Gang, hosts: Sequence[HostOffers]) -> Placement:
    """Hosts by rank for every task of ``gang``, or None and why."""
    return place_on(gang, Snapshot(hosts))


def place_round(gangs: Sequence[Gang], hosts: Sequence[HostOffers]) -> list[Placement]:
    """Place gangs one after the other (in the given order, e.g. priority) on one snapshot:
    what a gang takes is gone for the next. Each gang is placed whole or not at all."""
    snapshot = Snapshot(hosts)
    return [place_on(gang, snapshot) for gang in gangs]


Eligible = list[tuple[HostClass, int]]


def place_on(gang: Gang, snapshot: Snapshot) -> Placement:
    """Place ``gang`` on ``snapshot`` (which then holds what is left)."""
    task = gang.spec.task
    per, nports, n = gang.per_task, len(task.ports), gang.size
    classes = snapshot.classes()
    constrained = len(task.constraints) > 0
    eligible = [
        (c, cap)
        for c in classes
        if (cap := c.capacity(per, nports)) > 0
        and (not constrained or matches(task.constraints, c.attributes))
    ]
    tiers = [eligible]
    if per.gpu <= EPSILON:
        # GPU hosts are kept for GPU work unless nothing else holds the gang.
        tiers = [[(c, k) for c, k in eligible if c.free.gpu <= EPSILON], eligible]
    for tier in tiers:
        groups = list(_by_model(tier).values()) if per.gpu > EPSILON else [tier]
        options = [choice for g in groups if (choice := _fewest_hosts(g, n, per.gpu))]
        if options:
            best = min(options, key=lambda o: o.score(per.gpu))
            return Placement(tuple(snapshot.take(best, per, nports)))
    return Placement(None, _why_not(gang, classes, eligible))


def _fewest_hosts(group: Eligible, n: int, gpu: float) -> Choice | None:
    """The fewest hosts, then racks, then idle GPUs, of ``group`` that hold ``n`` tasks."""
    if _room(group) < n:
        return None
    racks: dict[str, Eligible] = {}
    for c, cap in group:
        racks.setdefault(c.rack, []).append((c, cap))
    fewest = _best_fit(group, n)  # the fewest hosts, wherever they are
    if fewest is not None and fewest.score(gpu)[1] == 1:
        return fewest  # already on one rack: nothing can do better on hosts or racks
    options = [fewest]
    # One rack: the tightest racks first; the first that needs no more hosts than the fewest
    # possible is as good as any (it also keeps roomier racks for bigger gangs).
    least = fewest.score(gpu)[0] if fewest is not None else 0
    for hosts in sorted((hs for hs in racks.values() if _room(hs) >= n), key=_room):
        option = _best_fit(hosts, n)
        options.append(option)
        if option is not None and option.score(gpu)[0] <= least:
            break
    # The roomiest racks combined, as few as possible.
    combined: Eligible = []
    for hosts in sorted(racks.values(), key=lambda hs: -_room(hs)):
        combined += hosts
        if _room(combined) >= n:
            options.append(_best_fit(combined, n))
            break
    found = [o for o in options if o is not None]
    return min(found, key=lambda o: o.score(gpu)) if found else None


def _best_fit(group: Eligible, n: int) -> Choice | None:
    """Largest hosts first until the rest fits on one host, then the smallest host that holds
    the rest. Ties go to hosts with fewer free GPUs (fill what is already partly used)."""
    order = sorted(group, key=lambda h: (h[1], h[0].free.gpu, h[0].hostnames[0]))
    caps = [cap for _, cap in order]
    left = [len(c.hostnames) for c, _ in order]  # hosts of each class still unused
    parts: list[tuple[HostClass, int, int]] = []
    remaining = n
    while remaining > 0 and order:
        i = bisect.bisect_left(caps, remaining)
        if i < len(order):  # one host of the smallest class that holds the rest
            parts.append((order[i][0], remaining, 1))
            return Choice(tuple(parts))
        cls, cap = order[-1]  # the largest: as many of its hosts as the rest fills
        hosts = min(left[-1], remaining // cap)
        parts.append((cls, cap, hosts))
        remaining -= cap * hosts
        left[-1] -= hosts
        if left[-1] == 0:
            order.pop()
            caps.pop()
            left.pop()
    return Choice(tuple(parts)) if remaining <= 0 else None


def _room(group: Eligible) -> int:
    return sum(cap * len(c.hostnames) for c, cap in group)


def _by_model(eligible: Eligible) -> dict[str, Eligible]:
    out: dict[str, Eligible] = {}
    for c, cap in eligible:
        out.setdefault(c.model, []).append((c, cap))
    return out


def _why_not(gang: Gang, classes: list[HostClass], eligible: Eligible) -> str:
    """The binding constraint, for the job's pending reason."""
    per, n = gang.per_task, gang.size
    ask = f"{n} tasks of {describe(per)}"
    offered = sum(len(c.hostnames) for c in classes)
    if not offered:
        return f"no host offers free resources; the gang needs {ask}"
    matching = sum(
        len(c.hostnames) for c in classes if matches(gang.spec.task.constraints, c.attributes)
    )
    if not matching:
        return f"none of {offered} offered hosts matches the task constraints; needs {ask}"
    if not eligible:
        return f"none of {matching} matching hosts has room for one task; needs {ask}"
    largest = max(cap for _, cap in eligible)
    if per.gpu > EPSILON:
        model, room = max(((m, _room(g)) for m, g in _by_model(eligible).items()),
                          key=lambda mr: mr[1])  # fmt: skip
        named = f" {model}" if model else ""
        return (
            f"needs {ask} on one GPU model; the hosts with free{named} GPUs hold {room} "
            f"(largest host {largest})"
        )
    return f"needs {ask}; the hosts with room hold {_room(eligible)} (largest host {largest})"
