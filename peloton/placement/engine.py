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
Ranks are contiguous per host (local ranks 0..k-1 on each), hosts in the order chosen.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from peloton.gang import Gang
from peloton.hostmgr.offers import HostOffers, port_count
from peloton.placement.firstfit import EXECUTOR_RESOURCES, Placement, matches
from peloton.resmgr.admission import describe
from peloton.resources import EPSILON, KINDS, Resources

# A task asking for nothing fits any number of times; count it as this many.
_UNBOUNDED = 1 << 20


@dataclass
class Candidate:
    """A host as one placement round sees it; ``free`` and ``ports`` shrink as gangs land."""

    hostname: str
    free: Resources
    ports: int
    attributes: Mapping[str, str]

    @property
    def rack(self) -> str:
        return self.attributes.get("rack", "")

    def capacity(self, per_task: Resources, ports: int) -> int:
        """How many tasks of ``per_task`` (each with ``ports`` named ports) fit here, in one task
        group (whose executor takes its own share)."""
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
    """How many tasks go on each chosen host, in rank order."""

    counts: tuple[tuple[Candidate, int], ...]

    def score(self, gpu_per_task: float) -> tuple[int, int, float]:
        racks = {c.rack for c, _ in self.counts}
        left = sum(c.free.gpu - n * gpu_per_task for c, n in self.counts)
        return len(self.counts), len(racks), left


def candidates(hosts: Iterable[HostOffers]) -> list[Candidate]:
    """A placement round's working copy of the offer pool's snapshot."""
    return [Candidate(h.hostname, h.free, port_count(h.ports), dict(h.attributes)) for h in hosts]


def place(gang: Gang, hosts: Sequence[HostOffers]) -> Placement:
    """Hosts by rank for every task of ``gang``, or None and why (nothing is changed)."""
    return place_on(gang, candidates(hosts), commit=False)


def place_round(gangs: Sequence[Gang], hosts: Sequence[HostOffers]) -> list[Placement]:
    """Place gangs one after the other (in the given order, e.g. priority) on one snapshot:
    what a gang takes is gone for the next. Each gang is placed whole or not at all."""
    pool = candidates(hosts)
    return [place_on(gang, pool, commit=True) for gang in gangs]


def place_on(gang: Gang, pool: list[Candidate], *, commit: bool) -> Placement:
    """Place ``gang`` on ``pool``; with ``commit`` the chosen hosts' free resources shrink."""
    task = gang.spec.task
    per, nports, n = gang.per_task, len(task.ports), gang.size
    eligible = [
        (c, cap)
        for c in pool
        if matches(task.constraints, c.attributes) and (cap := c.capacity(per, nports)) > 0
    ]
    tiers = [eligible]
    if per.gpu <= EPSILON:
        # GPU hosts are kept for GPU work unless nothing else holds the gang.
        tiers = [[(c, k) for c, k in eligible if c.free.gpu <= EPSILON], eligible]
    for tier in tiers:
        best: Choice | None = None
        for group in _model_groups(tier, per):
            choice = _fewest_hosts(group, n, per.gpu)
            if choice is not None and (best is None or choice.score(per.gpu) < best.score(per.gpu)):
                best = choice
        if best is not None:
            if commit:
                _take(best, per, nports)
            return Placement(tuple(c.hostname for c, k in best.counts for _ in range(k)))
    return Placement(None, _why_not(gang, pool, eligible))


def _model_groups(
    eligible: list[tuple[Candidate, int]], per: Resources
) -> list[list[tuple[Candidate, int]]]:
    """A GPU gang's hosts grouped by ``gpu_model`` (all its tasks share one); else one group."""
    if per.gpu <= EPSILON:
        return [eligible]
    return list(_by_model(eligible).values())


def _fewest_hosts(group: list[tuple[Candidate, int]], n: int, gpu: float) -> Choice | None:
    """The fewest hosts, then racks, then idle GPUs, of ``group`` that hold ``n`` tasks."""
    if sum(cap for _, cap in group) < n:
        return None
    racks: dict[str, list[tuple[Candidate, int]]] = {}
    for c, cap in group:
        racks.setdefault(c.rack, []).append((c, cap))
    options = [_best_fit(group, n)]  # the fewest hosts, wherever they are
    options += [_best_fit(hosts, n) for hosts in racks.values()]  # one rack
    # The roomiest racks combined, as few as possible.
    combined: list[tuple[Candidate, int]] = []
    for hosts in sorted(racks.values(), key=lambda hs: -sum(cap for _, cap in hs)):
        combined += hosts
        if sum(cap for _, cap in combined) >= n:
            options.append(_best_fit(combined, n))
            break
    found = [o for o in options if o is not None]
    return min(found, key=lambda o: (*o.score(gpu), o.counts[0][0].hostname)) if found else None


def _best_fit(hosts: list[tuple[Candidate, int]], n: int) -> Choice | None:
    """Largest hosts first until the rest fits on one host, then the smallest host that holds
    the rest. Ties go to the host with fewer free GPUs (fill what is already partly used)."""
    order = sorted(hosts, key=lambda h: (h[1], h[0].free.gpu, h[0].hostname))  # ascending cap
    caps = [cap for _, cap in order]
    taken: list[tuple[Candidate, int]] = []
    remaining = n
    while remaining > 0 and order:
        i = bisect.bisect_left(caps, remaining)
        if i < len(order):  # the smallest host that holds the rest
            taken.append((order[i][0], remaining))
            return Choice(tuple(taken))
        host, cap = order.pop()  # the largest host
        caps.pop()
        taken.append((host, cap))
        remaining -= cap
    return Choice(tuple(taken)) if remaining <= 0 else None


def _take(choice: Choice, per: Resources, nports: int) -> None:
    for c, count in choice.counts:
        c.free = c.free - per.scale(count) - EXECUTOR_RESOURCES
        c.ports -= nports * count


def _why_not(gang: Gang, pool: list[Candidate], eligible: list[tuple[Candidate, int]]) -> str:
    """The binding constraint, for the job's pending reason."""
    per, n = gang.per_task, gang.size
    ask = f"{n} tasks of {describe(per)}"
    if not pool:
        return f"no host offers free resources; the gang needs {ask}"
    matching = [c for c in pool if matches(gang.spec.task.constraints, c.attributes)]
    if not matching:
        return f"none of {len(pool)} offered hosts matches the task constraints; needs {ask}"
    if not eligible:
        return f"none of {len(matching)} matching hosts has room for one task; needs {ask}"
    if per.gpu > EPSILON:
        best_model, best = max(
            ((m, sum(cap for _, cap in g)) for m, g in _by_model(eligible).items()),
            key=lambda mc: mc[1],
        )
        model = f" {best_model}" if best_model else ""
        return (
            f"needs {ask} on one GPU model; the hosts with free{model} GPUs hold {best} "
            f"(largest host {max(cap for _, cap in eligible)})"
        )
    total = sum(cap for _, cap in eligible)
    return f"needs {ask}; the {len(eligible)} hosts with room hold {total}"


def _by_model(eligible: list[tuple[Candidate, int]]) -> dict[str, list[tuple[Candidate, int]]]:
    out: dict[str, list[tuple[Candidate, int]]] = {}
    for c, cap in eligible:
        out.setdefault(c.attributes.get("gpu_model", ""), []).append((c, cap))
    return out
