"""Preemption: which admitted gangs to take back so that a waiting gang can start.

Two cases, both whole gangs only, both only when the waiting gang then fits:

- **Reclaim between pools.** A gang waits although its pool is entitled to it, because other
  pools borrowed the capacity (the cluster is short). Victims come only from pools running above
  their entitlement in a kind the waiting gang lacks, and only preemptible gangs — non-preemptible
  work runs within reservations and is never taken back.
- **Priority inside a pool.** A gang waits because its own pool is full; lower-priority
  preemptible gangs of the same pool make room for it.

Victims are ordered lowest priority first, then youngest (most recently admitted) first, and
taken one by one until the waiting gang fits; none are taken if it would still not fit.
Elastic gangs are shrunk before any whole gang is taken: first the tasks they run above their
minimum (only as many as the waiting gang needs), in the same order; then whole gangs.

**No ping-pong (hysteresis).** A gang must have waited a whole cycle before it can preempt
(``min_wait``), so a transient shortage never kills work. The beneficiary is admitted only within
its own entitlement, so preemption never makes it a victim candidate; a victim's pool was above
its entitlement in the reclaimed kind, so its requeued gang cannot come back (and take capacity
back) until its pool is within its entitlement again. Entitlements depend on demand, and demand —
allocation plus queue — is unchanged by moving a gang from one to the other, so they stay put.
Pure: no I/O; times are given.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from peloton.core.resources import EPSILON, KINDS, ZERO, Resources, describe
from peloton.resmgr.admission import Waiting

REASON = "preempted"


@dataclass(frozen=True)
class Running:
    """An admitted gang that holds an allocation."""

    key: str  # the job id
    pool: str
    priority: int
    preemptible: bool
    admitted_at: float
    seq: int  # submission order: later is younger when admitted together
    total: Resources
    # Elastic gangs: what one task holds, and how many run above the gang's minimum.
    per_task: Resources = ZERO
    spare: int = 0


@dataclass(frozen=True)
class Victim:
    gang: Running
    message: str
    # Tasks taken from an elastic gang that shrinks; 0: the whole gang.
    tasks: int = 0


def victim_order(gangs: Iterable[Running]) -> list[Running]:
    """Lowest priority first, then youngest first."""
    return sorted(gangs, key=lambda g: (g.priority, -g.admitted_at, -g.seq))


def _takes(gangs: Iterable[Running]) -> list[tuple[Running, bool]]:
    """What may be taken, in the order it is: each elastic gang's tasks above its minimum
    (``True``: a shrink), then whole gangs."""
    ordered = victim_order(gangs)
    return [(g, True) for g in ordered if g.spare] + [(g, False) for g in ordered]


def _take(gang: Running, shrink: bool, left: Resources, taken: Resources) -> tuple[int, Resources]:
    """How many tasks a take of ``gang`` stops (0: the whole gang) and what it frees, given
    what is still ``left`` to free and what was ``taken`` from the gang already."""
    if not shrink:
        return 0, gang.total - taken
    n = _needed(gang, left)
    return n, gang.per_task.scale(n)


def _needed(gang: Running, left: Resources) -> int:
    """How many of ``gang``'s spare tasks cover ``left`` (all of them if they cannot)."""
    counts = [
        math.ceil(left.get(k) / gang.per_task.get(k) - EPSILON)
        for k in KINDS
        if left.get(k) > EPSILON and gang.per_task.get(k) > EPSILON
    ]
    return min(gang.spare, max(counts)) if counts else 0


def _merge(victims: list[Victim]) -> list[Victim]:
    """One victim per gang: a gang shrunk and then taken whole is taken whole."""
    whole = {v.gang.key for v in victims if not v.tasks}
    return [v for v in victims if not v.tasks or v.gang.key not in whole]


def reclaim(
    waiting: Waiting,
    pool: str,
    short: Resources,
    running: Sequence[Running],
    allocation: Mapping[str, Resources],
    entitlement: Mapping[str, Resources],
) -> list[Victim]:
    """Victims in other pools that free ``short`` (what the cluster lacks for ``waiting``), or []
    if taking every candidate would still not free enough."""
    lacking = [k for k in KINDS if short.get(k) > EPSILON]
    alloc = dict(allocation)
    victims: list[Victim] = []
    left = short
    taken: dict[str, Resources] = {}  # freed so far per gang (a shrink, then maybe the rest)
    for gang, shrink in _takes(g for g in running if g.preemptible and g.pool != pool):
        if not _still_short(left, lacking):
            break
        tasks, frees = _take(gang, shrink, left, taken.get(gang.key, ZERO))
        over = alloc.get(gang.pool, ZERO) - entitlement.get(gang.pool, ZERO)
        # Take only what the pool borrows, in a kind the waiting gang lacks.
        useful = [
            k
            for k in lacking
            if left.get(k) > EPSILON and frees.get(k) > EPSILON and over.get(k) > EPSILON
        ]
        if not useful:
            continue
        alloc[gang.pool] = alloc.get(gang.pool, ZERO) - frees
        left = left - frees
        taken[gang.key] = taken.get(gang.key, ZERO) + frees
        victims.append(
            Victim(
                gang,
                f"pool {gang.pool} borrowed {useful[0]} above its entitlement "
                f"{_amount(entitlement[gang.pool], useful[0])}; pool {pool} reclaims it for job "
                f"{waiting.key} (needs {describe(waiting.total)})",
                tasks,
            )
        )
    return _merge(victims) if not _still_short(left, lacking) else []


def by_priority(
    waiting: Waiting, pool: str, short: Resources, running: Sequence[Running]
) -> list[Victim]:
    """Lower-priority preemptible gangs of ``pool`` that free ``short`` for ``waiting``, or []."""
    lacking = [k for k in KINDS if short.get(k) > EPSILON]
    candidates = [
        g for g in running if g.pool == pool and g.preemptible and g.priority < waiting.priority
    ]
    victims: list[Victim] = []
    left = short
    taken: dict[str, Resources] = {}
    for gang, shrink in _takes(candidates):
        if not _still_short(left, lacking):
            break
        tasks, frees = _take(gang, shrink, left, taken.get(gang.key, ZERO))
        if not any(frees.get(k) > EPSILON for k in lacking if left.get(k) > EPSILON):
            continue
        left = left - frees
        taken[gang.key] = taken.get(gang.key, ZERO) + frees
        victims.append(
            Victim(
                gang,
                f"job {waiting.key} of priority {waiting.priority} needs "
                f"{describe(waiting.total)} in pool {pool}; this job has priority "
                f"{gang.priority}",
                tasks,
            )
        )
    return _merge(victims) if not _still_short(left, lacking) else []


def shortage(need: Resources, available: Resources) -> Resources:
    """How much of each kind ``need`` exceeds ``available`` by (zero where it fits)."""
    return (need - available).clamp_min_zero()


def _still_short(left: Resources, kinds: Sequence[str]) -> bool:
    return any(left.get(k) > EPSILON for k in kinds)


def _amount(r: Resources, kind: str) -> str:
    return describe(Resources.of({kind: r.get(kind)})) if r.get(kind) > EPSILON else f"{kind} 0"
