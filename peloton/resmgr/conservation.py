"""Work conservation: entitlements from the demand that pools can use now.

Entitlement (:mod:`peloton.resmgr.entitlement`) splits the cluster by demand. Counting every
queued gang as demand lets a gang that cannot be admitted claim capacity nobody then uses: a
sweep of 8 GPUs in a pool entitled to 4 also claims its 16 cpus, shrinks a sibling's cpu
entitlement below what the sibling's one small job needs, and the cluster sits idle with two jobs
queued. So a cycle computes entitlements twice:

- **fair**: every queued gang counted, what each pool gets if all of its queue could run;
- **usable**: a queued gang counts only while it fits its pool's entitlement on its own. Those
  are the gangs admission holds capacity for (reserve-ahead): their claim is real, so a big gang
  that *can* be admitted still gets the capacity it waits for. A gang bigger than its pool's
  share holds nothing and now claims nothing either; its share goes to pools that can use it.
  Leaving gangs out shrinks their pools' entitlements, so this repeats until every counted gang
  fits (a few rounds at most).

Leaving gangs out can itself leave capacity idle that no counted gang claims: two pools, each
with a gang bigger than half the cluster, each entitled to half. So the left-out gangs that fit
the cluster's free capacity get a second chance, oldest first: one is counted again if, with its
demand counted, it fits its pool's new entitlement and every gang counted so far still fits its
own. The next cycle recomputes everything from the queues, so nothing here is remembered.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from peloton.core.resources import KINDS, ZERO, Resources
from peloton.resmgr.admission import Room, Waiting, infeasibility
from peloton.resmgr.entitlement import Calculator, Entitlements

# Rounds of leaving out gangs that stopped fitting once others were left out.
ROUNDS = 4
# Second chances tried per cycle: each costs one entitlement computation.
SECOND_CHANCES = 8


@dataclass(frozen=True)
class Conserved:
    """The entitlements of one cycle."""

    # Every queued gang counted as demand (``demand`` is what pool status reports).
    fair: Entitlements
    # Only the gangs that fit their pool's entitlement counted: what admission uses.
    usable: Entitlements
    # Queued gangs whose demand was not counted, by pool.
    left_out: Mapping[str, Sequence[Waiting]]


def conserve(
    calculator: Calculator,
    capacity: Resources,
    demand: Mapping[str, Resources],
    queues: Mapping[str, Sequence[Waiting]],
    rooms: Mapping[str, Room],
    free: Resources,
) -> Conserved:
    """Fair and usable entitlements.

    ``demand``: each leaf pool's allocation plus all its pending tasks (queued or not);
    ``queues``: each leaf pool's queued gangs in admission order, with its ``rooms`` (their
    entitlement is not read); ``free``: the cluster's free capacity now. Gangs that can never
    be admitted (admission fails them) are left out from the start.
    """
    fair = calculator.compute(capacity, demand)
    counted: dict[str, list[Waiting]] = {}
    out: dict[str, list[Waiting]] = {}  # left out for now
    never: dict[str, list[Waiting]] = {}  # left out for good: admission fails them
    for pool, queue in queues.items():
        counted[pool], out[pool], never[pool] = [], [], []
        for g in queue:
            fails = infeasibility(g, rooms[pool], capacity) is not None
            (never if fails else counted)[pool].append(g)

    def entitlements(left_out: Mapping[str, Sequence[Waiting]]) -> Entitlements:
        less = {p: [*never[p], *left_out.get(p, ())] for p in queues}
        return calculator.compute(capacity, _without(demand, less))

    usable = entitlements(out) if any(never.values()) else fair
    for _ in range(ROUNDS):
        if not _leave_out_unfit(counted, out, usable):
            break
        usable = entitlements(out)
    # Second chances are for capacity that no counted gang claims.
    claimed = sum((g.total for gangs in counted.values() for g in gangs), ZERO)
    room = (free - claimed).clamp_min_zero()
    biggest = {pool: _biggest(gangs) for pool, gangs in counted.items()}
    for pool, gang in _second_chances(out, room):
        if not gang.total.fits_in(room):
            continue
        rest = [g for g in out[pool] if g is not gang]
        trial = entitlements({**out, pool: rest})
        if _fits(gang, pool, trial) and _all_fit(biggest, trial):
            out[pool], usable = rest, trial
            counted[pool].append(gang)
            biggest[pool] = _biggest([biggest[pool], gang.total])
            room = room - gang.total
    left_out = {p: (*never[p], *out[p]) for p in queues if never[p] or out[p]}
    return Conserved(fair, usable, left_out)


def _leave_out_unfit(
    counted: dict[str, list[Waiting]], out: dict[str, list[Waiting]], ents: Entitlements
) -> bool:
    """Move the counted gangs that don't fit their pool's entitlement on their own to ``out``;
    whether any moved."""
    moved = False
    for pool, gangs in counted.items():
        if not gangs:
            continue
        ent = ents.entitlement.get(pool, ZERO)
        keep = [g for g in gangs if g.total.fits_in(ent)]
        if len(keep) < len(gangs):
            out[pool].extend(g for g in gangs if not g.total.fits_in(ent))
            counted[pool] = keep
            moved = True
    return moved


def _second_chances(
    out: Mapping[str, Sequence[Waiting]], free: Resources
) -> Iterator[tuple[str, Waiting]]:
    """Up to :data:`SECOND_CHANCES` left-out gangs that fit ``free``, oldest first, each pool's
    in its admission order."""
    lanes = [
        [(pool, g) for g in gangs if g.total.fits_in(free)] for pool, gangs in sorted(out.items())
    ]
    merged = heapq.merge(*lanes, key=lambda pg: (pg[1].submitted_at, pg[1].seq))
    for n, item in enumerate(merged):
        if n >= SECOND_CHANCES:
            return
        yield item


def _fits(gang: Waiting, pool: str, ents: Entitlements) -> bool:
    return gang.total.fits_in(ents.entitlement.get(pool, ZERO))


def _biggest(amounts: Iterable[Waiting | Resources]) -> Resources:
    """The most of each kind any one of ``amounts`` (gangs or amounts) needs: every gang fits an
    entitlement iff this does."""
    totals = [a.total if isinstance(a, Waiting) else a for a in amounts]
    return Resources.of({k: max((t.get(k) for t in totals), default=0.0) for k in KINDS})


def _all_fit(biggest: Mapping[str, Resources], ents: Entitlements) -> bool:
    return all(need.fits_in(ents.entitlement.get(pool, ZERO)) for pool, need in biggest.items())


def _without(
    demand: Mapping[str, Resources], out: Mapping[str, Sequence[Waiting]]
) -> dict[str, Resources]:
    """``demand`` less the left-out gangs (never below zero: sums of fractions drift)."""
    less = dict(demand)
    for pool, gangs in out.items():
        if gangs:
            left = less.get(pool, ZERO) - sum((g.total for g in gangs), ZERO)
            less[pool] = left.clamp_min_zero()
    return less
