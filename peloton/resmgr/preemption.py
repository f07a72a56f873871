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

**No ping-pong (hysteresis).** A gang must have waited a whole cycle before it can preempt
(``min_wait``), so a transient shortage never kills work. The beneficiary is admitted only within
its own entitlement, so preemption never makes it a victim candidate; a victim's pool was above
its entitlement in the reclaimed kind, so its requeued gang cannot come back (and take capacity
back) until its pool is within its entitlement again. Entitlements depend on demand, and demand —
allocation plus queue — is unchanged by moving a gang from one to the other, so they stay put.
Pure: no I/O; times are given.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Victim:
    gang: Running
    message: str


def victim_order(gangs: Iterable[Running]) -> list[Running]:
    """Lowest priority first, then youngest first."""
    return sorted(gangs, key=lambda g: (g.priority, -g.admitted_at, -g.seq))


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
    for gang in victim_order(g for g in running if g.preemptible and g.pool != pool):
        if not _still_short(left, lacking):
            break
        over = alloc.get(gang.pool, ZERO) - entitlement.get(gang.pool, ZERO)
        # Take only what the pool borrows, in a kind the waiting gang lacks.
        useful = [
            k
            for k in lacking
            if left.get(k) > EPSILON and gang.total.get(k) > EPSILON and over.get(k) > EPSILON
        ]
        if not useful:
            continue
        alloc[gang.pool] = alloc.get(gang.pool, ZERO) - gang.total
        left = left - gang.total
        victims.append(
            Victim(
                gang,
                f"pool {gang.pool} borrowed {useful[0]} above its entitlement "
                f"{_amount(entitlement[gang.pool], useful[0])}; pool {pool} reclaims it for job "
                f"{waiting.key} (needs {describe(waiting.total)})",
            )
        )
    return victims if not _still_short(left, lacking) else []


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
    for gang in victim_order(candidates):
        if not _still_short(left, lacking):
            break
        if not any(gang.total.get(k) > EPSILON for k in lacking if left.get(k) > EPSILON):
            continue
        left = left - gang.total
        victims.append(
            Victim(
                gang,
                f"job {waiting.key} of priority {waiting.priority} needs "
                f"{describe(waiting.total)} in pool {pool}; this job has priority "
                f"{gang.priority}",
            )
        )
    return victims if not _still_short(left, lacking) else []


def shortage(need: Resources, available: Resources) -> Resources:
    """How much of each kind ``need`` exceeds ``available`` by (zero where it fits)."""
    return (need - available).clamp_min_zero()


def _still_short(left: Resources, kinds: Sequence[str]) -> bool:
    return any(left.get(k) > EPSILON for k in kinds)


def _amount(r: Resources, kind: str) -> str:
    return describe(Resources.of({kind: r.get(kind)})) if r.get(kind) > EPSILON else f"{kind} 0"
