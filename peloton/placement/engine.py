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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

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
    a committed placement moves its hosts to the classes of what they have left."""

    def __init__(self, hosts: Iterable[HostOffers]) -> None:
        self._classes: dict[tuple[object, ...], HostClass] = {}
        self._class_of: dict[str, HostClass] = {}
        for h in hosts:
            self._add(h.agent_id, h.free, port_count(h.ports), h.attributes)

    def classes(self) -> list[HostClass]:
        return [c for c in self._classes.values() if c.agent_ids]

    def _add(self, name: str, free: Resources, ports: int, attrs: Mapping[str, str]) -> None:
        key = (free, ports, tuple(sorted(attrs.items())))
        cls = self._classes.get(key)
        if cls is None:
            cls = self._classes[key] = HostClass(free, ports, dict(attrs))
        cls.agent_ids.append(name)
        self._class_of[name] = cls

    def drop(self, agent_ids: Iterable[str]) -> None:
        """Leave these hosts out of the rest of the round (e.g. leased whole by a placement)."""
        for name in agent_ids:
            cls = self._class_of.pop(name, None)
            if cls is not None:
                cls.agent_ids.remove(name)

    def take(self, choice: Choice, per: Resources, nports: int) -> list[str]:
        """Agent ids by rank for ``choice``; their free resources shrink accordingly."""
        by_rank: list[str] = []
        for cls, tasks, hosts in choice.parts:
            names = [cls.agent_ids.pop(0) for _ in range(hosts)]  # in snapshot order
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


def place_on(gang: Gang, snapshot: Snapshot) -> Placement:
    """Place ``gang`` on ``snapshot`` (which then holds what is left)."""
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
    classes = Snapshot(hosts).classes()
    eligible = _eligible(gang, classes)
    if _choose(gang, eligible) is not None:
        return None
    return _why_not(gang, classes, eligible, now=False)


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


def _why_not(gang: Gang, classes: list[HostClass], eligible: Eligible, *, now: bool) -> str:
    """What binds, short and human: the job's pending reason (``now``: on the free offers) or
    why it can never run (on the cluster's totals)."""
    hosts = sum(len(c.agent_ids) for c in classes)
    if not hosts:
        if now:
            return f"no host offers free resources; the gang needs {_ask(gang)}"
        return "the cluster has no hosts"
    matching = [c for c in classes if matches(gang.spec.task.constraints, c.attributes)]
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
