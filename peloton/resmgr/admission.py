"""Admission: which queued gangs of a leaf pool may start now, and why the others wait.

Rules, applied to a pool's queue in order (priority then age, or age only for FIFO pools):

- A gang is admitted **whole** iff, for every kind, the pool's allocation plus the gang fits its
  entitlement and the cluster's free capacity. A non-preemptible gang must also fit within the
  pool's *reservation* (with the pool's other non-preemptible work) in every kind the pool
  configures: it never runs on borrowed capacity, so it never has to be taken back.
- **No starvation of big gangs (reserve-ahead).** Once a gang cannot be admitted, the capacity it
  needs is held for it: a gang behind it may pass only if it takes nothing the blocked gangs ahead
  of it still need — in every kind it uses, what is left after it must still cover every blocked
  gang ahead. So a stream of small gangs can never take the GPUs a big gang at the head is waiting
  for, yet small CPU-only gangs still pass a GPU gang that waits only for GPUs. A gang larger than
  its pool's current entitlement holds nothing: it waits for the entitlement to grow (other pools'
  demand falling), and the pool's smaller gangs run meanwhile instead of idling.
- A gang that can never fit — larger than its pool's limit, than the cluster once its capacity is
  known, or (non-preemptible) than its pool's reservation — is infeasible and fails at once. The
  cluster's capacity here counts the hosts lost recently (they may come back, see
  :mod:`peloton.core.capacity`); a gang that fits only with them waits, naming them.

Every gang that waits gets a reason naming the binding constraint, e.g. ``pool /research/vision:
gpu entitlement 8, allocated 6, gang needs 4``. Pure: no I/O, no clock (ages are given).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from peloton.core.capacity import LostHost, lost_total
from peloton.core.pools import QueuePolicy
from peloton.core.resources import EPSILON, KINDS, ZERO, Resources, describe, format_amount
from peloton.resmgr.pool import PoolTree

# Job reasons (short codes stored with the job; the message says the rest).
PENDING_NO_HOSTS = "no_hosts"
NO_HOSTS_YET = "no hosts known yet"
PENDING_ENTITLEMENT = "pool_entitlement"
PENDING_RESERVATION = "pool_reservation"
PENDING_CLUSTER = "cluster_capacity"
PENDING_BEHIND = "queued_behind"
PENDING_RESERVED = "reserved"
PENDING_PLACEMENT = "placement"
INFEASIBLE = "gang_infeasible"


@dataclass(frozen=True)
class Waiting:
    """A gang in a pool's queue."""

    key: str  # the job id
    priority: int
    preemptible: bool
    submitted_at: float  # seconds since the epoch; ties broken by seq
    seq: int
    size: int
    total: Resources
    # GPU-seconds its job has run so far (least-attained-service pools order by it).
    service: float = 0.0


@dataclass(frozen=True)
class Outlook:
    """What the placement-aware policies (BACKFILL, LAS) know besides totals."""

    now: float
    # (expected end, what it frees) of every admitted gang; an end of inf: unknown.
    ends: Sequence[tuple[float, Resources]] = ()
    # Expected run seconds of waiting gangs, by job; left out: unknown.
    runtimes: Mapping[str, float] = field(default_factory=dict)
    # Whether the placement engine finds hosts for a gang now: None if it does (its hosts are
    # then taken for the rest of the cycle), else why not. None: totals only.
    place: Callable[[Waiting], str | None] | None = None
    # Where a reserved gang is expected to run when it starts (at the time given), e.g. "on 2
    # hosts in rack r1", or None if that is not known.
    where: Callable[[Waiting, float], str | None] | None = None


# What a gang needs and whether it is preemptible: gangs alike in both are decided alike.
_Shape = tuple[Resources, bool]


@dataclass
class _Reservation:
    """The first gang that cannot start, and when it can: gangs behind it start now only if
    they end by then or use only what it leaves spare."""

    gang: Waiting
    start: float  # inf: no running gang has an expected end
    spare: Resources


@dataclass
class _Pass:
    """One admission pass over a pool's queue: what it has admitted so far (the pool's
    allocation, the cluster's free capacity) and what it has worked out per gang shape, which
    holds until the next admission. :func:`admit` and :func:`admit_backfill` share it."""

    room: Room
    capacity: Resources
    lost: Sequence[LostHost]
    decision: Decision
    allocation: Resources = ZERO
    np_allocation: Resources = ZERO
    never: dict[_Shape, str | None] = field(default_factory=dict)
    told: dict[_Shape, tuple[str, str]] = field(default_factory=dict)
    # By preemptible: (what the pool's entitlement leaves, what the gang may take now).
    rooms: dict[bool, tuple[Resources, Resources]] = field(default_factory=dict)

    @classmethod
    def of(
        cls, room: Room, cluster_free: Resources, capacity: Resources, lost: Sequence[LostHost]
    ) -> _Pass:
        decision = Decision(cluster_free=cluster_free)
        return cls(room, capacity, lost, decision, room.allocation, room.np_allocation)

    def excluded(self, gang: Waiting, shape: _Shape) -> bool:
        """Whether ``gang`` is out of this pass, its reason recorded: it can never fit
        (infeasible), or it fits the cluster only with hosts lost recently (it waits for them)."""
        if shape not in self.never:
            counted = self.capacity + lost_total(self.lost)  # lost hosts may come back
            self.never[shape] = infeasibility(gang, self.room, counted)
        why_never = self.never[shape]
        if why_never is not None:
            self.decision.infeasible[gang.key] = (INFEASIBLE, why_never)
            return True
        if self.lost and not gang.total.fits_in(self.capacity):
            self.decision.pending[gang.key] = (
                PENDING_CLUSTER,
                _waits_for_lost(gang, self.capacity, self.lost),
            )
            return True
        return False

    def available(self, gang: Waiting) -> tuple[Resources, Resources]:
        """What the pool's entitlement leaves, and what ``gang`` may take now (its pool's room
        and the cluster's free capacity; a non-preemptible gang also its pool's reservation)."""
        if gang.preemptible not in self.rooms:
            pool_room = self.room.entitlement - self.allocation
            available = _min(pool_room, self.decision.cluster_free)
            if not gang.preemptible:
                available = _min(available, self.room.reservation - self.np_allocation)
            self.rooms[gang.preemptible] = (pool_room, available)
        return self.rooms[gang.preemptible]

    def take(self, gang: Waiting) -> None:
        """Admits ``gang``: it is allocated, the cluster has that much less free."""
        self.decision.admitted.append(gang)
        self.allocation = self.allocation + gang.total
        self.decision.cluster_free = self.decision.cluster_free - gang.total
        if not gang.preemptible:
            self.np_allocation = self.np_allocation + gang.total
        self.told.clear()
        self.rooms.clear()

    def wait(self, gang: Waiting, shape: _Shape, pool_room: Resources) -> None:
        """Records why ``gang``, which does not fit now, waits; and whether preemption may
        free capacity for it (over its entitlement, or starved of what it is entitled to)."""
        why = self.told.get(shape)
        if why is None:
            why = self.told[shape] = _why_waiting(
                gang, self.room, self.allocation, self.np_allocation, self.decision.cluster_free
            )
        self.decision.pending[gang.key] = why
        if why[0] == PENDING_ENTITLEMENT:
            self.decision.over_entitlement.append(gang)
        within_reservation = gang.preemptible or gang.total.fits_in(
            self.room.reservation - self.np_allocation
        )
        if within_reservation and gang.total.fits_in(pool_room):
            self.decision.starved.append(gang)


@dataclass(frozen=True)
class Room:
    """What one leaf pool has to admit into."""

    pool: str
    entitlement: Resources
    allocation: Resources
    reservation: Resources
    # Allocation of the pool's non-preemptible gangs (must stay within the reservation).
    np_allocation: Resources
    # The pool's effective limit (its own, capped by its ancestors').
    limit: Resources

    @classmethod
    def of(
        cls,
        tree: PoolTree,
        pool: str,
        entitlement: Resources,
        allocation: Resources,
        np_allocation: Resources,
    ) -> Room:
        """The room of leaf ``pool`` of ``tree``."""
        config = tree.get(pool)
        return cls(
            pool=pool,
            entitlement=entitlement,
            allocation=allocation,
            # Non-preemptible work is held to the reservation of the kinds the pool configures.
            reservation=Resources.of(
                {k: config.kinds[k].reservation if k in config.kinds else math.inf for k in KINDS}
            ),
            np_allocation=np_allocation,
            limit=Resources.of({k: tree.limit(pool, k) for k in KINDS}),
        )


@dataclass
class Decision:
    """The outcome of one admission pass over a pool's queue."""

    admitted: list[Waiting] = field(default_factory=list)
    # key -> (reason code, message)
    pending: dict[str, tuple[str, str]] = field(default_factory=dict)
    infeasible: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Gangs that wait although their pool is entitled to them: the cluster is short because other
    # pools borrow. Preemption takes capacity back for them.
    starved: list[Waiting] = field(default_factory=list)
    # Gangs that wait for their own pool's entitlement (higher-priority ones may preempt).
    over_entitlement: list[Waiting] = field(default_factory=list)
    # The cluster's free capacity after this pool's admissions.
    cluster_free: Resources = ZERO
    # key -> how an admitted gang got past a reservation (BACKFILL, LAS): "backfilled: ...".
    backfilled: dict[str, str] = field(default_factory=dict)


def order(queue: Sequence[Waiting], policy: QueuePolicy, now: float = 0.0) -> list[Waiting]:
    """The queue in admission order (``now``: for the starvation guard of LAS)."""
    if policy is QueuePolicy.FIFO:
        return sorted(queue, key=lambda w: (w.submitted_at, w.seq))
    if policy is QueuePolicy.LAS:
        return sorted(queue, key=lambda w: (-w.priority, las_level(w, now), w.submitted_at, w.seq))
    return sorted(queue, key=lambda w: (-w.priority, w.submitted_at, w.seq))


# Least attained service: the levels' upper bounds in GPU-seconds (1 and 10 GPU-hours), and how
# many times its own run time a gang may wait before it is served at the first level again.
LAS_LEVELS = (3_600.0, 36_000.0)
LAS_STARVATION_FACTOR = 2.0
LAS_STARVATION_MIN_SECONDS = 60.0


def las_level(gang: Waiting, now: float) -> int:
    """The gang's level: by its job's attained GPU-seconds, 0 once it has waited too long."""
    gpus = max(gang.total.gpu, 1.0)
    ran = gang.service / gpus
    if now - gang.submitted_at >= max(LAS_STARVATION_MIN_SECONDS, LAS_STARVATION_FACTOR * ran):
        return 0
    return sum(1 for bound in LAS_LEVELS if gang.service >= bound)


def infeasibility(gang: Waiting, room: Room, capacity: Resources | None) -> str | None:
    """Why ``gang`` can never be admitted in its pool, or None if it could be some day."""
    need = gang.total
    if (
        need.fits_in(room.limit)
        and (capacity is None or need.fits_in(capacity))
        and (gang.preemptible or need.fits_in(room.reservation))
    ):
        return None  # the common case, decided without building a reason
    over = gang.total.shortfall(room.limit)
    if over:
        return f"pool {room.pool}: {_needs(over, 'limit')}; the gang can never fit"
    if capacity is not None:
        over = gang.total.shortfall(capacity)
        if over:
            return f"cluster: {_needs(over, 'capacity')}; the gang can never fit"
    if not gang.preemptible:
        over = gang.total.shortfall(room.reservation)
        if over:
            return (
                f"pool {room.pool}: non-preemptible gangs run only within the reservation: "
                f"{_needs(over, 'reservation')}; make the job preemptible or raise the reservation"
            )
    return None


def admit(
    queue: Sequence[Waiting],
    room: Room,
    cluster_free: Resources,
    capacity: Resources | None,
    no_hosts: str = NO_HOSTS_YET,
    lost: Sequence[LostHost] = (),
    outlook: Outlook | None = None,
) -> Decision:
    """Admit what fits from ``queue`` (already in admission order) into ``room``.

    ``capacity`` is the cluster's total now, or None while no host has reported any (then every
    gang waits, with ``no_hosts`` as the message). ``lost``: hosts lost recently; a gang that
    fits the cluster only with them waits for them (holding nothing) instead of failing.
    ``outlook``: admit as the BACKFILL and LAS pools do (see :func:`admit_backfill`).
    """
    if capacity is None:
        decision = Decision(cluster_free=cluster_free)
        for gang in queue:
            decision.pending[gang.key] = (PENDING_NO_HOSTS, no_hosts)
        return decision
    if outlook is not None:
        return admit_backfill(queue, room, cluster_free, capacity, lost, outlook)
    run = _Pass.of(room, cluster_free, capacity, lost)
    held = ZERO  # what the blocked gangs ahead still need
    blocker: Waiting | None = None
    behind: tuple[str, str] | None = None  # the reason of gangs behind it (built once)
    # Gangs of one shape are decided alike (see _Pass), and whether they may pass the blocked
    # gangs ahead: a shape that may not stays so for the rest of the queue, as what is
    # available only shrinks and what is held only grows; a long queue behind a blocked gang
    # (mostly of a few shapes) costs a lookup per gang.
    stuck: set[_Shape] = set()
    for gang in queue:
        shape = (gang.total, gang.preemptible)
        if behind is not None and shape in stuck:
            run.decision.pending[gang.key] = behind
            continue
        if run.excluded(gang, shape):
            continue
        pool_room, available = run.available(gang)
        if blocker is not None and not _passes(gang.total, available, held):
            if behind is None:
                behind = (
                    PENDING_BEHIND,
                    f"pool {room.pool}: waiting behind job {blocker.key} "
                    f"(priority {blocker.priority}, needs {describe(blocker.total)}), "
                    f"which is first in line for what it needs",
                )
            run.decision.pending[gang.key] = behind
            stuck.add(shape)
            continue
        if gang.total.fits_in(available):
            run.take(gang)
            continue
        run.wait(gang, shape, pool_room)
        if gang.total.fits_in(room.entitlement):
            # It will fit once capacity frees up: hold that capacity for it.
            held = held + gang.total
            blocker = blocker or gang
    return run.decision


def admit_all(
    queues: Mapping[str, Sequence[Waiting]],
    rooms: Mapping[str, Room],
    cluster_free: Resources,
    capacity: Resources | None,
    no_hosts: str = NO_HOSTS_YET,
    lost: Sequence[LostHost] = (),
    outlooks: Mapping[str, Outlook] | None = None,
) -> tuple[dict[str, Decision], Resources]:
    """Admit into every leaf pool (``queues`` in admission order, ``rooms`` by pool), the pool
    using least of its entitlement first, so the most starved pool is first to the cluster's free
    capacity. ``outlooks``: the pools that admit as BACKFILL and LAS do, with what they know.
    Returns each pool's decision, in the order served, and what is still free."""
    outlooks = outlooks or {}

    def starvation(pool: str) -> float:
        alloc, ent = rooms[pool].allocation, rooms[pool].entitlement
        return max((alloc.get(k) / ent.get(k) if ent.get(k) > 0 else 0.0) for k in KINDS)

    decisions: dict[str, Decision] = {}
    free = cluster_free
    for pool in sorted(queues, key=lambda p: (starvation(p), p)):
        decision = admit(
            queues[pool], rooms[pool], free, capacity, no_hosts, lost, outlooks.get(pool)
        )
        decisions[pool] = decision
        free = decision.cluster_free
    return decisions, free


def admit_backfill(
    queue: Sequence[Waiting],
    room: Room,
    cluster_free: Resources,
    capacity: Resources,
    lost: Sequence[LostHost],
    outlook: Outlook,
) -> Decision:
    """Admission of BACKFILL and LAS pools (EASY backfill, placement-aware).

    A gang is admitted when it fits the pool's entitlement and the cluster's free capacity, as
    everywhere, *and* the placement engine finds hosts for it now (so no admitted gang holds
    capacity it cannot use). The first gang within its entitlement that cannot start gets a
    reservation: the earliest time the running gangs' expected ends free what it needs (its
    ``shadow`` time; placement-blocked gangs count on nothing free now). A gang behind it starts
    now only if it is expected to end by then, or if it takes only what the reserved gang leaves
    spare at that time — so backfilled gangs never delay the reservation. A gang whose run time
    is unknown can only use the spare; with no expected end known at all, the reservation holds
    what it needs, as reserve-ahead does. The reservation's reason names where the gang is
    expected to start (``outlook.where``).
    """
    run = _Pass.of(room, cluster_free, capacity, lost)
    decision = run.decision
    reserved: _Reservation | None = None
    behind: tuple[str, str] | None = None  # the reason of gangs that would delay it (built once)
    # (expected end, what it frees) of the gangs this pass admits: they start now, so a
    # reservation counts on their ends too (else it waits a cycle for them to run).
    started: list[tuple[float, Resources]] = []
    for gang in queue:
        shape = (gang.total, gang.preemptible)
        if run.excluded(gang, shape):
            continue
        pool_room, available = run.available(gang)
        unplaced = ""
        if gang.total.fits_in(available):
            ends_first = reserved is not None and _ends_first(gang, reserved, outlook)
            if reserved is not None and not ends_first and not gang.total.fits_in(reserved.spare):
                behind = behind or (PENDING_BEHIND, _behind(room, reserved))
                decision.pending[gang.key] = behind
                continue
            why = outlook.place(gang) if outlook.place is not None else None
            if why is None:
                run.take(gang)
                if reserved is not None:
                    decision.backfilled[gang.key] = _backfilled(gang, reserved, ends_first, outlook)
                    if not ends_first:
                        reserved.spare = reserved.spare - gang.total  # still running at its start
                started.append((outlook.now + _runtime(gang, outlook), gang.total))
                continue
            unplaced = why
            decision.pending[gang.key] = (PENDING_PLACEMENT, f"placement: {why}")
        else:
            run.wait(gang, shape, pool_room)
        if reserved is None and gang.total.fits_in(room.entitlement):
            reserved = _reserve(gang, available, outlook, started, placed_now=not unplaced)
            spot = None
            if reserved.start != math.inf and outlook.where is not None:
                spot = outlook.where(gang, reserved.start)
            decision.pending[gang.key] = (
                PENDING_RESERVED,
                _reserved(room, reserved, unplaced, spot),
            )
    return decision


def _runtime(gang: Waiting, outlook: Outlook) -> float:
    return outlook.runtimes.get(gang.key, math.inf)


def _ends_first(gang: Waiting, reserved: _Reservation, outlook: Outlook) -> bool:
    """Whether ``gang`` is expected to end by the reservation's start (then it may start now
    whatever it takes; otherwise only within what the reserved gang leaves spare)."""
    return outlook.now + _runtime(gang, outlook) <= reserved.start < math.inf


def _reserve(
    gang: Waiting,
    available: Resources,
    outlook: Outlook,
    started: Sequence[tuple[float, Resources]] = (),
    placed_now: bool = True,
) -> _Reservation:
    """When ``gang`` can start: the first expected end (of the admitted gangs, and of those
    ``started`` by this pass) after which what is ``available`` now plus what the gangs ended
    by then free covers it; what is spare at that time. A gang the
    totals fit but the hosts do not (``placed_now`` False) can start no earlier than the first
    expected end, when the hosts' picture changes."""
    have = available
    if placed_now and gang.total.fits_in(have):
        return _Reservation(gang, outlook.now, (have - gang.total).clamp_min_zero())
    for end, frees in sorted([*outlook.ends, *started], key=lambda e: e[0]):
        if end == math.inf:
            break
        have = have + frees
        if gang.total.fits_in(have):
            return _Reservation(gang, max(end, outlook.now), (have - gang.total).clamp_min_zero())
    return _Reservation(gang, math.inf, (have - gang.total).clamp_min_zero())


def _reserved(room: Room, reserved: _Reservation, unplaced: str, spot: str | None) -> str:
    when = (
        f"starts by {_time(datetime.fromtimestamp(reserved.start, UTC))}"
        + (f" {spot}" if spot else "")
        if reserved.start != math.inf
        else "holds what it needs (no running gang has an expected end)"
    )
    why = f"; placement now: {unplaced}" if unplaced else ""
    return f"pool {room.pool}: reserved: {when} (needs {describe(reserved.gang.total)}){why}"


def _backfilled(gang: Waiting, reserved: _Reservation, ends_first: bool, outlook: Outlook) -> str:
    """How an admitted gang got past the reservation: it ends before it starts, or it takes only
    what the reserved gang leaves spare."""
    r = reserved.gang
    if ends_first:
        ends = _time(datetime.fromtimestamp(outlook.now + _runtime(gang, outlook), UTC))
        starts = _time(datetime.fromtimestamp(reserved.start, UTC))
        return f"backfilled: ends by {ends}, before job {r.key}'s reservation at {starts}"
    return f"backfilled: fits in what job {r.key}'s reservation leaves spare"


def _behind(room: Room, reserved: _Reservation) -> str:
    g = reserved.gang
    when = (
        f"at {_time(datetime.fromtimestamp(reserved.start, UTC))}"
        if reserved.start != math.inf
        else "(no expected end known)"
    )
    return (
        f"pool {room.pool}: would delay the reservation of job {g.key} "
        f"(priority {g.priority}, needs {describe(g.total)}) {when}"
    )


def _passes(need: Resources, available: Resources, held: Resources) -> bool:
    """Whether a gang behind blocked ones may take ``need`` without delaying them: in every kind
    it uses, what is left after it still covers what they hold."""
    e = EPSILON
    return (
        (need.cpu <= e or need.cpu <= available.cpu - held.cpu + e)
        and (need.mem_mb <= e or need.mem_mb <= available.mem_mb - held.mem_mb + e)
        and (need.disk_mb <= e or need.disk_mb <= available.disk_mb - held.disk_mb + e)
        and (need.gpu <= e or need.gpu <= available.gpu - held.gpu + e)
    )


def _why_waiting(
    gang: Waiting, room: Room, allocation: Resources, np_allocation: Resources, free: Resources
) -> tuple[str, str]:
    needs = gang.total
    if not gang.preemptible:
        k = _first_short(needs, room.reservation - np_allocation)
        if k is not None:
            return PENDING_RESERVATION, (
                f"pool {room.pool}: {k} reservation {format_amount(room.reservation.get(k))}, "
                f"non-preemptible allocated {format_amount(np_allocation.get(k))}, "
                f"gang needs {format_amount(needs.get(k))}"
            )
    k = _first_short(needs, room.entitlement - allocation)
    if k is not None:
        return PENDING_ENTITLEMENT, (
            f"pool {room.pool}: {k} entitlement {format_amount(room.entitlement.get(k))}, "
            f"allocated {format_amount(allocation.get(k))}, "
            f"gang needs {format_amount(needs.get(k))}"
        )
    k = _first_short(needs, free) or KINDS[0]
    return PENDING_CLUSTER, (
        f"cluster: {k} free {format_amount(max(0.0, free.get(k)))}, gang needs "
        f"{format_amount(needs.get(k))}; capacity lent to other pools is being taken back"
    )


# Lost hosts named in a reason at most (a rack lost names its first few).
_LOST_NAMED = 3


def _waits_for_lost(gang: Waiting, capacity: Resources, lost: Sequence[LostHost]) -> str:
    """Why a gang that fits the cluster only with its recently lost hosts waits: what it
    needs, what is there now, and the lost hosts that have what is missing."""
    k = _first_short(gang.total, capacity) or KINDS[0]
    having = [h for h in lost if h.total.get(k) > EPSILON] or list(lost)
    named = [
        f"{format_amount(h.total.get(k))} more on {h.hostname} "
        f"(lost at {_time(h.lost_at)}, counted until {_time(h.counted_until)})"
        for h in having[:_LOST_NAMED]
    ]
    if len(having) > _LOST_NAMED:
        named.append(f"{len(having) - _LOST_NAMED} more lost hosts")
    return (
        f"cluster: gang needs {format_amount(gang.total.get(k))} {k}, "
        f"{format_amount(capacity.get(k))} available now; {', '.join(named)}"
    )


def _time(at: datetime) -> str:
    # A fixed instant, not an age: the reason is written once, not rewritten every cycle.
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _first_short(need: Resources, available: Resources) -> str | None:
    short = need.shortfall(available)
    # GPUs are the scarce kind people care about; name them first.
    for kind, _, _ in sorted(short, key=lambda s: s[0] != "gpu"):
        return kind
    return None


def _needs(short: list[tuple[str, float, float]], what: str) -> str:
    kind, needed, available = sorted(short, key=lambda s: s[0] != "gpu")[0]
    return f"gang needs {format_amount(needed)} {kind}, {what} is {format_amount(available)}"


def _min(a: Resources, b: Resources) -> Resources:
    return Resources(
        min(a.cpu, b.cpu), min(a.mem_mb, b.mem_mb), min(a.disk_mb, b.disk_mb), min(a.gpu, b.gpu)
    )
