"""Gang placement: a host for every task of a gang or none, packed to keep GPUs whole or
spread over hosts and racks.

Pure: it reads a snapshot of the offer pool and returns agent ids by rank; leasing is the
launcher's job. For one gang:

1. **Filter.** Hosts whose attributes satisfy the task's constraints (a list ANDed; an ``any_of``
   item ORs its branches) and that can hold at least one task (every kind, named ports, and the
   default executor's share once per host). A task without GPUs first tries hosts without free
   GPUs, so GPU hosts stay for GPU work unless nothing else fits. A GPU gang runs on one
   ``gpu_model``: hosts are grouped by it and each group is tried.

``placement: pack`` (the default; empty means pack):

2. **Fewest hosts, then fewest racks.** Within a group, every rack (``rack`` attribute) that can
   hold the whole gang is tried; if none can, the racks with the most room are combined, as few
   as possible.
3. **Best fit.** Hosts are taken largest first until what is left fits on one host, and that last
   host is the *smallest* that holds the rest, so partly used hosts fill up and whole hosts stay
   whole (the fragmentation GPU users complain about).

   Candidates are compared by (hosts, racks, GPUs left free on the hosts used): lower is better.

``placement: spread`` (tasks that want a host's network, memory bandwidth or disk to themselves,
such as parameter servers or data loaders):

2. **Level.** The fewest tasks per host L at which the group's hosts hold the gang, each at most
   its room: ``n`` tasks on ``n`` or more hosts go one per host (L = 1); on fewer hosts at most
   ceil(n / hosts) per host where hosts have that room. Every host takes min(room, L - 1).
3. **In turn.** The rest go one more per host on hosts taken one rack at a time in turn, so they
   cover as many racks as there are; racks with the roomiest host first, each rack's roomiest
   hosts first (room: how many of the task a host holds, then its free GPUs).

   Candidates are compared by (most tasks on one host, then more racks, then more hosts).

Either way a task without GPUs keeps off GPU hosts while others hold the gang (step 1), which
comes before the comparison. Ranks are contiguous per host (local ranks 0..k-1 on each), hosts in
the order chosen. Hosts with the same free resources and attributes form one class, so a round
costs per class, not per host.

Mid-trace a cluster's hosts differ (free GPUs 0-8, cpus, memory, ports) and classes number in the
thousands, so from :data:`_INDEXED_FROM` classes on a snapshot also keeps them as NumPy columns
and, per task shape, how many tasks each class holds, brought up to date from a journal of the
classes placements changed; for GPU tasks it keeps each cap's classes in best fit's order and
each rack's sums (:class:`_Levels`). A gang is then placed from the top of those instead of a
pass over every class, with the same choice: each option is best fit on the few classes that
decide it (the class-by-class path, :func:`_place_plain`, is the definition; tests compare).

When a gang is not placed the reason names what binds: a task bigger than any host, too few hosts
with room for one task each, or too little room (or too few GPUs) on one GPU model, plus the
constraints that rule out hosts with room. :func:`never_fits` runs the same placement on the
cluster's total resources to tell "not now" from "never"; :func:`gpu_fragmentation` measures the
free GPUs stranded on hosts too small for the largest waiting request.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from peloton.core.constraints import matches
from peloton.core.gang import Gang, Placement
from peloton.core.offers import HostOffers, port_count
from peloton.core.resources import (
    EPSILON,
    EXECUTOR_RESOURCES,
    KINDS,
    Resources,
    describe,
    format_amount,
)
from peloton.v1 import job_pb2

# A task asking for nothing fits any number of times; count it as this many.
_UNBOUNDED = 1 << 20


@dataclass(eq=False)
class HostClass:
    """Hosts that are interchangeable for placement: the same free resources, free port count
    and attributes. Placement works on classes, so 10,000 identical hosts cost like one."""

    free: Resources
    ports: int
    attributes: Mapping[str, str]
    agent_ids: list[str] = field(default_factory=list)
    # capacity() per (task resources, ports): a round asks the same for many gangs.
    _fits: dict[tuple[float, float, float, float, int], int] = field(default_factory=dict)
    # Its row in the snapshot's arrays: classes are numbered in the order they are made.
    seq: int = field(default=-1, repr=False)

    @property
    def rack(self) -> str:
        return self.attributes.get("rack", "")

    @property
    def model(self) -> str:
        return self.attributes.get("gpu_model", "")

    def capacity(self, per_task: Resources, ports: int) -> int:
        """How many tasks of ``per_task`` (each taking ``ports`` host ports) fit on one of these
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

    def binders(self, per_task: Resources, ports: int) -> list[str]:
        """The kinds (and ``ports``) that cap how many tasks one of these hosts holds: those
        whose share of the host, the executor's taken first, is used up first."""
        cap = self.capacity(per_task, ports)
        room = self.free - EXECUTOR_RESOURCES
        out = [
            k
            for k in KINDS
            if per_task.get(k) > EPSILON
            and math.floor((room.get(k) + EPSILON) / per_task.get(k)) == cap
        ]
        if ports and self.ports // ports == cap:
            out.append("ports")
        return out


@dataclass(frozen=True)
class Choice:
    """Where a gang goes: (class, tasks on each host, how many of its hosts), in rank order."""

    parts: tuple[tuple[HostClass, int, int], ...]

    @property
    def hosts(self) -> int:
        return sum(h for _, _, h in self.parts)

    @property
    def racks(self) -> int:
        return len({c.rack for c, _, _ in self.parts})

    def pack_score(self, gpu_per_task: float) -> tuple[int, int, float]:
        """(hosts, racks, GPUs left idle on the hosts used): lower is better."""
        idle = sum(h * (c.free.gpu - t * gpu_per_task) for c, t, h in self.parts)
        return self.hosts, self.racks, idle

    def spread_score(self) -> tuple[int, int, int]:
        """(most tasks on one host, fewer racks, fewer hosts): lower is better."""
        return max(t for _, t, _ in self.parts), -self.racks, -self.hosts


class Snapshot:
    """The offer pool's snapshot as one placement round sees it, hosts grouped into classes;
    a committed placement moves its hosts to the classes of what they have left.

    Mid-trace, hosts differ (free GPUs, cpus, memory, ports) and classes number in the
    thousands, so besides the classes the snapshot keeps their columns in NumPy (:class:`_Table`)
    and, per task shape it was asked about, how many tasks each class holds (:class:`_Fit`),
    brought up to date from a journal of the classes that changed: a placement then reads
    arrays instead of walking every class.
    """

    def __init__(self, hosts: Iterable[HostOffers]) -> None:
        self._classes: dict[tuple[object, ...], HostClass] = {}
        self._class_of: dict[str, HostClass] = {}
        self._table: _Table | None = None
        for h in hosts:
            self._add(h.agent_id, h.free, port_count(h.ports), h.attributes)
        if len(self._classes) >= _INDEXED_FROM:
            self._index()

    def _index(self) -> _Table:
        """The classes' arrays, made once: when the snapshot is taken if it has many classes,
        else when placements have made that many."""
        if self._table is not None:
            return self._table
        self._by_seq = list(self._classes.values())  # classes in the order they were made
        for i, cls in enumerate(self._by_seq):
            cls.seq = i
        # An agent's rank among all agent ids: the engine breaks ties by the first agent id.
        self._names = sorted(self._class_of)  # by rank
        self._rank = {name: i for i, name in enumerate(self._names)}
        self._ids: dict[str, dict[str, int]] = {"rack": {}, "model": {}}
        self._ids_by_attrs: dict[object, tuple[int, int, int]] = {}
        self._attr_sets: list[Mapping[str, str]] = []  # by attribute-set id
        # (rack, GPU model, attribute set) ids by seq
        self._row = [self._ids_of(key, cls) for key, cls in self._classes.items()]
        self._rack_rows: list[list[int]] = [[] for _ in self._ids["rack"]]  # seqs by rack id
        for i, (rack, _, _) in enumerate(self._row):
            self._rack_rows[rack].append(i)
        self._table = _Table(self)
        self._journal: list[int] = []  # seqs of the classes changed since the table was made
        self._fits: dict[tuple[object, ...], _Fit] = {}
        return self._table

    def classes(self) -> list[HostClass]:
        return [c for c in self._classes.values() if c.agent_ids]

    def _add(self, name: str, free: Resources, ports: int, attrs: Mapping[str, str]) -> None:
        key = (free, ports, tuple(sorted(attrs.items())))
        cls = self._classes.get(key)
        if cls is None:
            cls = self._new(key, free, ports, attrs)
        cls.agent_ids.append(name)
        self._class_of[name] = cls

    def _new(
        self, key: tuple[object, ...], free: Resources, ports: int, attrs: Mapping[str, str]
    ) -> HostClass:
        cls = self._classes[key] = HostClass(free, ports, dict(attrs))
        if self._table is not None:  # made by a placement: the next row
            cls.seq = len(self._by_seq)
            self._by_seq.append(cls)
            self._row.append(self._ids_of(key, cls))
            self._rack_rows[self._row[-1][0]].append(cls.seq)
        return cls

    def _ids_of(self, key: tuple[object, ...], cls: HostClass) -> tuple[int, int, int]:
        """(rack, GPU model, attribute set) ids of the class of ``key``."""
        ids = self._ids_by_attrs.get(key[2])
        if ids is None:
            racks, models = self._ids["rack"], self._ids["model"]
            rack = racks.setdefault(cls.rack, len(racks))
            model = models.setdefault(cls.model, len(models))
            ids = self._ids_by_attrs[key[2]] = (rack, model, len(self._attr_sets))
            self._attr_sets.append(cls.attributes)
        return ids

    def _touch(self, cls: HostClass) -> None:
        """Record that ``cls`` gained or lost hosts (or was made), once the arrays are made."""
        if self._table is not None:
            self._table.put(self, cls)
            self._journal.append(cls.seq)

    def drop(self, agent_ids: Iterable[str]) -> None:
        """Leave these hosts out of the rest of the round (e.g. leased whole by a placement)."""
        for name in agent_ids:
            cls = self._class_of.pop(name, None)
            if cls is not None:
                cls.agent_ids.remove(name)
                self._touch(cls)

    def take(self, choice: Choice, per: Resources, nports: int) -> list[str]:
        """Agent ids by rank for ``choice``; their free resources shrink accordingly."""
        by_rank: list[str] = []
        for cls, tasks, hosts in choice.parts:
            names = cls.agent_ids[:hosts]  # in snapshot order
            del cls.agent_ids[:hosts]
            self._touch(cls)
            left = cls.free - per.scale(tasks) - EXECUTOR_RESOURCES
            ports = cls.ports - nports * tasks
            key = (left, ports, tuple(sorted(cls.attributes.items())))
            moved = self._classes.get(key)
            if moved is None:
                moved = self._new(key, left, ports, cls.attributes)
            moved.agent_ids += names
            for name in names:
                self._class_of[name] = moved
                by_rank += [name] * tasks
            self._touch(moved)
        return by_rank

    def _fit(self, gang: Gang) -> _Fit:
        """How many tasks of ``gang`` each class holds, up to date."""
        per, nports = gang.per_task, gang.ports_per_task
        constraints = gang.spec.task.constraints
        key = (
            per.cpu,
            per.mem_mb,
            per.disk_mb,
            per.gpu,
            nports,
            tuple(c.SerializeToString(deterministic=True) for c in constraints),
        )
        table = self._table
        assert table is not None
        fit = self._fits.get(key)
        if fit is None:
            match = np.array(
                [not constraints or matches(constraints, a) for a in self._attr_sets], bool
            )
            fit = self._fits[key] = _Fit(per, nports, match, len(self._journal))
            fit.cap = table.caps(slice(0, table.n), per, nports, match)
            if per.gpu > EPSILON and table.n and int(fit.cap.max()) <= _LEVELS:
                fit.levels = _Levels(self, fit.cap)
        elif fit.seen < len(self._journal):
            changed = set(self._journal[fit.seen :])
            fit.seen = len(self._journal)
            if table.n > len(fit.cap):
                fit.cap = np.concatenate([fit.cap, np.zeros(len(table.hosts), np.int64)])
            if fit.levels is not None and fit.levels.version != table.version:
                # Free GPU amounts were ranked anew: every class's place in the order moved.
                fit.cap = table.caps(slice(0, len(table.hosts)), per, nports, fit.match)
                fit.levels = _Levels(self, fit.cap)
                return fit
            if len(changed) > 12:
                rows = np.fromiter(changed, np.int64, len(changed))
                caps = table.caps(rows, per, nports, fit.match)
                fit.cap[rows] = caps
                updates = list(zip(rows.tolist(), caps.tolist(), strict=True))
            else:  # a few classes: one by one is faster than arrays
                match, by_seq, row = fit.match, self._by_seq, self._row
                updates = []
                for i in changed:
                    c = by_seq[i]
                    cap = c.capacity(per, nports) if c.agent_ids and match[row[i][2]] else 0
                    fit.cap[i] = cap
                    updates.append((i, cap))
            if fit.levels is not None:
                fit.levels.update(self, updates)
        return fit


class _Table:
    """The snapshot's classes as NumPy columns, one row per class (by the order it was made):
    its hosts now, its free resources and port count, the ids of its rack, GPU model and
    attribute set, and ``order``: where best fit's tie-break (free GPUs, then first agent id)
    puts it, as one integer (the rank of its free GPUs among those there are, then the rank
    of its first agent id)."""

    _COLUMNS = ("hosts", "aid", "order", "cpu", "mem", "disk", "gpu", "ports", "rack", "model")

    def __init__(self, snapshot: Snapshot) -> None:
        classes = snapshot._by_seq
        self.n = len(classes)
        size = max(64, 2 * self.n)
        rank = snapshot._rank
        self.agent_bits = max(1, len(rank).bit_length())
        self.hosts = self._column([len(c.agent_ids) for c in classes], size, np.int64)
        self.aid = self._column(
            [rank[c.agent_ids[0]] if c.agent_ids else 0 for c in classes], size, np.int64
        )
        self.ports = self._column([c.ports for c in classes], size, np.int64)
        frees = [c.free for c in classes]
        self.cpu = self._column([f.cpu for f in frees], size, np.float64)
        self.mem = self._column([f.mem_mb for f in frees], size, np.float64)
        self.disk = self._column([f.disk_mb for f in frees], size, np.float64)
        self.gpu = self._column([f.gpu for f in frees], size, np.float64)
        ids = np.array(snapshot._row, np.int64).reshape(-1, 3)
        self.rack, self.model, self.attrs = (
            self._column(ids[:, k], size, np.int64) for k in range(3)
        )
        self.order = np.zeros(size, np.int64)
        self.grades: dict[float, int] = {}  # free GPU amounts there are -> their rank
        self.grade_bits = 1
        self.version = 0
        self._regrade([c.free.gpu for c in classes])

    @staticmethod
    def _column(values: object, size: int, dtype: type) -> np.ndarray:
        out: np.ndarray = np.zeros(size, dtype)
        given: np.ndarray = np.asarray(values, dtype)
        out[: len(given)] = given
        return out

    def _regrade(self, new: list[float]) -> None:
        """Rank the free GPU amounts there are (and ``new``), and every row's ``order``."""
        values = sorted({*self.grades, *new})
        self.grades = {v: i for i, v in enumerate(values)}
        self.grade_bits = max(1, len(values).bit_length())
        self.version += 1  # every order changed
        grade = np.searchsorted(np.array(values, np.float64), self.gpu[: self.n])
        self.order[: self.n] = (grade << self.agent_bits) | self.aid[: self.n]

    def put(self, snapshot: Snapshot, cls: HostClass) -> None:
        """Write ``cls``'s row (a new class gets the next one)."""
        i = cls.seq
        if i == self.n:  # a new class
            self.n += 1
            if i == len(self.hosts):
                for name in (*self._COLUMNS, "attrs"):
                    setattr(self, name, np.concatenate([getattr(self, name)] * 2))
            free = cls.free
            self.cpu[i], self.mem[i], self.disk[i] = free.cpu, free.mem_mb, free.disk_mb
            self.gpu[i], self.ports[i] = free.gpu, cls.ports
            self.rack[i], self.model[i], self.attrs[i] = snapshot._row[i]
        self.hosts[i] = len(cls.agent_ids)
        aid = self.aid[i] = snapshot._rank[cls.agent_ids[0]] if cls.agent_ids else 0
        grade = self.grades.get(cls.free.gpu)
        if grade is None:
            self._regrade([cls.free.gpu])
        else:
            self.order[i] = (grade << self.agent_bits) | aid

    def caps(
        self, rows: np.ndarray | slice, per: Resources, ports: int, match: np.ndarray
    ) -> np.ndarray:
        """:meth:`HostClass.capacity` of the classes of ``rows`` (seqs, or a slice of them), at
        once; 0 for a class with no hosts or whose attributes fail the constraints (``match``,
        by attribute set)."""
        zero = self.hosts[rows] <= 0
        if not match.all():
            zero |= ~match[self.attrs[rows]]
        fit: np.ndarray | None = None
        for kind, column in (
            ("gpu", self.gpu),
            ("cpu", self.cpu),
            ("mem_mb", self.mem),
            ("disk_mb", self.disk),
        ):
            need = per.get(kind)
            room = column[rows] - EXECUTOR_RESOURCES.get(kind)
            if need > EPSILON:
                room += EPSILON
                room /= need
                tasks = np.floor(room, out=room)
                fit = tasks if fit is None else np.minimum(fit, tasks, out=fit)
            else:
                zero |= room < -EPSILON
        if ports:
            tasks = self.ports[rows] // ports
            fit = tasks if fit is None else np.minimum(fit, tasks, out=fit)
        if fit is None:
            fit = np.full(len(zero), _UNBOUNDED)
        caps: np.ndarray = np.clip(fit, 0, _UNBOUNDED).astype(np.int64)
        caps[zero] = 0
        return caps


@dataclass(eq=False)
class _Fit:
    """One task shape (resources, ports, constraints) on a snapshot: how many tasks each class
    holds (0: none, no hosts, or the constraints rule it out), as of journal entry ``seen``."""

    per: Resources
    nports: int
    match: np.ndarray
    seen: int
    cap: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    levels: _Levels | None = None  # GPU tasks, at most _LEVELS on a host: kept up to date


# Caps up to this are levels of their own in :class:`_Levels` (a GPU task: at most as many on a
# host as it has GPUs).
_LEVELS = 64
_LEVEL_CAPS = np.arange(_LEVELS, -1, -1, dtype=np.float64)  # the levels' caps, largest first


class _Levels:
    """One GPU task shape on a snapshot, kept up to date class by class as placements move hosts:
    for each GPU model (group) the classes that hold a task by cap (level), each level's
    classes in best fit's order (free GPUs, then first agent id: :attr:`_Table.order`), and by
    rack the room, the hosts of each level and the first class. A gang is then placed from
    the top of the levels and the racks' sums, without a pass over the classes."""

    def __init__(self, snapshot: Snapshot, cap: np.ndarray) -> None:
        table = snapshot._table
        assert table is not None
        self.version = table.version
        groups, racks = len(snapshot._ids["model"]), len(snapshot._ids["rack"])
        # Levels 0 to the largest cap there is: a class made later holds no more (a host that
        # moves to another class has less free).
        width = int(cap.max()) + 1
        n = table.n
        # What each class counts for now, by seq (level 0: nothing; key and hosts as counted).
        self.level, self.key, self.hosts = (a[:n].copy() for a in (cap, table.order, table.hosts))
        rows = np.flatnonzero(self.level > 0)  # the classes that hold a task
        level, key, hosts = self.level[rows], self.key[rows], self.hosts[rows]
        cell = table.model[rows] * racks + table.rack[rows]
        room = np.bincount(cell, level * hosts, groups * racks).astype(np.int64)
        room = room.reshape(groups, racks)
        self.grid = np.bincount(cell * width + level, hosts, groups * racks * width)
        self.grid = self.grid.astype(np.int64).reshape(groups, racks, width)
        firsts = np.full(groups * racks, _NO_ROW, np.int64)
        np.minimum.at(firsts, cell, rows)
        first = firsts.reshape(groups, racks)
        self.total = [int(t) for t in room.sum(axis=1)]
        # By group and rack: room, first class.
        self.room: list[list[int]] = room.tolist()
        self.first: list[list[int]] = first.tolist()
        # By group, the racks in the orders _by_racks reads, made when a gang first spans
        # racks, and each rack's (room, first) as in them.
        self.tight: list[RackOrder] = []
        self.roomy: list[RackOrder] = []
        self.at: list[dict[int, tuple[int, int]]] = []
        # Each group's levels: the keys of their classes, ascending.
        shift = table.grade_bits + table.agent_bits
        assert (groups * width).bit_length() + shift < 63
        packed = np.sort(((table.model[rows] * width + level) << shift) | key)
        bounds = np.searchsorted(packed >> shift, np.arange(groups * width + 1)).tolist()
        self.keys = []
        for g in range(groups):  # levels 1 and up (level 0 holds nothing)
            at = bounds[g * width + 1 : (g + 1) * width + 1]
            keys = (packed[at[0] : at[-1]] & ((1 << shift) - 1)).tolist()
            self.keys.append(
                [[], *(keys[a - at[0] : b - at[0]] for a, b in itertools.pairwise(at))]
            )

    def orders(self, group: int) -> tuple[RackOrder, RackOrder]:
        """The racks of ``group`` in the orders of :func:`_rack_orders`."""
        if not self.tight:
            room, first = np.array(self.room), np.array(self.first)
            orders = [_rack_orders(room[g], first[g]) for g in range(len(self.room))]
            self.tight = [t for t, _ in orders]
            self.roomy = [r for _, r in orders]
            self.at = [{rack: (r, f) for r, f, rack in tight} for tight in self.tight]
        return self.tight[group], self.roomy[group]

    def update(self, snapshot: Snapshot, updates: list[tuple[int, int]]) -> None:
        """Classes (seq, tasks a host) changed: they gained or lost hosts, a new first agent,
        or were made."""
        table = snapshot._table
        assert table is not None
        if table.n > len(self.level):
            more = np.zeros(max(table.n - len(self.level), len(self.level) // 2), np.int64)
            self.level, self.key, self.hosts = (
                np.concatenate([a, more]) for a in (self.level, self.key, self.hosts)
            )
        level, key_of, hosts_of, row_of = self.level, self.key, self.hosts, snapshot._row
        room, first, grid, total, keys = self.room, self.first, self.grid, self.total, self.keys
        width = len(keys[0])
        moved = set()
        for row, cap in updates:
            old = int(level[row])
            if not (cap or old):
                continue
            # Hosts only lose free resources, so no class holds more than the largest did.
            assert cap < width
            rack, group, _ = row_of[row]
            if old:
                these, key, hosts = keys[group][old], int(key_of[row]), int(hosts_of[row])
                at = bisect.bisect_left(these, key)
                assert these[at] == key
                del these[at]
                room[group][rack] -= old * hosts
                grid[group, rack, old] -= hosts
                total[group] -= old * hosts
            level[row] = cap
            if cap:
                key, hosts = int(table.order[row]), int(table.hosts[row])
                bisect.insort(keys[group][cap], key)
                key_of[row], hosts_of[row] = key, hosts
                room[group][rack] += cap * hosts
                grid[group, rack, cap] += hosts
                total[group] += cap * hosts
                if row < first[group][rack]:
                    first[group][rack] = row
            elif first[group][rack] == row:
                first[group][rack] = min(
                    (i for i in snapshot._rack_rows[rack] if level[i] and row_of[i][1] == group),
                    default=_NO_ROW,
                )
            moved.add((group, rack))
        if not self.tight:
            return
        for group, rack in moved:  # the racks move in the orders
            r, f = room[group][rack], first[group][rack]
            was = self.at[group].get(rack)
            if was == (r, f):
                continue
            for order, sign in ((self.tight[group], 1), (self.roomy[group], -1)):
                if was:
                    entry = (sign * was[0], was[1], rack)
                    at = bisect.bisect_left(order, entry)
                    assert order[at] == entry
                    del order[at]
                if r:
                    bisect.insort(order, (sign * r, f, rack))
            if r:
                self.at[group][rack] = (r, f)
            else:
                del self.at[group][rack]


def place(gang: Gang, hosts: Sequence[HostOffers]) -> Placement:
    """Hosts by rank for every task of ``gang``, or None and why."""
    return place_on(gang, Snapshot(hosts))


def place_round(gangs: Sequence[Gang], hosts: Sequence[HostOffers]) -> list[Placement]:
    """Place gangs one after the other (in the given order, e.g. priority) on one snapshot:
    what a gang takes is gone for the next. Each gang is placed whole or not at all."""
    snapshot = Snapshot(hosts)
    return [place_on(gang, snapshot) for gang in gangs]


def place_on(gang: Gang, snapshot: Snapshot) -> Placement:
    """Place ``gang`` on ``snapshot`` (which then holds what is left)."""
    if gang.size <= 0 or len(snapshot._classes) < _INDEXED_FROM:
        return _place_plain(gang, snapshot)
    snapshot._index()
    fit = snapshot._fit(gang)
    if gang.spec.placement == "spread":
        choice = _choose(gang, _fit_eligible(snapshot, fit))
    elif fit.levels is not None:
        choice = _choose_levels(gang, snapshot, fit.levels)
    else:
        choice = _choose_indexed(gang, snapshot, fit)
    if choice is None:
        classes = snapshot.classes()
        return Placement(None, _why_not(gang, classes, _fit_eligible(snapshot, fit), now=True))
    return Placement(tuple(snapshot.take(choice, gang.per_task, gang.ports_per_task)))


def _place_plain(gang: Gang, snapshot: Snapshot) -> Placement:
    """:func:`place_on` class by class: the definition the indexed path keeps to (tests compare
    the two), and the faster one on a snapshot of a few classes."""
    classes = snapshot.classes()
    eligible = _eligible(gang, classes)
    choice = _choose(gang, eligible)
    if choice is None:
        return Placement(None, _why_not(gang, classes, eligible, now=True))
    return Placement(tuple(snapshot.take(choice, gang.per_task, gang.ports_per_task)))


def never_fits(gang: Gang, hosts: Sequence[HostOffers]) -> str | None:
    """None if ``gang`` could be placed on an empty cluster of ``hosts``, else why it never can.

    ``hosts`` carry their total resources (as if nothing ran on them), draining hosts left out;
    the gang is placed on them exactly as on free offers, so "never" means the engine's "not
    now" on the emptiest cluster there can be.
    """
    return EmptyCluster(hosts).never_fits(gang)


class EmptyCluster:
    """The cluster's hosts with their totals, grouped into classes once, for asking of many
    gangs whether they could ever be placed (grouping a large cluster's hosts costs more than
    judging a gang on the classes)."""

    def __init__(self, hosts: Sequence[HostOffers]) -> None:
        self._classes = Snapshot(hosts).classes()

    def never_fits(self, gang: Gang) -> str | None:
        """:func:`never_fits` on these hosts."""
        eligible = _eligible(gang, self._classes)
        if _choose(gang, eligible) is not None:
            return None
        return _why_not(gang, self._classes, eligible, now=False)


def gpu_fragmentation(hosts: Sequence[HostOffers], largest_request: int) -> float:
    """The share of free GPUs stranded on hosts with fewer free than ``largest_request`` (the
    largest per-task GPU request waiting): 0.0 when none is stranded or none is free."""
    free = sum(max(0.0, h.free.gpu) for h in hosts)
    if free <= EPSILON:
        return 0.0
    stranded = sum(max(0.0, h.free.gpu) for h in hosts if h.free.gpu + EPSILON < largest_request)
    return stranded / free


Eligible = list[tuple[HostClass, int]]


def _eligible(gang: Gang, classes: list[HostClass]) -> Eligible:
    """Classes that match the task's constraints and hold at least one task, with how many."""
    constraints = gang.spec.task.constraints
    per, nports = gang.per_task, gang.ports_per_task
    return [
        (c, cap)
        for c in classes
        if (cap := c.capacity(per, nports)) > 0
        and (not constraints or matches(constraints, c.attributes))
    ]


def _choose(gang: Gang, eligible: Eligible) -> Choice | None:
    """The best choice of the first tier that holds the gang, by the job's placement."""
    per, n = gang.per_task, gang.size
    tiers = [eligible]
    if per.gpu <= EPSILON:
        # GPU hosts are kept for GPU work unless nothing else holds the gang.
        tiers = [[(c, k) for c, k in eligible if c.free.gpu <= EPSILON], eligible]
    spread = gang.spec.placement == "spread"
    for tier in tiers:
        groups = list(_by_model(tier).values()) if per.gpu > EPSILON else [tier]
        if spread:
            found = [choice for g in groups if (choice := _spread(g, n))]
            if found:
                return min(found, key=Choice.spread_score)
        else:
            found = [choice for g in groups if (choice := _fewest_hosts(g, n, per.gpu))]
            if found:
                return min(found, key=lambda o: o.pack_score(per.gpu))
    return None


def _fewest_hosts(group: Eligible, n: int, gpu: float) -> Choice | None:
    """The fewest hosts, then racks, then idle GPUs, of ``group`` that hold ``n`` tasks."""
    if _room(group) < n:
        return None
    racks: dict[str, Eligible] = {}
    for c, cap in group:
        racks.setdefault(c.rack, []).append((c, cap))
    fewest = _best_fit(group, n)  # the fewest hosts, wherever they are
    if fewest is not None and fewest.pack_score(gpu)[1] == 1:
        return fewest  # already on one rack: nothing can do better on hosts or racks
    options = [fewest]
    # One rack: the tightest racks first; the first that needs no more hosts than the fewest
    # possible is as good as any (it also keeps roomier racks for bigger gangs).
    least = fewest.pack_score(gpu)[0] if fewest is not None else 0
    for hosts in sorted((hs for hs in racks.values() if _room(hs) >= n), key=_room):
        option = _best_fit(hosts, n)
        options.append(option)
        if option is not None and option.pack_score(gpu)[0] <= least:
            break
    # The roomiest racks combined, as few as possible.
    combined: Eligible = []
    for hosts in sorted(racks.values(), key=lambda hs: -_room(hs)):
        combined += hosts
        if _room(combined) >= n:
            options.append(_best_fit(combined, n))
            break
    found = [o for o in options if o is not None]
    return min(found, key=lambda o: o.pack_score(gpu)) if found else None


def _spread(group: Eligible, n: int) -> Choice | None:
    """``n`` tasks as evenly over ``group``'s hosts as their room allows: at the lowest level L
    at which the hosts hold ``n`` (at most L each), every host takes min(room, L-1) and the rest
    go one more per host on hosts taken in turn by :func:`_in_turn`."""
    if _room(group) < n:
        return None
    level = _level(group, n)
    below = [(c, min(cap, level - 1)) for c, cap in group]
    rest = n - sum(k * len(c.agent_ids) for c, k in below)
    one_more: dict[HostClass, int] = {}
    for cls in itertools.islice(_in_turn([(c, cap) for c, cap in group if cap >= level]), rest):
        one_more[cls] = one_more.get(cls, 0) + 1
    parts = [(c, level, hosts) for c, hosts in one_more.items()]
    parts += [
        (c, k, hosts)
        for c, k in below
        if k > 0 and (hosts := len(c.agent_ids) - one_more.get(c, 0)) > 0
    ]
    return Choice(tuple(parts))


def _level(group: Eligible, n: int) -> int:
    """The fewest tasks per host at which ``group`` holds ``n`` (it must hold them at all)."""
    if sum(len(c.agent_ids) for c, _ in group) >= n:
        return 1  # the common case, one task per host, without the search
    low, high = 2, max(cap for _, cap in group)
    while low < high:
        mid = (low + high) // 2
        if sum(min(cap, mid) * len(c.agent_ids) for c, cap in group) >= n:
            high = mid
        else:
            low = mid + 1
    return low


def _in_turn(group: Eligible) -> Iterator[HostClass]:
    """``group``'s hosts (as their classes), one rack at a time in turn, so as many racks as
    possible are used: racks with the roomiest host first, each rack's roomiest hosts first.
    Room: how many tasks a host holds, then its free GPUs."""
    racks: dict[str, list[HostClass]] = {}
    for c, _ in sorted(group, key=lambda h: (-h[1], -h[0].free.gpu, h[0].agent_ids[0])):
        racks.setdefault(c.rack, []).append(c)
    turns = [
        itertools.chain.from_iterable(itertools.repeat(c, len(c.agent_ids)) for c in classes)
        for classes in racks.values()
    ]
    while turns:
        going = []
        for turn in turns:
            cls = next(turn, None)
            if cls is not None:
                yield cls
                going.append(turn)
        turns = going


def _best_fit(group: Eligible, n: int) -> Choice | None:
    """Largest hosts first until the rest fits on one host, then the smallest host that holds
    the rest. Ties go to hosts with fewer free GPUs (fill what is already partly used)."""
    order = sorted(group, key=lambda h: (h[1], h[0].free.gpu, h[0].agent_ids[0]))
    caps = [cap for _, cap in order]
    left = [len(c.agent_ids) for c, _ in order]  # hosts of each class still unused
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
    return sum(cap * len(c.agent_ids) for c, cap in group)


def _by_model(eligible: Eligible) -> dict[str, Eligible]:
    out: dict[str, Eligible] = {}
    for c, cap in eligible:
        out.setdefault(c.model, []).append((c, cap))
    return out


# From this many classes on (ever made, empty ones included) a snapshot places through its
# arrays (made then); below, class by class is as fast.
_INDEXED_FROM = 64
# Above any row number: the "first row" of a rack without classes.
_NO_ROW = np.iinfo(np.int64).max


def _fit_eligible(snapshot: Snapshot, fit: _Fit) -> Eligible:
    """:func:`_eligible` read off ``fit``: classes in the order they were made."""
    rows = np.flatnonzero(fit.cap > 0)
    return list(
        zip([snapshot._by_seq[i] for i in rows.tolist()], fit.cap[rows].tolist(), strict=True)
    )


def _choose_indexed(gang: Gang, snapshot: Snapshot, fit: _Fit) -> Choice | None:
    """:func:`_choose` for ``placement: pack`` on the snapshot's arrays."""
    per, n = gang.per_task, gang.size
    table = snapshot._table
    assert table is not None
    caps = fit.cap[: table.n]
    rows = np.flatnonzero(caps > 0)
    if per.gpu <= EPSILON:
        # GPU hosts are kept for GPU work unless nothing else holds the gang.
        for tier in (rows[table.gpu[rows] <= EPSILON], rows):
            choice = _fewest_indexed(snapshot, tier, caps[tier], n, per.gpu)
            if choice is not None:
                return choice
        return None
    groups = [rows]
    if len(snapshot._ids["model"]) > 1:  # one group per GPU model, in order of first class
        models = table.model[rows]
        first = np.full(len(snapshot._ids["model"]), _NO_ROW, np.int64)
        np.minimum.at(first, models, rows)
        ids = np.flatnonzero(first != _NO_ROW)
        groups = [rows[models == m] for m in ids[np.argsort(first[ids])].tolist()]
    found = [c for g in groups if (c := _fewest_indexed(snapshot, g, caps[g], n, per.gpu))]
    return min(found, key=lambda o: o.pack_score(per.gpu)) if found else None


def _fewest_indexed(
    snapshot: Snapshot, rows: np.ndarray, caps: np.ndarray, n: int, gpu: float
) -> Choice | None:
    """:func:`_fewest_hosts` of the group of classes ``rows`` (ascending), each holding ``caps``
    tasks per host, without walking the group: every option is :func:`_best_fit` of a few of its
    classes that make the same choice as all of them.

    * The fewest hosts: best fit takes the largest classes from the top of its order (cap, free
      GPUs, first agent id) until the rest fits on one host, fewer than ``n`` hosts, then the
      least class that holds the rest: the least of the smallest cap that does. So it chooses
      the same from the top ``n`` classes plus the least class of each cap.
    * One rack: racks are tried tightest first until one needs no more hosts than the fewest;
      the racks before it need more and lose to the fewest, so only that rack's option counts.
      Best fit on a rack needs the fewest k hosts whose k largest caps add up to ``n``, so a rack
      needs no more than ``least`` hosts when its ``least`` largest hold ``n``.
    * The roomiest racks combined: their classes.
    """
    if not len(rows):
        return None
    table = snapshot._table
    assert table is not None
    hosts = table.hosts[rows]
    room = caps * hosts
    if int(room.sum()) < n:
        return None
    if int(caps.max()) >= n:
        # One host holds the gang: best fit takes the least class (by cap, free GPUs, first
        # agent id) that does, on one rack, which nothing beats.
        at = np.flatnonzero(caps == caps[caps >= n].min())
        one = int(rows[at[np.argmin(table.order[rows[at]])]])
        return Choice(((snapshot._by_seq[one], n, 1),))
    levels, level = _levels(caps)  # the caps there are, ascending; each class's
    nlevels = len(levels)
    # Best fit's order of the classes as one integer: level, free GPUs, first agent id.
    shift = table.grade_bits + table.agent_bits
    assert nlevels.bit_length() + shift < 63
    key = (level << shift) | table.order[rows]
    # The classes at the top of that order that have n hosts between them (or all), and the
    # least of each level: best fit chooses from them as from all.
    pick = np.ones(len(rows), bool)
    if len(rows) > n:
        pick[:] = False
        pick[np.argpartition(key, len(rows) - n)[len(rows) - n :]] = True
    lowest = np.full(nlevels, _NO_ROW, np.int64)
    np.minimum.at(lowest, level, key)
    pick |= key == lowest[level]
    fewest = _best_fit(_group(snapshot, rows, caps, pick), n)
    assert fewest is not None  # the group holds n
    if fewest.pack_score(gpu)[1] == 1:
        return fewest  # already on one rack: nothing can do better on hosts or racks
    racks = len(snapshot._ids["rack"])
    rack = table.rack[rows]
    first = np.full(racks, _NO_ROW, np.int64)
    np.minimum.at(first, rack, rows)  # racks go in order of their first class
    by_rack = np.bincount(rack, weights=room, minlength=racks).astype(np.int64)
    grid = np.bincount(rack * nlevels + level, weights=hosts, minlength=racks * nlevels)
    grid = grid.reshape(racks, nlevels)[:, ::-1]

    def members(chosen: list[int]) -> Eligible:
        mask = np.zeros(racks, bool)
        mask[chosen] = True
        return _group(snapshot, rows, caps, mask[rack])

    return _by_racks(
        fewest,
        n,
        gpu,
        *_rack_orders(by_rack, first),
        lambda least: _held(grid, levels[::-1].astype(np.float64), least),
        members,
    )


def _choose_levels(gang: Gang, snapshot: Snapshot, levels: _Levels) -> Choice | None:
    """:func:`_choose` for ``placement: pack`` of GPU tasks, from ``levels``."""
    per, n = gang.per_task, gang.size
    groups = [g for g, total in enumerate(levels.total) if total > 0]
    if len(groups) > 1:  # GPU models in order of their first class
        first = [min(f) for f in levels.first]
        groups.sort(key=first.__getitem__)
    found = [c for g in groups if (c := _fewest_levels(snapshot, levels, g, n, per.gpu))]
    return min(found, key=lambda o: o.pack_score(per.gpu)) if found else None


def _fewest_levels(
    snapshot: Snapshot, levels: _Levels, group: int, n: int, gpu: float
) -> Choice | None:
    """:func:`_fewest_hosts` of one GPU model's classes, from ``levels``: as
    :func:`_fewest_indexed`, with the top classes and each level's least read off the sorted
    levels, and the racks' sums kept."""
    if levels.total[group] < n:
        return None
    keys = levels.keys[group]
    table = snapshot._table
    assert table is not None
    mask = (1 << table.agent_bits) - 1
    names, class_of, by_seq = snapshot._names, snapshot._class_of, snapshot._by_seq
    top = len(keys) - 1
    while not keys[top]:
        top -= 1
    if top >= n:
        # One host holds the gang: the least class of the smallest level that does.
        at = n
        while not keys[at]:
            at += 1
        return Choice(((class_of[names[keys[at][0] & mask]], n, 1),))
    # The least class of each level, and the top classes until they hold n tasks: best fit
    # never takes every host of those (that would be n tasks or more before the last host).
    group_of: dict[int, tuple[HostClass, int]] = {}  # by key
    need = n
    for level in range(top, 0, -1):
        these = keys[level]
        if these:
            group_of[these[0]] = (class_of[names[these[0] & mask]], level)
            at = len(these)
            while need > 0 and at:
                at -= 1
                cls = class_of[names[these[at] & mask]]
                group_of[these[at]] = (cls, level)
                need -= level * len(cls.agent_ids)
    fewest = _best_fit(list(group_of.values()), n)
    assert fewest is not None  # the group holds n
    if fewest.pack_score(gpu)[1] == 1:
        return fewest  # already on one rack: nothing can do better on hosts or racks
    level_of, row_of, rack_rows = levels.level, snapshot._row, snapshot._rack_rows
    several = len(levels.total) > 1  # GPU models: keep to this one

    def members(chosen: list[int]) -> Eligible:
        rows = [i for r in chosen for i in rack_rows[r]]
        return [
            (by_seq[i], v)
            for i, v in zip(rows, level_of[rows].tolist(), strict=True)
            if v and not (several and row_of[i][1] != group)
        ]

    return _by_racks(
        fewest,
        n,
        gpu,
        *levels.orders(group),
        lambda least: _held(
            levels.grid[group][:, top:0:-1], _LEVEL_CAPS[_LEVELS - top : -1], least
        ),
        members,
    )


RackOrder = list[tuple[int, int, int]]


def _rack_orders(room: np.ndarray, first: np.ndarray) -> tuple[RackOrder, RackOrder]:
    """The racks with room: (room, first class, rack) ascending, the tightest first, and
    (-room, first class, rack) ascending, the roomiest first (by rack: ``room``, ``first``)."""
    used = np.flatnonzero(room > 0)
    room, first = room[used], first[used]
    tight, roomy = np.lexsort((first, room)), np.lexsort((first, -room))
    return (
        list(zip(room[tight].tolist(), first[tight].tolist(), used[tight].tolist(), strict=True)),
        list(
            zip((-room[roomy]).tolist(), first[roomy].tolist(), used[roomy].tolist(), strict=True)
        ),
    )


def _held(grid: np.ndarray, caps: np.ndarray, least: int) -> list[float]:
    """By rack, the tasks its ``least`` largest hosts hold: ``grid``, hosts by rack and level,
    the largest level first; ``caps``: the levels' caps."""
    before = np.cumsum(grid, axis=1) - grid
    return list((np.clip(least - before, 0, grid) @ caps).tolist())


def _by_racks(fewest: Choice, n: int, gpu: float, tight: RackOrder, roomy: RackOrder,
              held: Callable[[int], list[float]],
              members: Callable[[list[int]], Eligible]) -> Choice:  # fmt: skip
    """The rest of :func:`_fewest_hosts` once the fewest hosts span racks: racks in the orders
    of :func:`_rack_orders`; ``held``: by rack, what its ``least`` largest hosts hold;
    ``members``: the classes of some racks."""
    least = fewest.hosts
    options: list[Choice | None] = [fewest]
    start = bisect.bisect_left(tight, (n,))  # the racks that hold n, the tightest first
    if start < len(tight):
        tasks = held(least)
        for _, _, rack in itertools.islice(tight, start, None):
            if tasks[rack] >= n:  # a rack that needs no more hosts than the fewest
                options.append(_best_fit(members([rack]), n))
                break
    # The roomiest racks combined, as few as possible.
    chosen, room = [], 0
    for less, _, rack in roomy:
        chosen.append(rack)
        room -= less
        if room >= n:
            break
    options.append(_best_fit(members(chosen), n))
    found = [o for o in options if o is not None]
    return min(found, key=lambda o: o.pack_score(gpu))


def _levels(caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Levels of caps, ascending, and each class's: the caps themselves when they are small
    (a GPU task: at most a host's GPUs), else the distinct caps there are."""
    top = int(caps.max())
    if top <= 64:
        return np.arange(top + 1), caps
    ordered = np.sort(caps)
    values = ordered[np.concatenate([[True], ordered[1:] != ordered[:-1]])]
    return values, np.searchsorted(values, caps)


def _group(snapshot: Snapshot, rows: np.ndarray, caps: np.ndarray, pick: np.ndarray) -> Eligible:
    """The classes of ``rows[pick]`` with their caps (``pick``: a mask or positions)."""
    by_seq = snapshot._by_seq
    return list(zip([by_seq[i] for i in rows[pick].tolist()], caps[pick].tolist(), strict=True))


def _why_not(gang: Gang, classes: list[HostClass], eligible: Eligible, *, now: bool) -> str:
    """What binds, short and human: the job's pending reason (``now``: on the free offers) or
    why it can never run (on the cluster's totals)."""
    hosts = sum(len(c.agent_ids) for c in classes)
    if not hosts:
        if now:
            return f"no host offers free resources; the gang needs {_ask(gang)}"
        return "the cluster has no hosts"
    constraints = gang.spec.task.constraints
    matching = (
        [c for c in classes if matches(constraints, c.attributes)] if constraints else classes
    )
    if not matching:
        return f"none of {hosts} {'offered ' if now else ''}hosts matches the task constraints"
    free = " free" if now else ""
    if not eligible:
        return _too_big(gang, matching, free) + _ruled_out(gang, classes)
    return _too_few(gang, matching, eligible, free) + _ruled_out(gang, classes)


def _too_big(gang: Gang, matching: list[HostClass], free: str) -> str:
    """No matching host holds one task: the kind (or ports) that no host has enough of."""
    per, ports = gang.per_task, gang.ports_per_task
    scope = "matching host" if gang.spec.task.constraints else "host"
    short: list[str] = []  # every kind no host has enough of, each with its largest host
    for kind in KINDS:
        need, most = per.get(kind), max(c.free.get(kind) for c in matching)
        executor = EXECUTOR_RESOURCES.get(kind)
        if need > EPSILON and need + executor > most + EPSILON:
            # The executor's share is what tips a host that has exactly the task's amount.
            plus = f" plus {executor:g} for the executor" if need <= most + EPSILON else ""
            short.append(
                f"task needs {_amount(need, _UNITS[kind])}{plus}; "
                f"the largest {scope} has {format_amount(most)}{free}"
            )
    most_ports = max(c.ports for c in matching)
    if ports > most_ports:
        named = len(gang.spec.task.ports)
        short.append(
            f"task needs {_amount(ports, 'ports')} ({named} named, 1 for PELOTON_PEERS); "
            f"the largest {scope} has {most_ports}{free}"
        )
    return "; and ".join(short) or f"no {scope} has room for one task ({describe(per)})"


def _too_few(gang: Gang, matching: list[HostClass], eligible: Eligible, free: str) -> str:
    """Hosts hold a task but not the gang: what the best group (GPU model) lacks."""
    per, n = gang.per_task, gang.size
    model, group, models = "", eligible, 1
    if per.gpu > EPSILON:
        groups = _by_model(eligible)
        model, group = max(groups.items(), key=lambda mg: _room(mg[1]))
        models = len(groups)
    binders = sorted(
        {b for c, _ in group for b in c.binders(per, gang.ports_per_task)}, key=_BINDER_ORDER.index
    )
    if binders and "gpu" not in binders:
        # Hosts have the GPUs for more tasks: name what stops them, the executor's share in it.
        return _other_bound(gang, group, binders, free)
    if max(cap for _, cap in group) == 1:  # a task per host: count hosts
        return _too_few_hosts(gang, matching, group, models > 1, free)
    named = f" {model}" if model else ""
    room = f"hold {_room(group)} (largest host {max(cap for _, cap in group)})"
    if per.gpu <= EPSILON:
        return f"needs {_ask(gang)}; the hosts with room {room}"
    gpus = sum(c.free.gpu * len(c.agent_ids) for c, _ in group)
    if n * per.gpu > gpus + EPSILON:
        return (
            f"needs {format_amount(n * per.gpu)} GPUs on one GPU model; "
            f"the{named} hosts have {format_amount(gpus)}{free}"
        )
    return f"needs {_ask(gang)} on one GPU model; the hosts with{free}{named} GPUs {room}"


def _other_bound(gang: Gang, group: Eligible, binders: list[str], free: str) -> str:
    """'...; the hosts with room hold 2 (1 each): cpus bind: ...': not GPUs but ``binders``
    (kinds or ports) keep the hosts from holding the gang."""
    per, nports = gang.per_task, gang.ports_per_task
    top, most = max(group, key=lambda cc: cc[1])
    each = " each" if all(cap == most for _, cap in group) else " on the largest host"
    kind = binders[0]
    if kind == "ports":
        detail = f"a task needs {_amount(nports, 'ports')}; a host has {top.ports}{free}"
    else:
        unit, executor = _UNITS[kind], EXECUTOR_RESOURCES.get(kind)
        plus = f" plus {executor:g} for the executor" if executor > EPSILON else ""
        detail = (
            f"a task needs {_amount(per.get(kind), unit)}{plus}; "
            f"a host has {format_amount(top.free.get(kind))}{free}"
        )
    names = " and ".join(_BINDER_NAMES[b] for b in binders)
    verb = "binds" if len(binders) == 1 else "bind"
    return (
        f"needs {_ask(gang)}; the hosts with room hold {_room(group)} ({most}{each}): "
        f"{names} {verb}: {detail}"
    )


def _too_few_hosts(
    gang: Gang, matching: list[HostClass], group: Eligible, several_models: bool, free: str
) -> str:
    """Each host of ``group`` (one GPU model) holds at most one task: hosts that have room
    against hosts needed. ``several_models``: other models have hosts with room too."""
    per, n = gang.per_task, gang.size
    have, model = _room(group), group[0][0].model
    room_on = {c for c, _ in group}
    rest = [c for c in matching if c not in room_on and (per.gpu <= EPSILON or c.model == model)]
    who = f"{model} host" if several_models and model else "host"
    counted = f"{have} {who}{'' if have == 1 else 's'} {'has' if have == 1 else 'have'}"
    if per.gpu <= EPSILON or any(c.free.gpu + EPSILON >= per.gpu for c in rest):
        # Hosts with the GPUs lack something else: name the whole task.
        return f"needs {n} hosts with room for a task ({describe(per)}); {counted} it"
    named = f"{model} " if model and not several_models else ""
    of_one = " of one model" if several_models else ""
    most = max((c.free.gpu for c in rest), default=0.0)
    at_most = f"at most {format_amount(most)}" if most > EPSILON else "none"
    tail = f" (the rest have {at_most})" if rest else ""
    gpus = f"{format_amount(per.gpu)}{free} {named}GPUs{of_one}"
    return f"needs {n} hosts with {gpus}; {counted} them{tail}"


def _ruled_out(gang: Gang, classes: list[HostClass]) -> str:
    """'; rack eq r1 rules out 5 more hosts with room': the constraints that keep the gang off
    hosts that would hold a task, when any do."""
    constraints = gang.spec.task.constraints
    if not constraints:
        return ""
    per, nports = gang.per_task, gang.ports_per_task
    roomy = [c for c in classes if c.capacity(per, nports) > 0]
    off = [c for c in roomy if not matches(constraints, c.attributes)]
    if not off:
        return ""
    binding = [item for item in constraints if any(not matches((item,), c.attributes) for c in off)]
    count = sum(len(c.agent_ids) for c in off)
    names = " and ".join(_describe(item) for item in binding)
    return f"; {names} rules out {count} more host{'' if count == 1 else 's'} with room"


def _describe(c: job_pb2.Constraint) -> str:
    """A constraint as written in a job spec, in one line: ``rack in [r1, r2]``."""
    if c.any_of:
        return f"any_of({' or '.join(_describe(branch) for branch in c.any_of)})"
    if c.op == "exists":
        return f"{c.attribute} exists"
    values = ", ".join(c.values)
    return f"{c.attribute} {c.op} {values if c.op == 'eq' else f'[{values}]'}"


# Resource kinds as reasons name them.
_UNITS = {"cpu": "cpus", "mem_mb": "MB of memory", "disk_mb": "MB of disk", "gpu": "GPUs"}
# What can bind a host's room for tasks, as named when it does.
_BINDER_NAMES = {
    "cpu": "cpus",
    "mem_mb": "memory",
    "disk_mb": "disk",
    "gpu": "GPUs",
    "ports": "ports",
}
_BINDER_ORDER = ["gpu", "cpu", "mem_mb", "disk_mb", "ports"]


def _amount(value: float, unit: str) -> str:
    """``16 GPUs``, ``1 GPU``."""
    singular = value == 1 and unit in ("cpus", "GPUs", "ports")
    return f"{format_amount(value)} {unit[:-1] if singular else unit}"


def _ask(gang: Gang) -> str:
    return f"{gang.size} tasks of {describe(gang.per_task)}"
