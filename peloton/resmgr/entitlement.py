"""Entitlement: how much of each resource kind every pool may use now.

Hierarchical, weighted, demand-aware max-min sharing, per kind, computed top-down. At every pool,
its entitlement ``E`` is split among its children in three phases:

1. **Reservation.** Each child gets ``min(demand, reservation)``; a STATIC child gets its whole
   reservation whatever its demand. (If reservations promise more than ``E`` — only possible at the
   top, where the cluster may be smaller than what was reserved — they are scaled down in
   proportion.)
2. **Demand.** What remains is water-filled among children with unmet demand in proportion to
   their share, each capped by its demand: weighted max-min fairness. Nothing stays idle while
   a child still has demand it is allowed (by its limit) to use.
3. **Lending.** Whatever is still left is spread over ELASTIC children by share up to their limit,
   so a pool whose demand appears before the next computation can start at once.

A pool's demand is its allocation plus what is queued in it, capped by its limit; a parent's
demand is the sum of its children's (a STATIC child counts at least its reservation), capped by
the parent's limit. Pure and clock-free: the resource manager calls :meth:`Calculator.compute` on
every change of demand, capacity or configuration, and periodically.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from peloton.core.pools import ROOT, Policy
from peloton.core.resources import KINDS, Resources
from peloton.resmgr.pool import PoolTree


class ByPool(Mapping[str, Resources]):
    """Per-pool amounts kept as four columns of floats; a pool's Resources is built when read
    (a cycle reads a handful of the thousand pools a computation covers)."""

    def __init__(self, index: Mapping[str, int], columns: Sequence[list[float]]) -> None:
        self._index = index
        self._columns = columns

    def __getitem__(self, path: str) -> Resources:
        i = self._index[path]
        cpu, mem, disk, gpu = self._columns
        return Resources(cpu[i], mem[i], disk[i], gpu[i])

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


@dataclass(frozen=True)
class Entitlements:
    """The result of one computation, for every pool including the root."""

    entitlement: Mapping[str, Resources]
    # Demand rolled up the tree and capped by limits (what the computation worked with).
    demand: Mapping[str, Resources]


class Calculator:
    """Entitlement computation over one pool tree; build it again when the tree changes."""

    def __init__(self, tree: PoolTree) -> None:
        # Index pools so the per-kind loops below touch only lists of floats.
        order = [path for path, _ in tree.walk(ROOT)]
        self._paths = order
        self._index = {p: i for i, p in enumerate(order)}
        self._children: list[list[int]] = [
            [self._index[c] for c in sorted(tree.children(p))] for p in order
        ]
        # Parents, deepest first: the order demand rolls up in.
        self._parents_up = [i for i in reversed(range(len(order))) if self._children[i]]
        n = len(order)
        inf = float("inf")
        self._reservation = {k: [0.0] * n for k in KINDS}
        self._limit = {k: [inf] * n for k in KINDS}
        self._share = {k: [1.0] * n for k in KINDS}
        self._static = {k: [False] * n for k in KINDS}
        for i, path in enumerate(order):
            if path == ROOT:
                continue
            config = tree.get(path)
            for k in KINDS:
                kc = config.kind(k)
                self._reservation[k][i] = kc.reservation
                self._limit[k][i] = kc.limit
                self._share[k][i] = kc.share
                self._static[k][i] = kc.policy is Policy.STATIC

    def compute(self, capacity: Resources, leaf_demand: Mapping[str, Resources]) -> Entitlements:
        """Entitlements for ``capacity`` of the cluster and each leaf pool's demand
        (allocation + queued). Pools missing from ``leaf_demand`` have none."""
        n = len(self._paths)
        # One column of floats per kind, by pool index (attribute reads, no per-kind lookups).
        columns = {k: [0.0] * n for k in KINDS}
        cpu, mem, disk, gpu = (columns[k] for k in ("cpu", "mem_mb", "disk_mb", "gpu"))
        for path, amount in leaf_demand.items():
            i = self._index.get(path)
            if i is not None:
                cpu[i], mem[i], disk[i], gpu[i] = (
                    amount.cpu,
                    amount.mem_mb,
                    amount.disk_mb,
                    amount.gpu,
                )
        rolled = [self._roll_up(k, columns[k]) for k in KINDS]
        ents = [self._split(k, capacity.get(k), d) for k, d in zip(KINDS, rolled, strict=True)]
        return Entitlements(ByPool(self._index, ents), ByPool(self._index, rolled))

    def guarantees(self, capacity: Resources) -> Mapping[str, Resources]:
        """What each pool's reservation guarantees on a cluster of ``capacity``: its reservation,
        scaled down in proportion where its siblings' reservations promise more than their
        parent's guarantee (the root's is the capacity). Siblings' guarantees never sum to more
        than their parent's, so what pools lend never exceeds what exists."""
        columns = [self._guarantee(k, capacity.get(k)) for k in KINDS]
        return ByPool(self._index, columns)

    def _guarantee(self, k: str, capacity: float) -> list[float]:
        reservation = self._reservation[k]
        out = [0.0] * len(self._paths)
        out[0] = capacity
        for i, kids in enumerate(self._children):
            promised = sum(reservation[c] for c in kids)
            scale = min(1.0, out[i] / promised) if promised > 0 else 0.0
            for c in kids:
                out[c] = reservation[c] * scale
        return out

    def _roll_up(self, k: str, leaf_demand: list[float]) -> list[float]:
        """Leaves' demand capped by their limit; parents' the sum of their children's (a STATIC
        child counts at least its reservation), capped by the parent's limit."""
        limit, reservation, static = self._limit[k], self._reservation[k], self._static[k]
        demand = list(map(min, leaf_demand, limit))
        for i in self._parents_up:
            total = 0.0
            for c in self._children[i]:
                d = demand[c]
                total += d if not static[c] or d >= reservation[c] else reservation[c]
            demand[i] = min(total, limit[i])
        return demand

    def _split(self, k: str, capacity: float, demand: list[float]) -> list[float]:
        reservation, limit, share = self._reservation[k], self._limit[k], self._share[k]
        static = self._static[k]
        ent = [0.0] * len(self._paths)
        ent[0] = capacity
        for i, kids in enumerate(self._children):
            if not kids:
                continue
            total = ent[i]
            got = [reservation[c] if static[c] else min(demand[c], reservation[c]) for c in kids]
            promised = sum(got)
            if promised > total:
                scale = total / promised if promised > 0 else 0.0
                got = [g * scale for g in got]
            left = total - sum(got)
            if left > 0:
                unmet = [max(0.0, demand[c] - g) for c, g in zip(kids, got, strict=True)]
                extra = water_fill(left, unmet, [share[c] for c in kids])
                got = [g + e for g, e in zip(got, extra, strict=True)]
                left -= sum(extra)
            if left > 1e-12:
                room = [
                    0.0 if static[c] else max(0.0, limit[c] - g)
                    for c, g in zip(kids, got, strict=True)
                ]
                extra = water_fill(left, room, [share[c] for c in kids])
                got = [g + e for g, e in zip(got, extra, strict=True)]
            for c, g in zip(kids, got, strict=True):
                ent[c] = g
        return ent


def water_fill(amount: float, caps: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Split ``amount`` in proportion to ``weights``, none above its cap, giving what a capped
    one can't take to the others (weighted max-min fairness). Returns the amounts, in order."""
    n = len(caps)
    out = [0.0] * n
    live = [i for i in range(n) if caps[i] > 0 and weights[i] > 0]
    # Fill the children that saturate first (smallest cap per unit of weight).
    live.sort(key=lambda i: caps[i] / weights[i])
    weight = sum(weights[i] for i in live)
    remaining = amount
    for pos, i in enumerate(live):
        fair = remaining * weights[i] / weight
        if caps[i] <= fair:
            out[i] = caps[i]
            remaining -= caps[i]
            weight -= weights[i]
            continue
        for j in live[pos:]:
            out[j] = remaining * weights[j] / weight
        break
    return out
