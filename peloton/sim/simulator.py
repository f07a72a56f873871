"""The discrete-event loop: a trace replayed through the production resource manager and
placement engine on a virtual clock.

One run (:func:`simulate`) builds a fresh :class:`~peloton.sim.ledger.SimLedger`, pool store and
:class:`~peloton.resmgr.manager.ResourceManager` (given the virtual clock and, for the
placement-aware pools, :class:`peloton.placement.check.HostsCheck` on the simulated hosts; its
thread is never started: the loop calls :meth:`~peloton.resmgr.manager.ResourceManager.run_cycle`
itself) and a fresh copy of the cluster. Every pool's queue policy is set to the run's policy. A
heap holds the events: job arrivals, gang completions, jobs reaching their max_runtime_seconds,
and cycle ticks. For each instant that has events:

1. the metrics are integrated over the time since the previous instant;
2. every event of the instant is applied: a completion moves the gang's tasks RUNNING ->
   SUCCEEDED and gives its hosts' resources back; an arrival creates the job (every task
   PENDING) and tells the resource manager; a job past its max_runtime_seconds (counted from its
   first start, restarts included) is killed, as the job manager does;
3. one resource-manager cycle (entitlements, admission, pending reasons, preemption). Victims of
   preemption are stopped at once (PREEMPTING -> KILLED, a new attempt PENDING);
4. one placement round: every admitted gang (:meth:`~peloton.resmgr.manager.ResourceManager.
   take_admitted`) is placed by :func:`peloton.placement.engine.place_on` on one
   :class:`~peloton.placement.engine.Snapshot` of the hosts' free resources, highest priority
   first; a placed gang's tasks start at once (READY -> PLACING -> PLACED -> LAUNCHING ->
   RUNNING) and its completion is scheduled ``duration_s`` later; a gang that does not fit now
   goes back (:meth:`~peloton.resmgr.manager.ResourceManager.return_admitted`) with the
   engine's reason, one that never fits (:func:`~peloton.placement.engine.never_fits` on the
   empty cluster) fails as ``unplaceable``, as the launcher does. A placement takes a host's
   free resources, not the whole host: the launcher's next rounds (a second apart) would use
   what is left the same way. A round is skipped when nothing it depends on changed (no gang
   newly admitted, no host freed): it would fail the same gangs the same way;
5. if the cycle preempted gangs or the round failed some, steps 3-4 run again at the same
   instant (in the daemon, those changes wake the next cycle at once), at most
   :data:`MAX_CYCLES_PER_INSTANT` times.

An instant whose only events are stale (completions of runs that were preempted) runs no cycle.
The daemon also cycles every ``cycle_seconds`` when nothing changes; two rules depend on it, and
for them the loop adds *ticks* (one more cycle and round, nothing else) ``cycle_seconds`` later:
preemption's hysteresis (a gang preempts only after waiting a whole cycle: a tick follows a
cycle that newly told a gang it waits for capacity or entitlement that preemption could free,
given who runs), and progress when nothing else is left to happen while jobs wait (a tick
follows an instant that changed something when the heap is empty).

**Preemption loses the work**: a preempted gang restarts from scratch when placed again (no
checkpoints), and the GPU-seconds it had run are counted as lost.

**The baseline** ``baseline-backfill`` (:data:`~peloton.sim.policy.BASELINE_BACKFILL`) is not
peloton's scheduler: a simulator-only reference that bypasses the resource manager. At every
instant it walks the waiting jobs in order (priority, then arrival) and starts every gang the
placement engine can place now, skipping those it cannot: plain backfill, with no reservation
for blocked gangs, no pools, entitlements or limits, and no preemption. Small gangs thus
overtake big ones for ever: it starves large gangs by design, which is what the comparison
shows. It still uses the same ledger (state tables) and the same placement engine.

Nothing here sleeps, reads a wall clock or touches a database: a run is deterministic for a
trace, cluster, pools and policy.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from peloton.core.gang import Gang
from peloton.core.pools import DEFAULT_POOL, ROOT, PoolConfig, QueuePolicy, parent_of
from peloton.core.records import JobRecord
from peloton.core.resources import EPSILON
from peloton.core.states import JobState, TaskState
from peloton.placement import engine
from peloton.placement.check import HostsCheck
from peloton.resmgr import admission
from peloton.resmgr.manager import ResourceManager
from peloton.resmgr.pool import PoolTree
from peloton.sim.cluster import Cluster, Share
from peloton.sim.ledger import SimLedger, SimPoolStore
from peloton.sim.policy import BASELINE_BACKFILL, parse_policy
from peloton.sim.trace import TraceJob, job_spec
from peloton.v1 import job_pb2

# The virtual clock's zero: a trace's second 0 (records carry real-looking dates).
EPOCH = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
# Cycles at one instant at most (each one after a preemption stopped victims).
MAX_CYCLES_PER_INSTANT = 4
# How often, in simulated seconds, the pools' shares are read for the report.
POOL_SAMPLE_SECONDS = 60.0
# Pending reasons that preemption may end: the gang waits for capacity other pools borrow,
# or for its own pool's entitlement that lower-priority gangs hold.
_PREEMPTABLE_WAITS = frozenset({admission.PENDING_CLUSTER, admission.PENDING_ENTITLEMENT})
# Event kinds, in the order they are applied at one instant: completions first (they free
# hosts), then arrivals, ticks, and jobs reaching their max_runtime_seconds.
_FINISH, _ARRIVAL, _TICK, _DEADLINE = 0, 1, 2, 3
MAX_RUNTIME = "max_runtime_exceeded"


class SimulationError(ValueError):
    """The run cannot start: the trace and the pools or the cluster disagree."""


@dataclass
class JobOutcome:
    """What happened to one job."""

    job: TraceJob
    first_start: float | None = None
    completed: float | None = None
    failed: str = ""  # why, if it failed
    preemptions: int = 0

    @property
    def jct(self) -> float | None:
        return None if self.completed is None else self.completed - self.job.arrival_s

    @property
    def wait(self) -> float | None:
        return None if self.first_start is None else self.first_start - self.job.arrival_s


@dataclass
class Sample:
    """The cluster at one instant (after its scheduling)."""

    t: float
    busy_gpus: float
    waiting: int
    running: int


@dataclass
class PoolShare:
    """One pool's GPUs over the run, time-averaged: what it held and what it was entitled to
    (None for the baseline, which has no entitlements)."""

    pool: str
    allocation: float
    entitlement: float | None
    reservation: float


@dataclass
class RunResult:
    """Everything one run measured (:mod:`peloton.sim.report` turns it into figures)."""

    policy: str
    cluster: str
    total_gpus: float
    outcomes: list[JobOutcome]
    start: float
    end: float
    busy_gpu_seconds: float
    fragmentation_seconds: float  # sum of fragmentation x dt while GPU work waited
    waiting_seconds: float  # time during which GPU work waited
    preemptions: int
    lost_gpu_seconds: float
    placement_delays: list[float]
    pools: list[PoolShare]
    samples: list[Sample]
    cycles: int
    instants: int
    wall_seconds: float = 0.0


@dataclass(eq=False)
class _Running:
    """A job's simulated life."""

    outcome: JobOutcome
    spec: job_pb2.JobSpec
    gen: int = 0  # bumped on every start and stop: completions of older runs are stale
    shares: list[Share] = field(default_factory=list)
    started_at: float = 0.0
    running: bool = False
    waiting: bool = False
    seq: int = 0


class Simulation:
    """One run of ``jobs`` on ``cluster`` (copied) under ``policy``, pools from ``pools``
    (default: the single pool /default) with every pool's queue policy set to ``policy``."""

    def __init__(
        self,
        jobs: Sequence[TraceJob],
        cluster: Cluster,
        pools: Sequence[PoolConfig] = (),
        policy: str = QueuePolicy.PRIORITY_FIFO.value,
        *,
        cycle_seconds: float = 1.0,
    ) -> None:
        self.policy = parse_policy(policy)
        self.cluster = cluster.copy()
        self.cycle_seconds = cycle_seconds
        configs = list(pools) or [PoolConfig(DEFAULT_POOL, owner="peloton")]
        if self.policy != BASELINE_BACKFILL:
            configs = [
                dataclasses.replace(c, queue_policy=QueuePolicy(self.policy)) for c in configs
            ]
        self.tree = build_tree(configs)
        self._jobs = [self._prepare(i, j) for i, j in enumerate(jobs)]
        self.now = 0.0
        self.ledger = SimLedger(self._clock)
        self.rm: ResourceManager | None = None
        if self.policy != BASELINE_BACKFILL:
            self.rm = ResourceManager(
                SimPoolStore(self.ledger, configs),
                self.ledger,
                clock=self._clock,
                cycle_seconds=cycle_seconds,
                # What the placement-aware pools (BACKFILL, LAS) ask: the hosts as they are.
                placement=HostsCheck(self.cluster),
            )
            self.ledger.set_scheduler(self._job_changed)
            self.ledger.set_admission_listener(self._on_admitted)
            self.ledger.set_killer(self._on_kill)
            self.ledger.set_reason_listener(self._note_reasons)
        self.ledger.set_end_listener(self._on_ended)
        self._by_id = {r.outcome.job.job_id: r for r in self._jobs}
        self._events: list[tuple[float, int, int, str, int]] = []
        self._event_seq = 0
        self._kills: list[tuple[str, tuple[int, ...]]] = []
        self._changed = False  # a job changed since the last cycle
        self._ticked = False
        self._may_preempt = False
        self._admitted_new = False
        self._placed_version = -1
        # Preemptible gangs running, by pool and priority (who preemption could take).
        self._preemptible: dict[str, dict[int, int]] = {}
        self._running_gpus: dict[str, float] = {}  # by leaf pool
        self._tick_at = -math.inf
        self._idle_mark = -1
        self._never: dict[str, str | None] = {}
        self._queue: list[tuple[int, float, int, str]] = []  # the baseline's, in order
        self._waiting_per_task: dict[float, int] = {}  # waiting jobs by per-task GPUs
        self._waiting = 0
        self._running = 0
        self._pool_now: dict[str, tuple[float, float | None]] = {}
        self._pools_read_at = -math.inf
        self._entitled: dict[str, float] = {}
        self._pool_sums: dict[str, list[float]] = {}
        self._frag_cache: tuple[int, float, float] | None = None
        self._cluster_version = 0
        self.busy_gpu_seconds = 0.0
        self.frag_seconds = 0.0
        self.waiting_seconds = 0.0
        self.preemptions = 0
        self.lost_gpu_seconds = 0.0
        self.placement_delays: list[float] = []
        self.samples: list[Sample] = []
        self.cycles = 0
        self.instants = 0
        self._started = False

    # ---------------------------------------------------------------- set-up

    def _prepare(self, i: int, job: TraceJob) -> _Running:
        spec = job.spec if job.spec is not None else job_spec(job)
        if not self.tree.is_leaf(spec.pool):
            why = "does not exist" if spec.pool not in self.tree else "is not a leaf pool"
            raise SimulationError(
                f"job {job.job_id}: pool {spec.pool} {why} "
                f"(pools: {', '.join(self.tree.leaves()) or 'none'})"
            )
        return _Running(JobOutcome(job), spec, seq=i)

    def _clock(self) -> float:
        return EPOCH + self.now

    def _job_changed(self, job_id: str) -> None:
        assert self.rm is not None
        self._changed = True
        self.rm.job_changed(job_id)

    def _on_ended(self, job: JobRecord) -> None:
        """A job ended: it failed (the resource manager found its gang infeasible, or it was
        unplaceable) unless it succeeded (:meth:`_finish` records that)."""
        if job.state != JobState.SUCCEEDED:
            r = self._by_id[job.id]
            r.outcome.failed = r.outcome.failed or f"{job.reason}: {job.message}"
            self._set_waiting(r, False)

    def _on_admitted(self) -> None:
        self._admitted_new = True

    # ---------------------------------------------------------------- the loop

    def run(self) -> RunResult:
        if self._started:
            raise RuntimeError("a Simulation runs once")
        self._started = True
        if self.rm is not None:
            self.rm.set_capacity(self.cluster.total)
            self.rm.load()
        for r in self._jobs:
            self._push(r.outcome.job.arrival_s, _ARRIVAL, r.outcome.job.job_id)
        start = min((r.outcome.job.arrival_s for r in self._jobs), default=0.0)
        self.now = start
        while self._events:
            t = self._events[0][0]
            self._advance(t)
            while self._events and self._events[0][0] <= t:
                _, kind, _, job_id, gen = heapq.heappop(self._events)
                if kind == _ARRIVAL:
                    self._arrive(self._by_id[job_id])
                elif kind == _FINISH:
                    self._finish(self._by_id[job_id], gen)
                elif kind == _DEADLINE:
                    self._expire(self._by_id[job_id])
                else:
                    self._ticked = True
            self._schedule()
            self.instants += 1
            if (
                not self._events
                and self.ledger.has_unfinished()
                and self._idle_mark != (mark := self.ledger.changes)
            ):
                # Nothing left to happen but jobs wait, and the last instant changed something:
                # the daemon's next cycle (every cycle_seconds) looks again.
                self._idle_mark = mark
                self._push(self.now + self.cycle_seconds, _TICK)
            self.samples.append(Sample(t, self.cluster.busy_gpus, self._waiting, self._running))
        end = max((r.outcome.completed or start for r in self._jobs), default=start)
        return self._result(start, end)

    def _push(self, t: float, kind: int, job_id: str = "", gen: int = 0) -> None:
        self._event_seq += 1
        heapq.heappush(self._events, (t, kind, self._event_seq, job_id, gen))

    def _advance(self, t: float) -> None:
        """Integrate what held between the previous instant and ``t``."""
        dt = t - self.now
        if dt > 0:
            self.busy_gpu_seconds += self.cluster.busy_gpus * dt
            if self._waiting_gpu_jobs():
                self.waiting_seconds += dt
                self.frag_seconds += self._fragmentation() * dt
            for pool, (alloc, ent) in self._pool_now.items():
                sums = self._pool_sums.setdefault(pool, [0.0, 0.0])
                sums[0] += alloc * dt
                sums[1] += (ent or 0.0) * dt
        self.now = t

    # ---------------------------------------------------------------- events

    def _arrive(self, r: _Running) -> None:
        job = r.outcome.job
        self.ledger.create_job(job.job_id, r.spec)
        self._set_waiting(r, True)
        if self.rm is None:
            never = self._never_fits(job.job_id, self._gang(r))
            if never is not None:
                self._fail_unplaceable(r, never)
                return
            bisect.insort(self._queue, (-job.priority, job.arrival_s, r.seq, job.job_id))

    def _finish(self, r: _Running, gen: int) -> None:
        if gen != r.gen or not r.running:
            return  # a run that was preempted: its completion is stale
        job_id = r.outcome.job.job_id
        running = self.ledger.instances(job_id, (TaskState.RUNNING,))
        self.ledger.finish(job_id, running)
        self._release(r)
        r.outcome.completed = self.now

    def _expire(self, r: _Running) -> None:
        """The job ran longer than its max_runtime_seconds (counted from its first start,
        restarts included): killed, as the job manager does."""
        if r.outcome.completed is not None or r.outcome.failed:
            return
        if r.running:
            self._release(r)
        limit = r.spec.max_runtime_seconds
        self.ledger.kill(
            r.outcome.job.job_id, MAX_RUNTIME, f"ran longer than max_runtime_seconds ({limit} s)"
        )

    # ---------------------------------------------------------------- scheduling

    def _schedule(self) -> None:
        if self.rm is None:
            self._backfill()
            self._pool_now = {path: (gpus, None) for path, gpus in self._held_by_pool().items()}
            return
        if not (self._changed or self._ticked):
            return  # only stale completions: nothing a cycle or a round would see differently
        for _ in range(MAX_CYCLES_PER_INSTANT):
            self._changed = self._ticked = self._may_preempt = False
            preempted = self.ledger.preemptions
            self.rm.run_cycle()
            self.cycles += 1
            preempted = self.ledger.preemptions - preempted
            self._stop_victims()
            # Placement again only if something it depends on changed: gangs newly admitted,
            # or hosts that freed resources; otherwise every gang would fail as before.
            failed = 0
            if self._admitted_new or self._placed_version != self._cluster_version:
                self._admitted_new = False
                failed = self._place_admitted()
                self._placed_version = self._cluster_version
            if not preempted and not failed:
                break
            # Gangs preempted (and their tasks stopped) or failed free capacity: the daemon's
            # next cycle follows at once.
        if self.now >= self._pools_read_at + POOL_SAMPLE_SECONDS:
            # Entitlements are sampled (reading them builds every pool's status, work that grows
            # with the pools); what each pool holds is counted at every instant.
            self._pools_read_at = self.now
            self._entitled = {
                path: s.kinds["gpu"].entitlement
                for path, s in self.rm.statuses().items()
                if path != ROOT
            }
        held = self._held_by_pool()
        self._pool_now = {path: (held.get(path, 0.0), ent) for path, ent in self._entitled.items()}
        if self._may_preempt and self._tick_at <= self.now:
            # A gang newly waits for what preemption may free: the daemon's next cycle, a
            # cycle later, lets it preempt (a gang must have waited a whole cycle).
            self._tick_at = self.now + self.cycle_seconds
            self._push(self._tick_at, _TICK)

    def _place_admitted(self) -> int:
        """One placement round; returns how many gangs failed as unplaceable."""
        assert self.rm is not None
        gangs = self.rm.take_admitted(1 << 30)
        if not gangs:
            return 0
        failed = 0
        snapshot = engine.Snapshot(self.cluster.snapshot())
        for gang in gangs:
            r = self._by_id[gang.job_id]
            placement = engine.place_on(gang, snapshot)
            if placement.hosts is None:
                never = self._never_fits(gang.job_id, gang)
                if never is not None:
                    self._fail_unplaceable(r, never)
                    failed += 1
                else:
                    self.rm.return_admitted([(gang, placement.reason)])
                continue
            if gang.admitted_at:
                self.placement_delays.append(max(0.0, self._clock() - gang.admitted_at))
            self._start(r, gang, placement.hosts)
        return failed

    def _backfill(self) -> None:
        """The baseline: start, in queue order, every waiting gang that fits now."""
        if not self._queue:
            return
        free_gpus = self.cluster.total_gpus - self.cluster.busy_gpus
        snapshot: engine.Snapshot | None = None
        no_room: set[tuple[object, ...]] = set()
        started: list[int] = []
        for i, (_, _, _, job_id) in enumerate(self._queue):
            r = self._by_id[job_id]
            job = r.outcome.job
            if not r.waiting:
                started.append(i)  # it ended meanwhile (max_runtime_seconds)
                continue
            if job.gpus > free_gpus + EPSILON:
                continue
            shape = (
                job.tasks,
                job.gpu_per_task,
                job.cpu_per_task,
                job.mem_mb_per_task,
                job.gpu_model,
            )
            if shape in no_room:
                continue  # a gang of the same shape did not fit, and hosts only filled since
            gang = self._gang(r)
            if snapshot is None:
                snapshot = engine.Snapshot(self.cluster.snapshot())
            placement = engine.place_on(gang, snapshot)
            if placement.hosts is None:
                no_room.add(shape)
                continue
            self.ledger.admit_pending(
                [(job_id, gang.size, "admitted by the simulator's backfill baseline")]
            )
            self._start(r, gang, placement.hosts)
            free_gpus -= job.gpus
            started.append(i)
        for i in reversed(started):
            del self._queue[i]

    def _gang(self, r: _Running) -> Gang:
        job_id = r.outcome.job.job_id
        ids = self.ledger.instances(job_id, (TaskState.PENDING, TaskState.READY))
        at = datetime.fromtimestamp(EPOCH + r.outcome.job.arrival_s, UTC)
        return Gang.of_job(job_id, r.spec, ids, at, admitted_at=self._clock())

    def _never_fits(self, job_id: str, gang: Gang) -> str | None:
        if job_id not in self._never:
            self._never[job_id] = engine.never_fits(gang, self.cluster.totals())
        return self._never[job_id]

    def _fail_unplaceable(self, r: _Running, why: str) -> None:
        self.ledger.fail_unplaceable(
            r.outcome.job.job_id, f"no set of the cluster's hosts fits: {why}"
        )

    def _start(self, r: _Running, gang: Gang, hosts: Sequence[str]) -> None:
        shares = self.cluster.take(gang.job_id, hosts, gang.per_task, gang.ports_per_task)
        self._cluster_version += 1
        self.ledger.launch(gang.job_id, gang.instances, hosts)
        r.shares = shares
        r.gen += 1
        r.running = True
        r.started_at = self.now
        self._running += 1
        self._count_preemptible(r, 1)
        self._set_waiting(r, False)
        if r.outcome.first_start is None:
            r.outcome.first_start = self.now
            if r.spec.max_runtime_seconds:
                self._push(self.now + r.spec.max_runtime_seconds, _DEADLINE, gang.job_id)
        self._push(self.now + r.outcome.job.duration_s, _FINISH, gang.job_id, r.gen)

    def _release(self, r: _Running) -> None:
        self.cluster.release(r.outcome.job.job_id)
        self._cluster_version += 1
        r.shares = []
        r.gen += 1
        r.running = False
        self._running -= 1
        self._count_preemptible(r, -1)

    # ---------------------------------------------------------------- preemption

    def _on_kill(self, job_id: str, instances: tuple[int, ...]) -> None:
        """The ledger's killer: stop these after the cycle (the kill is instant)."""
        self._kills.append((job_id, instances))

    def _stop_victims(self) -> int:
        """Stop what the cycle preempted; returns how many gangs."""
        kills, self._kills = self._kills, []
        for job_id, instances in kills:
            r = self._by_id[job_id]
            if not r.running:
                continue
            held = sum(s.amount.gpu for s in r.shares)
            self.lost_gpu_seconds += held * (self.now - r.started_at)
            self.ledger.stop_preempted(job_id, instances)
            self._release(r)
            r.outcome.preemptions += 1
            self.preemptions += 1
            self._set_waiting(r, True)
        return len(kills)

    def _note_reasons(self, reasons: Mapping[str, tuple[str, str]]) -> None:
        """Pending reasons the resource manager wrote (the ledger's hook): note whether a gang
        now waits for something preemption could free, by the rules of
        :mod:`peloton.resmgr.preemption` (victims are preemptible gangs running: of lower
        priority in the gang's own pool, or in another pool for capacity it reclaims)."""
        if self._may_preempt:
            return
        for job_id, (reason, _) in reasons.items():
            if reason not in _PREEMPTABLE_WAITS:
                continue
            spec = self._by_id[job_id].spec
            if reason == admission.PENDING_ENTITLEMENT:
                lower = self._preemptible.get(spec.pool, {})
                if any(p < spec.priority and n > 0 for p, n in lower.items()):
                    self._may_preempt = True
                    return
            elif any(
                pool != spec.pool and any(n > 0 for n in by_priority.values())
                for pool, by_priority in self._preemptible.items()
            ):
                self._may_preempt = True
                return

    # ---------------------------------------------------------------- metrics

    def _held_by_pool(self) -> dict[str, float]:
        """GPUs that running gangs hold, by pool, parents counting their children's."""
        out = {path: 0.0 for path in self.tree.paths()}
        for pool, gpus in self._running_gpus.items():
            path = pool
            while path != ROOT:
                out[path] = out.get(path, 0.0) + gpus
                path = parent_of(path)
        return out

    def _count_preemptible(self, r: _Running, delta: int) -> None:
        gpus = self._running_gpus
        gpus[r.spec.pool] = gpus.get(r.spec.pool, 0.0) + delta * r.outcome.job.gpus
        if r.spec.preemption.preemptible:
            by_priority = self._preemptible.setdefault(r.spec.pool, {})
            by_priority[r.spec.priority] = by_priority.get(r.spec.priority, 0) + delta

    def _set_waiting(self, r: _Running, waiting: bool) -> None:
        if r.waiting == waiting:
            return
        r.waiting = waiting
        per = float(r.outcome.job.gpu_per_task)
        self._waiting += 1 if waiting else -1
        self._waiting_per_task[per] = self._waiting_per_task.get(per, 0) + (1 if waiting else -1)

    def _waiting_gpu_jobs(self) -> bool:
        return any(n > 0 and per > 0 for per, n in self._waiting_per_task.items())

    def _fragmentation(self) -> float:
        largest = max((per for per, n in self._waiting_per_task.items() if n > 0), default=0.0)
        cached = self._frag_cache
        if cached is not None and cached[:2] == (self._cluster_version, largest):
            return cached[2]
        value = engine.gpu_fragmentation(self.cluster.snapshot(), int(largest))
        self._frag_cache = (self._cluster_version, largest, value)
        return value

    def _result(self, start: float, end: float) -> RunResult:
        span = max(end - start, EPSILON)
        shares = []
        for path in self.tree.paths():
            sums = self._pool_sums.get(path, [0.0, 0.0])
            reservation = self.tree.get(path).kind("gpu").reservation
            entitled = None if self.rm is None else sums[1] / span
            shares.append(PoolShare(path, sums[0] / span, entitled, reservation))
        return RunResult(
            policy=self.policy,
            cluster=self.cluster.describe(),
            total_gpus=self.cluster.total_gpus,
            outcomes=[r.outcome for r in self._jobs],
            start=start,
            end=end,
            busy_gpu_seconds=self.busy_gpu_seconds,
            fragmentation_seconds=self.frag_seconds,
            waiting_seconds=self.waiting_seconds,
            preemptions=self.preemptions,
            lost_gpu_seconds=self.lost_gpu_seconds,
            placement_delays=self.placement_delays,
            pools=shares,
            samples=self.samples,
            cycles=self.cycles,
            instants=self.instants,
        )


def build_tree(configs: Iterable[PoolConfig]) -> PoolTree:
    """The pool tree of ``configs`` (parents first), checked by the resource manager's rules
    (InvalidArgument naming the pool and field)."""
    tree = PoolTree()
    for config in sorted(configs, key=lambda c: (c.path.count("/"), c.path)):
        tree = tree.with_created(config, {})
    return tree


def simulate(
    jobs: Sequence[TraceJob],
    cluster: Cluster,
    pools: Sequence[PoolConfig] = (),
    policy: str = QueuePolicy.PRIORITY_FIFO.value,
    *,
    clock: Callable[[], float] | None = None,
) -> RunResult:
    """Run ``jobs`` on ``cluster`` under ``policy``; ``clock``: a wall clock to time the run
    with (``time.perf_counter``), or None."""
    began = clock() if clock is not None else 0.0
    sim = Simulation(jobs, cluster, pools, policy)
    result = sim.run()
    if clock is not None:
        result.wall_seconds = clock() - began
    return result
