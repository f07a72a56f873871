"""The resource manager: pools, their entitlements, gang admission and preemption.

State lives in memory and is rebuilt at start (pools from the pool store, queues and
allocations from the unfinished jobs' task counts, read through the job ledger:
:mod:`peloton.core.ledger`), so it never drifts from the truth: a job's allocation is its
per-task resources times its tasks that hold resources (READY through KILLING), its demand adds
its PENDING tasks.

The job manager tells us which jobs changed (:meth:`job_changed`, cheap); a *cycle* re-reads them,
recomputes entitlements, admits what fits (PENDING -> READY, whole gangs), fails what never can,
says why the rest waits, and preempts where the rules allow. Cycles run when something changed and
every ``cycle_seconds`` otherwise, on one background thread; tests call :meth:`run_cycle`.
Placement takes admitted gangs through :meth:`take_admitted` (the
:class:`~peloton.core.gang.AdmittedGangs` protocol).

A cycle does not go over every job again: what the jobs hold and want is kept by pool as they
change (exact sums, equal to the bit to summing them afresh), with the jobs that queue and those
that run; a job's queued gangs and its preemption candidate are built again only when it changed.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from peloton.core.capacity import LostHost
from peloton.core.gang import Gang, PlacementCheck
from peloton.core.ledger import PoolStore, SchedulingLedger
from peloton.core.pools import DEFAULT_POOL, ROOT, Policy, PoolConfig, QueuePolicy
from peloton.core.records import JobRecord
from peloton.core.resources import KINDS, ZERO, Resources, describe
from peloton.core.spec import is_elastic, is_gang
from peloton.core.states import Goal, JobState, TaskState
from peloton.errors import InvalidArgument, NotFound
from peloton.resmgr import admission, conservation, preemption
from peloton.resmgr.admission import Decision, Room, Waiting
from peloton.resmgr.conservation import Conserved
from peloton.resmgr.entitlement import Calculator, Entitlements
from peloton.resmgr.metrics import KindStatus, PoolStatus, ResmgrMetrics
from peloton.resmgr.pool import PoolTree

log = logging.getLogger(__name__)

# Task states that hold a share of the pool: admitted and not yet ended.
HOLDING = frozenset(
    {
        TaskState.READY,
        TaskState.PLACING,
        TaskState.PLACED,
        TaskState.LAUNCHING,
        TaskState.LAUNCHED,
        TaskState.STARTING,
        TaskState.RUNNING,
        TaskState.PREEMPTING,
        TaskState.KILLING,
    }
)
# Gangs the background cycle admits at most: their writes are one transaction, under the lock
# placement takes gangs with, so a burst of submissions is admitted in slices the launcher can
# start on, not in one long transaction it waits behind.
ADMISSIONS_PER_CYCLE = 32
# Cycles triggered by changes start at least this far apart.
MIN_CYCLE_GAP_SECONDS = 0.1
# How much a finished job's run time weighs in its name's expected run time.
RUNTIME_WEIGHT = 0.5
# Holding, but already on the way out: freed soon, and not worth preempting.
ENDING = frozenset({TaskState.PREEMPTING, TaskState.KILLING})
# How long where a reserved gang will start stays as worked out while its start moves (see
# ResourceManager._where).
SPOT_SECONDS = 60.0


def _no_growth_limit(_job: JobRecord) -> int | None:
    """The default growth policy: every elastic gang grows to its maximum."""
    return None


@dataclass
class JobView:
    """What the resource manager knows of one unfinished job."""

    job: JobRecord
    per_task: Resources
    pending: int
    holding: int
    ending: int
    # When its current PENDING tasks started waiting, and when it was last admitted (seconds).
    pending_since: float
    admitted_at: float
    seq: int
    # GPU-seconds its tasks have held so far (least-attained-service pools order by it).
    service: float = 0.0
    # Elastic gangs: the size it may grow to now (None: its maximum). Set by the growth policy
    # (ResourceManager.set_growth_policy): a sweep grows only its leading trials.
    growth_limit: int | None = None
    # What gangs() and as_running() built last, and from what: most jobs do not change between
    # two cycles, and every cycle asks for every queued or running job's.
    _gangs: tuple[tuple[int, int, int, float, float, int | None], tuple[Waiting, ...]] | None = (
        field(default=None, init=False, repr=False, compare=False)
    )
    _running: tuple[tuple[int, int, float], preemption.Running] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    # A job's spec never changes: read once (every cycle asks for every job's).
    @functools.cached_property
    def pool(self) -> str:
        return self.job.spec.pool

    @functools.cached_property
    def preemptible(self) -> bool:
        return self.job.spec.preemption.preemptible

    @functools.cached_property
    def max_runtime(self) -> float:
        """Its max_runtime_seconds; 0: none."""
        return float(self.job.spec.max_runtime_seconds)

    @functools.cached_property
    def runtime_key(self) -> tuple[str, str]:
        """(pool, name): jobs whose run times are learned together."""
        return self.pool, self.job.spec.name

    @functools.cached_property
    def _scaled(self) -> dict[int, Resources]:
        return {}

    def amount(self, tasks: int) -> Resources:
        """``tasks`` of its tasks' resources (asked every cycle for the same few counts)."""
        got = self._scaled.get(tasks)
        if got is None:
            got = self._scaled[tasks] = self.per_task.scale(tasks)
        return got

    def queued_gangs(self) -> int:
        """len(gang_sizes()), without building the list."""
        running = self.holding - self.ending
        queued = self._queued(running)
        if queued <= 0:
            return 0
        first = min(queued, max(1, self.job.spec.gang.min_instances - running))
        return 1 + queued - first

    def gang_sizes(self) -> list[int]:
        """How its PENDING tasks queue: the first ``gang.min_instances`` (less those already
        running) as one gang, the rest one task each. Default: all of them as one gang."""
        running = self.holding - self.ending
        queued = self._queued(running)
        if queued <= 0:
            return []
        first = min(queued, max(1, self.job.spec.gang.min_instances - running))
        return [first] + [1] * (queued - first)

    def _queued(self, running: int) -> int:
        """How many of its PENDING tasks queue: all of them, or, under a growth limit, those
        that bring it to its minimum and then as many as the limit leaves room for."""
        if self.growth_limit is None:
            return self.pending
        least = self.job.spec.gang.min_instances - running
        return min(self.pending, max(least, self.growth_limit - running, 0))

    def gangs(self) -> tuple[Waiting, ...]:
        """Its PENDING tasks as gangs of its pool's queue (:meth:`gang_sizes`). An elastic
        gang's tasks above its minimum (growth) queue after every other gang of their priority:
        growth takes only capacity no waiting gang wants, so it never delays one."""
        key = (
            self.pending,
            self.holding,
            self.ending,
            self.pending_since,
            self.service,
            self.growth_limit,
        )
        if self._gangs is None or self._gangs[0] != key:
            spec = self.job.spec
            # The first queued gang brings the gang to its minimum, unless it runs it already.
            growth = (0 if self.spare >= 0 else 1) if is_elastic(spec) else math.inf
            gangs = tuple(
                Waiting(
                    key=self.job.id,
                    priority=spec.priority,
                    preemptible=self.preemptible,
                    submitted_at=math.inf if i >= growth else self.pending_since,
                    seq=self.seq * 1_000_000 + i,
                    size=size,
                    total=self.amount(size),
                    service=self.service,
                )
                for i, size in enumerate(self.gang_sizes())
            )
            self._gangs = (key, gangs)
        return self._gangs[1]

    def as_running(self) -> preemption.Running:
        """Its tasks that hold resources and are not being stopped, as a gang preemption may
        take."""
        key = (self.holding, self.ending, self.admitted_at)
        if self._running is None or self._running[0] != key:
            running = preemption.Running(
                key=self.job.id,
                pool=self.pool,
                priority=self.job.spec.priority,
                preemptible=self.preemptible,
                admitted_at=self.admitted_at,
                seq=self.seq,
                total=self.amount(self.holding - self.ending),
                per_task=self.per_task,
                spare=max(0, self.spare),
            )
            self._running = (key, running)
        return self._running[1]

    def waits(self, now: float) -> bool:
        """Whether its PENDING tasks must not queue yet: a restart backoff runs, or a gang's
        previous run is still being stopped (a gang restarts whole, never in pieces)."""
        not_before = self.job.not_before
        if not_before is not None and not_before.timestamp() > now:
            return True
        # An elastic gang that still runs its minimum grows while some of it is being stopped.
        return self.ending > 0 and is_gang(self.job.spec) and self.spare < 0

    @property
    def spare(self) -> int:
        """Elastic gangs: how many running tasks it has above its minimum (what a shrink may
        take); -1 for other gangs, and for an elastic one below its minimum."""
        if not is_elastic(self.job.spec):
            return -1
        running = self.holding - self.ending
        least = self.job.spec.gang.min_instances
        return running - least if running >= least else -1


@dataclass(frozen=True)
class QueuedGang:
    """One waiting gang as the console shows it (:meth:`ResourceManager.queue`)."""

    job_id: str
    position: int  # in its pool's admission order, 1 = next
    size: int  # tasks
    total: Resources
    reason: str  # the words `peloton job get` shows ("" before a cycle said why)
    message: str
    waiting_since: datetime
    # Reserved gangs (BACKFILL, LAS): when they are expected to start and where (None: unknown).
    reserved_start: datetime | None = None
    reserved_where: str | None = None


@dataclass(frozen=True)
class Usage:
    """What each leaf pool's jobs hold (pools holding nothing left out), and in all."""

    allocation: Mapping[str, Resources]
    np_allocation: Mapping[str, Resources]  # of non-preemptible jobs
    ending: Mapping[str, Resources]  # held by tasks being killed or preempted
    total: Resources
    total_ending: Resources


# Every finite float times 2**_EXACT_SHIFT is an integer: the book keeps its sums as such
# integers, so they are exact whatever the order jobs came and went in, and taking a job's share
# back leaves no rounding behind (a long-running daemon's sums never drift).
_EXACT_SHIFT = 1074
_EXACT_ONE = 1 << _EXACT_SHIFT
# The book's sums of one pool: allocation, non-preemptible allocation, ending, demand; 4 kinds
# each, at these offsets.
_ALLOC, _NP_ALLOC, _ENDING, _DEMAND = 0, 4, 8, 12


def _exact(amount: Resources) -> tuple[int, int, int, int]:
    """``amount`` as integers, each kind times 2**_EXACT_SHIFT."""
    out = []
    for x in (amount.cpu, amount.mem_mb, amount.disk_mb, amount.gpu):
        n, d = x.as_integer_ratio()  # d is a power of two
        out.append(n << (_EXACT_SHIFT + 1 - d.bit_length()))
    return out[0], out[1], out[2], out[3]


def _resources(sums: Sequence[int], at: int) -> Resources:
    """The Resources of the exact sums at ``sums[at:at + 4]`` (int division rounds correctly)."""
    one = _EXACT_ONE
    return Resources(sums[at] / one, sums[at + 1] / one, sums[at + 2] / one, sums[at + 3] / one)


class _Book:
    """What the unfinished jobs hold and want, by leaf pool, kept up to date as their views
    change (a view is removed before what it counts changes, and added back after): a cycle
    reads these instead of going over every job, most of which did not change since the last.
    The sums are exact, so they equal a book of the same views built from scratch to the bit,
    whatever the order of the changes that led to them."""

    def __init__(self) -> None:
        self._sums: dict[str, list[int]] = {}  # by pool: see _ALLOC, ...; exact
        self._jobs: dict[str, int] = {}  # views counted, by pool (a pool of none is dropped)
        # Views with PENDING tasks, by pool; how many gangs they queue (JobView.queued_gangs).
        self.queued: dict[str, dict[str, JobView]] = {}
        self.queued_gangs: dict[str, int] = {}
        # Views with tasks that hold resources and are not being stopped, by job.
        self.running: dict[str, JobView] = {}
        self._usage: Usage | None = None  # usage(), until the next change

    def add(self, view: JobView) -> None:
        """Count ``view`` as it is now."""
        self._count(view, 1)
        if view.pending:
            self.queued.setdefault(view.pool, {})[view.job.id] = view
        if view.holding > view.ending:
            self.running[view.job.id] = view

    def remove(self, view: JobView) -> None:
        """Stop counting ``view``, as it was when last added (before any change to it)."""
        self._count(view, -1)
        queued = self.queued.get(view.pool)
        if queued is not None and queued.pop(view.job.id, None) is not None and not queued:
            del self.queued[view.pool]
        self.running.pop(view.job.id, None)

    def _count(self, view: JobView, sign: int) -> None:
        self._usage = None
        pool = view.pool
        sums = self._sums.get(pool)
        if sums is None:
            sums = self._sums[pool] = [0] * 16
        parts = [(_DEMAND, view.amount(view.pending + view.holding))]
        if view.holding:
            held = view.amount(view.holding)
            parts.append((_ALLOC, held))
            if not view.preemptible:
                parts.append((_NP_ALLOC, held))
        if view.ending:
            parts.append((_ENDING, view.amount(view.ending)))
        for at, amount in parts:
            for i, n in enumerate(_exact(amount)):
                sums[at + i] += sign * n
        gangs = self.queued_gangs.get(pool, 0) + sign * view.queued_gangs()
        if gangs:
            self.queued_gangs[pool] = gangs
        else:
            self.queued_gangs.pop(pool, None)
        jobs = self._jobs.get(pool, 0) + sign
        if jobs:
            self._jobs[pool] = jobs
        else:  # every sum is back to exactly 0
            del self._jobs[pool], self._sums[pool]

    def usage(self) -> Usage:
        """What each pool holds now."""
        if self._usage is None:
            alloc: dict[str, Resources] = {}
            np_alloc: dict[str, Resources] = {}
            ending: dict[str, Resources] = {}
            total, total_ending = [0] * 4, [0] * 4
            for pool, sums in self._sums.items():
                for out, at in ((alloc, _ALLOC), (np_alloc, _NP_ALLOC), (ending, _ENDING)):
                    if any(sums[at : at + 4]):
                        out[pool] = _resources(sums, at)
                for i in range(4):
                    total[i] += sums[_ALLOC + i]
                    total_ending[i] += sums[_ENDING + i]
            self._usage = Usage(
                alloc, np_alloc, ending, _resources(total, 0), _resources(total_ending, 0)
            )
        return self._usage

    def demand(self) -> dict[str, Resources]:
        """Each pool's demand: what its jobs hold plus their PENDING tasks."""
        return {pool: _resources(sums, _DEMAND) for pool, sums in self._sums.items()}


class ResourceManager:
    """Pools, entitlements, admission and preemption for one daemon."""

    def __init__(
        self,
        pools: PoolStore,
        jobs: SchedulingLedger,
        *,
        metrics: ResmgrMetrics | None = None,
        clock: Callable[[], float] = time.time,
        cycle_seconds: float = 1.0,
        no_hosts: str = admission.NO_HOSTS_YET,
        placement: PlacementCheck | None = None,
    ) -> None:
        """``pools``: where pool configurations are kept; ``jobs``: the job ledger every
        admission, failure and preemption is written through. ``no_hosts``: why gangs wait
        while no host is known (e.g. no Mesos master). ``placement``: whether the cluster's
        hosts hold a gang now, for the placement-aware pools (BACKFILL, LAS); without it they
        admit on totals."""
        self._placement = placement
        # How far each elastic gang may grow now (None: to its maximum); see set_growth_policy.
        self._growth_policy: Callable[[JobRecord], int | None] = _no_growth_limit
        # Expected run seconds of jobs, learned from the finished ones, by (pool, name).
        self._runtimes: dict[tuple[str, str], float] = {}
        self._service_at: float | None = None
        self._pools = pools
        self._no_hosts = no_hosts
        self._jobs = jobs
        self._clock = clock
        self._cycle_seconds = cycle_seconds
        self.metrics = metrics or ResmgrMetrics()
        self._lock = threading.RLock()  # the scheduling state below
        self._tree = PoolTree()
        self._calculator = Calculator(self._tree)
        self._capacity: Resources | None = None
        self._lost: tuple[LostHost, ...] = ()  # hosts lost recently, still counted as capacity
        self._views: dict[str, JobView] = {}  # in seq order
        self._book = _Book()  # what the views hold and queue, by pool
        self._seq = 0
        self._reasons: dict[str, tuple[str, str]] = {}  # last pending reason written, per job
        # Where reserved gangs are expected to start: job -> (start, when worked out,
        # "on 2 hosts in rack r1").
        self._spots: dict[str, tuple[float, float, str | None]] = {}
        self._starved: set[str] = set()  # jobs starved for capacity in the previous cycle
        self._statuses: dict[str, PoolStatus] = {}
        # The last cycle's entitlements; statuses are built from them when first read (metrics
        # and the pool API read them far less often than cycles run).
        self._conserved: Conserved | None = None
        # Changed jobs, told by the job manager; and gangs admitted but not yet placed.
        self._wake = threading.Condition()
        self._dirty: set[str] = set()
        self._backlog = False  # the last cycle left admitted gangs for the next
        self._cycle_at = -math.inf  # when the last whole cycle ran, and with what capacity
        self._cycle_capacity: tuple[Resources | None, tuple[LostHost, ...]] = (None, ())
        self._admitted: deque[Gang] = deque()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._admission_listeners: list[Callable[[], None]] = []
        self.metrics.watch(self.statuses)

    # ---------------------------------------------------------------- life cycle

    def load(self) -> None:
        """Rebuild pools, queues and allocations from what is stored (at daemon start)."""
        pools = self._pools.all_pools()
        if not pools:
            # A fresh install: one leaf pool with no reservation, so jobs can run at once.
            self._write_created(PoolConfig(DEFAULT_POOL, owner="peloton"))
            pools = [PoolConfig(DEFAULT_POOL, owner="peloton")]
        with self._lock:
            self._set_tree(PoolTree(pools))
        self._jobs.requeue_placements()
        for job in self._jobs.unfinished_jobs():
            self._refresh(job)
            ready = self._jobs.instances(job.id, {TaskState.READY})
            if ready:
                at = job.updated_at
                self._admitted.append(
                    Gang.of_job(job.id, job.spec, ready, at, admitted_at=at.timestamp())
                )
        self.run_cycle()
        log.info(
            "resource manager loaded",
            extra={"pools": len(pools), "jobs": len(self._views), "admitted": len(self._admitted)},
        )

    def load_pools(self) -> None:
        """Read the pool tree as stored, and nothing else: a daemon that does not lead (several
        daemons) schedules nothing, but checks new jobs' pools and serves pool reads."""
        pools = self._pools.all_pools()
        with self._lock:
            self._set_tree(PoolTree(pools))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="resmgr", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._wake:
                if not self._dirty and not self._backlog and not self._stopping:
                    self._wake.wait(self._cycle_seconds)
                if self._stopping:
                    return
            try:
                self.run_cycle(ADMISSIONS_PER_CYCLE, when_changed=True)
            except Exception:  # keep scheduling; the next cycle re-reads everything it needs
                log.exception("resource manager cycle failed")
                time.sleep(self._cycle_seconds)
            # Changes meanwhile wait for the next cycle: every status update marks its job
            # changed, and cycling back to back under a stream of them would take the time the
            # writes themselves need (a cycle costs the same for one changed job or many). Not
            # admissions left for the next cycle (a burst admitted in slices): it follows at once.
            if not self._backlog:
                with self._wake:
                    self._wake.wait_for(lambda: self._stopping, MIN_CYCLE_GAP_SECONDS)

    # ---------------------------------------------------------------- inputs

    def set_capacity(self, total: Resources, lost: Sequence[LostHost] = ()) -> None:
        """The cluster's total resources now and its hosts lost recently (from the host
        manager), whenever they change: gangs are admitted into ``total``, and fail as never
        fitting only if they would not fit even with ``lost``."""
        # Not under self._lock: the host manager calls this from its own threads, possibly
        # holding its locks while a cycle (holding ours) asks it to kill tasks.
        with self._wake:
            self._capacity, self._lost = total, tuple(lost)
            self._wake.notify_all()

    def set_growth_policy(self, policy: Callable[[JobRecord], int | None]) -> None:
        """How far each elastic gang may grow now (None: to its maximum), asked whenever a
        job is re-read: a sweep grows only its leading trials (peloton.sweep.controller). Call
        :meth:`job_changed` when a job's answer changes."""
        self._growth_policy = policy

    def set_placement(self, placement: PlacementCheck) -> None:
        """Where the placement-aware pools ask whether a gang fits the hosts now."""
        self._placement = placement

    def job_changed(self, job_id: str) -> None:
        with self._wake:
            self._dirty.add(job_id)
            self._wake.notify_all()

    def check_pool(self, pool: str) -> None:
        # The tree is replaced, never changed in place: reading it needs no lock, so CreateJob
        # does not wait for a cycle.
        tree = self._tree
        if pool not in tree:
            raise InvalidArgument("pool", f"pool {pool} does not exist (see `peloton pool tree`)")
        if not tree.is_leaf(pool):
            raise InvalidArgument(
                "pool", f"pool {pool} has child pools; jobs run only in leaf pools"
            )

    # ---------------------------------------------------------------- pools

    def pool_tree(self) -> PoolTree:
        with self._lock:
            return self._tree

    def create_pool(self, config: PoolConfig) -> PoolStatus:
        with self._lock:
            tree = self._tree.with_created(config, self._unfinished_by_pool())
            self._write_created(config)
            self._set_tree(tree)
            self.run_cycle()
            log.info("pool created", extra={"pool": config.path})
            return self._current_statuses()[config.path]

    def update_pool(self, config: PoolConfig) -> PoolStatus:
        with self._lock:
            tree = self._tree.with_updated(config)
            self._pools.update_pool(config, _now())
            self._set_tree(tree)
            self.run_cycle()
            log.info("pool updated", extra={"pool": config.path})
            return self._current_statuses()[config.path]

    def delete_pool(self, path: str) -> None:
        with self._lock:
            tree = self._tree.without(path, self._unfinished_by_pool())
            self._pools.delete_pool(path)
            self._set_tree(tree)
            self.run_cycle()
            log.info("pool deleted", extra={"pool": path})

    def status(self, path: str) -> PoolStatus:
        with self._lock:
            if path not in self._tree:
                raise NotFound(f"pool {path} not found")
            return self._current_statuses()[path]

    def statuses(self) -> Mapping[str, PoolStatus]:
        with self._lock:
            return dict(self._current_statuses())

    def queue(self) -> dict[str, list[QueuedGang]]:
        """Every leaf pool's waiting gangs in the order the next cycle would consider them, each
        with why it waits as last said; read-only (no cycle runs, nothing is written)."""
        with self._lock:
            now = self._clock()
            out: dict[str, list[QueuedGang]] = {}
            for pool, waiting in self._queues().items():
                if not self._tree.is_leaf(pool):
                    continue  # the next cycle fails these
                ordered = admission.order(waiting, self._tree.get(pool).queue_policy, now)
                out[pool] = [self._queued(i, w) for i, w in enumerate(ordered, 1)]
            return out

    def _queued(self, position: int, w: Waiting) -> QueuedGang:
        view = self._views[w.key]
        reason, message = self._reasons.get(w.key, (view.job.reason, view.job.message))
        spot = self._spots.get(w.key)
        start = spot[0] if spot is not None and math.isfinite(spot[0]) else None
        return QueuedGang(
            job_id=w.key,
            position=position,
            size=w.size,
            total=w.total,
            reason=reason,
            message=message,
            waiting_since=datetime.fromtimestamp(view.pending_since, UTC),
            reserved_start=None if start is None else datetime.fromtimestamp(start, UTC),
            reserved_where=spot[2] if spot is not None else None,
        )

    def _unfinished_by_pool(self) -> dict[str, int]:
        return self._pools.unfinished_jobs_by_pool()

    def _write_created(self, config: PoolConfig) -> None:
        self._pools.insert_pool(config, _now())

    def _set_tree(self, tree: PoolTree) -> None:
        self._tree = tree
        self._calculator = Calculator(tree)

    # ---------------------------------------------------------------- placement's side

    def add_admission_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the cycle's thread) whenever gangs were admitted."""
        self._admission_listeners.append(listener)

    def take_admitted(self, limit: int) -> Sequence[Gang]:
        """Up to ``limit`` admitted gangs not yet placed, highest priority first."""
        with self._lock:
            live = [g for g in self._admitted if self._still_admitted(g)]
            live.sort(key=lambda g: (-g.priority, g.submitted_at))
            taken, rest = live[:limit], live[limit:]
            self._admitted = deque(rest)
            return taken

    def return_admitted(self, returned: Sequence[tuple[Gang, str]]) -> None:
        """Placement could not place these gangs now: they stay admitted and are offered
        again; their reasons are written in one transaction (one per gang held up the launcher
        while a full cluster waited for offers)."""
        if not returned:
            return
        with self._lock:
            for gang, _ in returned:
                if self._still_admitted(gang):
                    self._admitted.append(gang)
        self._jobs.set_pending_reasons(
            {gang.job_id: ("placement", reason) for gang, reason in returned}
        )

    def _still_admitted(self, gang: Gang) -> bool:
        view = self._views.get(gang.job_id)
        return view is not None and view.job.goal != Goal.KILL and view.holding > 0

    # ---------------------------------------------------------------- the cycle

    def run_cycle(self, max_admissions: int | None = None, *, when_changed: bool = False) -> None:
        """Re-read changed jobs, recompute entitlements, admit, fail, explain and preempt.

        ``max_admissions``: write at most this many of the gangs admitted; the rest are
        admitted by the next cycle, which then follows at once. ``when_changed``: stop after
        the re-read if no queue, allocation, goal, backoff or the capacity changed and the last
        whole cycle is less than ``cycle_seconds`` old (it would decide the same: most changes
        are tasks starting, which move nothing between queue and allocation)."""
        with self._lock:
            changed = self._refresh_dirty() or self._backlog
            capacity = (self._capacity, self._lost)
            now = self._clock()
            if (
                when_changed
                and not changed
                and capacity == self._cycle_capacity
                and now - self._cycle_at < self._cycle_seconds
            ):
                return
            self._cycle_at, self._cycle_capacity = now, capacity
            usage = self._book.usage()
            free = (self._capacity or ZERO) - usage.total
            queues = self._leaf_queues()
            conserved = self._entitlements(queues, usage, free)
            ents = conserved.usable
            rooms = {p: self._room(p, ents.entitlement.get(p, ZERO), usage) for p in queues}
            self._account_service(now)
            decisions, free = admission.admit_all(
                queues,
                rooms,
                free,
                self._capacity,
                self._no_hosts,
                self._lost,
                self._outlooks(queues, now),
            )
            self._explain(decisions.values())
            admitted = [(pool, g) for pool, d in decisions.items() for g in d.admitted]
            notes = {k: n for d in decisions.values() for k, n in d.backfilled.items()}
            self._admit(admitted[:max_admissions], notes)
            self._backlog = max_admissions is not None and len(admitted) > max_admissions
            usage = self._book.usage()
            starved_now: set[str] = set()
            for pool, decision in decisions.items():
                starved_now.update(self._preempt_for(pool, decision, ents, usage, free))
            self._starved = starved_now
            # Admission and preemption move tasks between queue and allocation; demand (their
            # sum) and so the entitlements stay as computed.
            self._conserved, self._statuses = conserved, {}

    def _refresh_dirty(self) -> bool:
        """Re-read the changed jobs; whether anything a cycle decides on changed."""
        with self._wake:
            dirty, self._dirty = self._dirty, set()
        if not dirty:
            return False
        fresh = self._jobs.get_jobs(dirty)
        changed = False
        for job_id in dirty - {job.id for job in fresh}:
            self._forget(job_id)  # deleted
            changed = True
        # Oldest first, so jobs first seen together still queue in submission order.
        for job in sorted(fresh, key=lambda j: (j.created_at, j.id)):
            changed = self._refresh(job) or changed
        return changed

    def _refresh(self, job: JobRecord) -> bool:
        """Update a job's view; whether its queue, allocation, goal or backoff changed."""
        if job.terminal:
            if job.state == JobState.SUCCEEDED and job.id in self._views:
                self._learn(self._views[job.id], self._clock())
            self._forget(job.id)
            return True
        counts = job.task_counts
        pending = counts.get(TaskState.PENDING, 0)
        holding = sum(n for s, n in counts.items() if s in HOLDING)
        ending = sum(n for s, n in counts.items() if s in ENDING)
        now = self._clock()
        view = self._views.get(job.id)
        if view is None:
            self._seq += 1
            since = job.updated_at.timestamp()
            view = JobView(
                job=job,
                per_task=Resources.from_proto(job.spec.task.resources),
                pending=pending,
                holding=holding,
                ending=ending,
                pending_since=min(since, now),
                admitted_at=since,
                seq=self._seq,
                growth_limit=self._growth_policy(job),
            )
            self._views[job.id] = view
            self._book.add(view)
            return True
        changed = (pending, holding, ending, job.goal, job.not_before) != (
            view.pending,
            view.holding,
            view.ending,
            view.job.goal,
            view.job.not_before,
        )
        written = self._reasons.get(job.id)
        if (
            written is not None
            and job.state == JobState.PENDING
            and written != (job.reason, job.message)
        ):
            # Someone else rewrote why it waits (a kill then a restart between two cycles,
            # placement): the next cycle must say it again, not skip it as already said.
            del self._reasons[job.id]
            changed = True
        if pending and not view.pending:
            view.pending_since = now  # a new wait begins (restart or preemption)
        limit = self._growth_policy(job)
        changed = changed or limit != view.growth_limit
        counted = (pending, holding, ending, limit) != (
            view.pending,
            view.holding,
            view.ending,
            view.growth_limit,
        )
        if counted:
            self._book.remove(view)
        view.job, view.pending, view.holding, view.ending = job, pending, holding, ending
        view.growth_limit = limit
        if counted:
            self._book.add(view)
        return changed

    def _forget(self, job_id: str) -> None:
        view = self._views.pop(job_id, None)
        if view is not None:
            self._book.remove(view)
        self._reasons.pop(job_id, None)
        self._spots.pop(job_id, None)

    def _entitlements(
        self, queues: Mapping[str, list[Waiting]], usage: Usage, free: Resources
    ) -> Conserved:
        """Fair and usable entitlements (see :mod:`peloton.resmgr.conservation`): demand is
        every job's holding and pending tasks, less the queued gangs their pool can't fit."""
        demand = self._book.demand()
        capacity = self._capacity
        if capacity is None:  # nothing is admitted: no cluster yet
            return conservation.conserve(self._calculator, ZERO, demand, {}, {}, free)
        rooms = {pool: self._room(pool, ZERO, usage) for pool in queues}
        return conservation.conserve(self._calculator, capacity, demand, queues, rooms, free)

    def _leaf_queues(self) -> dict[str, list[Waiting]]:
        """Every leaf pool's waiting gangs in admission order; jobs queued in a pool that is no
        longer a leaf (deleted, or given children) fail."""
        out: dict[str, list[Waiting]] = {}
        now = self._clock()
        for pool, queue in self._queues().items():
            if self._tree.is_leaf(pool):
                out[pool] = admission.order(queue, self._tree.get(pool).queue_policy, now)
                continue
            why = (
                f"pool {pool} no longer exists"
                if pool not in self._tree
                else f"pool {pool} is not a leaf pool"
            )
            for w in queue:
                self._fail(w.key, why)
        return out

    def _queues(self) -> dict[str, list[Waiting]]:
        """Every pool's waiting gangs (in no particular order; :meth:`JobView.gangs`), pools in
        the order of their oldest queued job (a walk over every job meets them in that order)."""
        out: dict[str, list[Waiting]] = {}
        oldest: dict[str, int] = {}
        now = self._clock()
        for pool, views in self._book.queued.items():
            queue: list[Waiting] = []
            for view in views.values():
                if view.job.goal == Goal.KILL or view.waits(now):
                    continue
                queue.extend(view.gangs())
                oldest[pool] = min(oldest.get(pool, view.seq), view.seq)
            if queue:
                out[pool] = queue
        return {pool: out[pool] for pool in sorted(out, key=oldest.__getitem__)}

    # ---------------------------------------------------------------- what policies know

    def _account_service(self, now: float) -> None:
        """Add the GPU-seconds since the last cycle to each job's attained service."""
        since, self._service_at = self._service_at, now
        if since is None or now <= since:
            return
        for v in self._book.running.values():
            v.service += v.per_task.gpu * (v.holding - v.ending) * (now - since)

    def _learn(self, view: JobView, now: float) -> None:
        """A job succeeded: its run (admission to end) updates its name's expected run time."""
        key = view.runtime_key
        ran = max(0.0, now - view.admitted_at)
        old = self._runtimes.get(key)
        self._runtimes[key] = (
            ran if old is None else RUNTIME_WEIGHT * ran + (1 - RUNTIME_WEIGHT) * old
        )

    def expected_runtime(self, view: JobView) -> float:
        """A job's expected run seconds: its max_runtime_seconds, else what finished jobs of its
        name in its pool took (an average weighted to the recent), else inf (unknown)."""
        return view.max_runtime or self._runtimes.get(view.runtime_key, math.inf)

    def _outlooks(
        self, queues: Mapping[str, list[Waiting]], now: float
    ) -> dict[str, admission.Outlook]:
        """What each BACKFILL or LAS pool's admission knows: expected ends of the admitted
        gangs, expected run times of the waiting ones, and placement now (shared: what one
        pool's admissions take is gone for the next)."""
        planned = [
            p
            for p in queues
            if self._tree.get(p).queue_policy in (QueuePolicy.BACKFILL, QueuePolicy.LAS)
        ]
        if not planned:
            return {}
        # In job order: admission weighs gangs that end at the same time in this order.
        ends = [
            (v.admitted_at + self.expected_runtime(v), v.amount(v.holding - v.ending))
            for v in sorted(self._book.running.values(), key=lambda v: v.seq)
        ]
        runtimes = {
            w.key: self.expected_runtime(self._views[w.key]) for p in planned for w in queues[p]
        }
        place, where = self._placement_asked(now) if self._placement is not None else (None, None)
        outlook = admission.Outlook(now, ends, runtimes, place, where)
        return dict.fromkeys(planned, outlook)

    def _placement_asked(
        self, now: float
    ) -> tuple[Callable[[Waiting], str | None], Callable[[Waiting, float], str | None]]:
        """What admission asks placement in a cycle: whether a gang fits the hosts as they are
        now, once the gangs admitted earlier but not yet placed have taken theirs; and where a
        reserved gang is expected to start (see :meth:`_where`)."""
        placement = self._placement
        assert placement is not None
        # Taken on the first question only: most cycles ask none (nothing fits the totals).
        fits: list[Callable[[Gang], str | None]] = []
        placed: list[tuple[float, Gang]] = []  # this cycle's: (expected end, gang)

        def place(w: Waiting) -> str | None:
            if not fits:
                fits.append(placement.round(list(self._admitted)))
            gang = self._gang_of(w)
            why = fits[0](gang)
            if why is None:
                placed.append((now + self.expected_runtime(self._views[w.key]), gang))
            return why

        def where(w: Waiting, start: float) -> str | None:
            return self._where(w, start, placed)

        return place, where

    def _where(self, w: Waiting, start: float, placed: Sequence[tuple[float, Gang]]) -> str | None:
        """Where reserved gang ``w`` is expected to start at ``start``: placement on the hosts
        as they will be then (the gangs expected to end by then gone; those admitted and not
        expected to end by then placed first). Asked again only when its start moves, and
        at most every :data:`SPOT_SECONDS`: the start moves with nearly every gang that starts
        or ends, and each answer places on a snapshot of every host."""
        now = self._clock()
        told = self._spots.get(w.key)
        if told is not None and (told[0] == start or now - told[1] < SPOT_SECONDS):
            return told[2]
        placement = self._placement
        assert placement is not None
        ended = {
            key
            for key, v in self._book.running.items()
            if v.admitted_at + self.expected_runtime(v) <= start
        }
        first = [g for g in self._admitted if g.job_id not in ended]
        first += [g for end, g in placed if end > start]
        spot = placement.where(self._gang_of(w), ended, first)
        self._spots[w.key] = (start, now, spot)
        return spot

    def _gang_of(self, w: Waiting) -> Gang:
        view = self._views[w.key]
        at = datetime.fromtimestamp(view.pending_since, UTC)
        return Gang.of_job(w.key, view.job.spec, tuple(range(w.size)), at)

    def _room(self, pool: str, entitlement: Resources, usage: Usage) -> Room:
        return Room.of(
            self._tree,
            pool,
            entitlement,
            usage.allocation.get(pool, ZERO),
            usage.np_allocation.get(pool, ZERO),
        )

    def _explain(self, decisions: Iterable[Decision]) -> None:
        """Fail what can never be admitted; tell each waiting job why it waits (once), every
        new reason of the cycle in one write."""
        told: dict[str, tuple[str, str]] = {}
        for decision in decisions:
            for key, (_, message) in decision.infeasible.items():
                self._fail(key, message)
            for key, reason in decision.pending.items():
                if self._reasons.get(key) != reason and key not in decision.infeasible:
                    told[key] = self._reasons[key] = reason
        if told:
            self._jobs.set_pending_reasons(told)

    def _admit(
        self, gangs: Sequence[tuple[str, Waiting]], notes: Mapping[str, str] | None = None
    ) -> None:
        """Write the cycle's admissions (one transaction) and hand the gangs to placement;
        ``notes``: how a gang got past a reservation, added to its message."""
        if not gangs:
            return
        notes = notes or {}
        messages = [
            f"admitted in pool {pool}: {describe(g.total)}"
            + (f" ({notes[g.key]})" if g.key in notes else "")
            for pool, g in gangs
        ]
        results = self._jobs.admit_pending(
            [(g.key, g.size, m) for (_, g), m in zip(gangs, messages, strict=True)]
        )
        for (pool, gang), ids, message in zip(gangs, results, messages, strict=True):
            view = self._views.get(gang.key)
            if ids and view is not None:
                self._admitted_now(view, gang, pool, ids, message)
        for listener in self._admission_listeners:
            listener()

    def _admitted_now(
        self, view: JobView, gang: Waiting, pool: str, ids: tuple[int, ...], message: str
    ) -> None:
        now = self._clock()
        self.metrics.admission_seconds.labels(pool).observe(max(0.0, now - view.pending_since))
        self._book.remove(view)
        view.pending -= len(ids)
        view.holding += len(ids)
        view.admitted_at = now
        self._book.add(view)
        self._reasons.pop(gang.key, None)
        self._spots.pop(gang.key, None)
        at = datetime.fromtimestamp(view.pending_since, UTC)
        self._admitted.append(Gang.of_job(gang.key, view.job.spec, ids, at, admitted_at=now))
        log.info(
            "gang admitted",
            extra={"job_id": gang.key, "pool": pool, "tasks": len(ids), "needs": message},
        )

    def _fail(self, job_id: str, message: str) -> None:
        self._jobs.fail_pending(job_id, admission.INFEASIBLE, message)
        self._reasons.pop(job_id, None)

    # ---------------------------------------------------------------- preemption

    def _running(self) -> list[preemption.Running]:
        return [v.as_running() for v in self._book.running.values() if v.job.goal != Goal.KILL]

    def _preempt_for(
        self, pool: str, decision: Decision, ents: Entitlements, usage: Usage, free: Resources
    ) -> set[str]:
        """Preempt for the first gang of ``pool`` that may; returns the gangs waiting now, for
        the next cycle's hysteresis (a gang must have waited a whole cycle to preempt)."""
        waiting = decision.starved + decision.over_entitlement
        running: list[preemption.Running] | None = None  # read once, when first needed
        held = {
            p: usage.allocation.get(p, ZERO) - usage.ending.get(p, ZERO) for p in self._tree.paths()
        }
        for gang in decision.starved:
            if gang.key not in self._starved:
                continue
            short = preemption.shortage(gang.total, free + usage.total_ending)
            if short.is_zero():
                break  # what is being freed already covers it
            running = running if running is not None else self._running()
            victims = preemption.reclaim(gang, pool, short, running, held, ents.entitlement)
            if victims:
                self._preempt(victims, "reclaim")
                return {g.key for g in waiting}
        for gang in decision.over_entitlement[:1]:
            if gang.key not in self._starved:
                continue
            room = ents.entitlement.get(pool, ZERO) - held.get(pool, ZERO)
            short = preemption.shortage(gang.total, room)
            if not short.is_zero():
                running = running if running is not None else self._running()
                victims = preemption.by_priority(gang, pool, short, running)
                if victims:
                    self._preempt(victims, "priority")
        return {g.key for g in waiting}

    def _preempt(self, victims: Sequence[preemption.Victim], cause: str) -> None:
        for victim in victims:
            job_id = victim.gang.key
            self._jobs.preempt(job_id, victim.message, victim.tasks)
            self.metrics.preemptions.labels(victim.gang.pool, cause).inc()
            self._admitted = deque(g for g in self._admitted if g.job_id != job_id)
            if victim.tasks:
                self._readmit_ready(job_id)
            log.info(
                "gang shrunk" if victim.tasks else "gang preempted",
                extra={
                    "job_id": job_id,
                    "pool": victim.gang.pool,
                    "tasks": victim.tasks or "all",
                    "reason": victim.message,
                },
            )
        self._refresh_dirty()

    def _readmit_ready(self, job_id: str) -> None:
        """A shrunk elastic gang keeps its admitted tasks that the shrink left READY: they go
        back to placement as one gang."""
        view = self._views.get(job_id)
        ready = self._jobs.instances(job_id, {TaskState.READY})
        if view is not None and ready:
            at = datetime.fromtimestamp(view.pending_since, UTC)
            self._admitted.append(
                Gang.of_job(job_id, view.job.spec, ready, at, admitted_at=view.admitted_at)
            )

    # ---------------------------------------------------------------- status

    def _current_statuses(self) -> dict[str, PoolStatus]:
        """Every pool's status as of the last cycle's entitlements (the lock is held)."""
        if not self._statuses and self._conserved is not None:
            self._statuses = self._build_statuses(self._conserved)
        return self._statuses

    def _build_statuses(self, conserved: Conserved) -> dict[str, PoolStatus]:
        alloc_leaf = self._book.usage().allocation
        queued = self._book.queued_gangs
        out: dict[str, PoolStatus] = {}
        guaranteed = self._calculator.guarantees(self._capacity or ZERO)
        for path in reversed([p for p, _ in self._tree.walk(ROOT)]):
            kids = self._tree.children(path)
            alloc = alloc_leaf.get(path, ZERO)
            for child in kids:
                alloc = alloc + _alloc_of(out[child])
            out[path] = self._status(path, alloc, queued.get(path, 0), conserved, guaranteed)
        return out

    def _status(
        self,
        path: str,
        alloc: Resources,
        queued: int,
        conserved: Conserved,
        guaranteed: Mapping[str, Resources],
    ) -> PoolStatus:
        kinds = {}
        for k in KINDS:
            if path == ROOT:
                cap = (self._capacity or ZERO).get(k)
                res, limit, share, static = cap, cap, 1.0, False
            else:
                kc = self._tree.get(path).kind(k)
                res, share, static = kc.reservation, kc.share, kc.policy is Policy.STATIC
                limit = self._tree.limit(path, k)
            a = alloc.get(k)
            # Borrowing and lending are measured against what the reservation guarantees on
            # this cluster: reservations may promise more than the cluster has.
            g = guaranteed.get(path, ZERO).get(k)
            kinds[k] = KindStatus(
                reservation=res,
                limit=limit,
                share=share,
                entitlement=conserved.usable.entitlement.get(path, ZERO).get(k),
                allocation=a,
                demand=conserved.fair.demand.get(path, ZERO).get(k),
                borrowed=0.0 if path == ROOT else max(0.0, a - g),
                lent=0.0 if path == ROOT or static else max(0.0, g - a),
            )
        return PoolStatus(
            path=path,
            kinds=kinds,
            queued_gangs=queued,
            oversized_gangs=len(conserved.left_out.get(path, ())),
        )


def _alloc_of(status: PoolStatus) -> Resources:
    return Resources.of({k: s.allocation for k, s in status.kinds.items()})


def _now() -> datetime:
    return datetime.now(UTC)
