"""The launcher: admitted gangs -> placement -> leases -> one task group per host.

A loop on its own thread, woken when offers arrive or the resource manager admits gangs (and
once a second regardless). For each gang it takes: place every task (the placement engine, on
one snapshot of the offer pool per round), lease every host it uses or none, record READY ->
PLACING -> PLACED -> LAUNCHING (one transaction), and launch. Gangs are recorded and launched
in chunks of up to CHUNK, on launch workers while the loop places the next gangs (at most
IN_FLIGHT_PER_WORKER chunks per worker placed and not launched yet). The gangs of a chunk may
share hosts: a host leased for one keeps what it has left in the snapshot for the next gangs of
the chunk, and its offers are accepted once, with a task group per gang (what an ACCEPT leaves
of a host is offered again only at the master's next allocation, so a host would otherwise take
one gang a second). Anything that fails before the launch releases the leases no launching gang
uses and hands the gang back to the resource manager with the reason, which becomes the job's
pending reason.

Every task starts knowing its gang (task discovery): ``PELOTON_RANK``, ``PELOTON_GANG_SIZE``,
``PELOTON_LOCAL_RANK``/``SIZE`` (among the gang's tasks on its host), ``PELOTON_CROSS_RANK``/
``SIZE`` (among the hosts holding a task of its local rank), ``PELOTON_PEERS`` (``address:port``
of every rank, in rank order: each task's first port, taken from the offers) and
``PELOTON_PORT_<NAME>`` for its named ports, and ``PELOTON_GANG_SECRET``, new for every launch
of a gang, which its ranks prove to one another when they connect. The collective runtime boots
from exactly these (the contract: :mod:`peloton.core.gangenv`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from peloton.core.containers import container_launch
from peloton.core.gang import AdmittedGangs, Gang
from peloton.core.gangenv import GANG_SECRET, GangEnv, new_secret, topology
from peloton.core.ledger import LaunchLedger
from peloton.core.offers import HostOffers, LaunchTask, Lease, LeaseError, executor_id, take_ports
from peloton.core.records import Placement, TaskUpdate, attempt_id
from peloton.core.resources import ZERO, Resources
from peloton.core.spec import is_elastic
from peloton.core.states import TaskState
from peloton.errors import PelotonError
from peloton.placement import engine
from peloton.placement.metrics import HOST_TAKEN, INFEASIBLE, LAUNCH, NO_FIT, PlacementMetrics
from peloton.v1 import job_pb2

log = logging.getLogger(__name__)

# Gangs taken from the resource manager per round.
BATCH = 64
# Placed gangs a launch worker records in one transaction, then launches, at most: a record's
# statements (locks, reads, writes, the commit) were most of a gang's cost on the database and
# in the interpreter waiting for it. Gangs of a chunk share hosts and are launched together.
CHUNK = 4
# Chunks placed and waiting for or in a launch worker, per worker, at most: the loop places the
# next gangs while earlier ones are recorded and launched (waits on the database and the
# master) without leasing hosts far ahead of the launches.
IN_FLIGHT_PER_WORKER = 2


class Hosts(Protocol):
    """What the launcher needs of the host manager."""

    def snapshot(self) -> list[HostOffers]: ...

    def totals(self) -> list[HostOffers]:
        """Every host that takes work, with its total resources (as if nothing ran on it)."""
        ...

    def lease(self, agent_id: str) -> Lease | None: ...

    def release(self, lease: Lease) -> None: ...

    def launch(self, shares: Sequence[tuple[Lease, Sequence[LaunchTask]]]) -> None: ...

    def set_demand(self, demand: bool) -> None: ...


class Rendezvous(Protocol):
    """Where the tasks of elastic gangs learn their membership (the daemon's endpoints)."""

    def task_env(self, job_id: str, spec: job_pb2.JobSpec) -> Mapping[str, str]:
        """The variables pointing a task of ``job_id`` at its gang's rendezvous endpoint."""
        ...


class _NotPlaced(Exception):
    """The gang goes back to the resource manager with this reason (``kind``: the metric
    label)."""

    def __init__(self, why: str, kind: str = LAUNCH) -> None:
        super().__init__(why)
        self.kind = kind


class Launcher:
    """Places and launches admitted gangs until ``stop()``."""

    def __init__(
        self,
        source: AdmittedGangs,
        hosts: Hosts,
        jobs: LaunchLedger,
        interval: float = 1.0,
        *,
        metrics: PlacementMetrics | None = None,
        workers: int = 1,
        rendezvous: Rendezvous | None = None,
        leads: Callable[[], bool] | None = None,
    ) -> None:
        """``workers``: gangs recorded and launched at once (more than one only where the
        database takes concurrent writers). ``rendezvous``: the endpoints elastic gangs' tasks
        are pointed at. ``leads``: whether this daemon still leads (several daemons), asked
        right before each launch; None: the only daemon."""
        self._source = source
        self._leads = leads
        self._rendezvous = rendezvous
        self._hosts = hosts
        self._jobs = jobs
        self._interval = interval
        self.metrics = metrics or PlacementMetrics()
        self._workers = ThreadPoolExecutor(workers, thread_name_prefix="launch")
        # One per gang placed and not launched yet.
        self._slots = threading.BoundedSemaphore(workers * IN_FLIGHT_PER_WORKER * CHUNK)
        # Gangs found to fit the cluster's hosts when empty; forgotten when the hosts change
        # (their count or total), so a gang is judged once per cluster shape, on the hosts
        # grouped once per shape.
        self._feasible: set[str] = set()
        self._cluster: tuple[int, Resources] = (0, ZERO)
        self._empty = engine.EmptyCluster([])
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="launcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._workers.shutdown()

    def wake(self) -> None:
        """Something changed (offers arrived, gangs admitted): run a round now."""
        self._wake.set()

    def _loop(self) -> None:
        busy = False
        while not self._stopped.is_set():
            if not busy:
                self._wake.wait(self._interval)
            self._wake.clear()
            try:
                # A round that placed gangs may have left more behind (BATCH per round): run the
                # next one at once rather than after the interval, while those launch.
                busy = len(self._round()) > 0
            except Exception:
                busy = False
                log.exception("launcher round failed")

    def run_once(self) -> int:
        """One round: every admitted gang is tried once. Returns how many were launched, once
        they all were (or failed)."""
        return sum(done.result() for done in self._round())

    def _round(self) -> list[Future[int]]:
        """Place every admitted gang (up to BATCH) and hand the placed ones to launch workers,
        up to CHUNK gangs each; returns their launches, each the number of gangs it launched.
        A gang not placed, or whose launch failed, is handed back to the resource manager with
        the reason."""
        gangs = self._source.take_admitted(BATCH)
        # Demand exists while gangs wait, placeable or not (then more offers may help).
        self._hosts.set_demand(bool(gangs))
        if not gangs:
            return []
        started = time.perf_counter()
        try:
            # The attempts the gangs launch, read once for the round; the record checks them.
            ready = self._jobs.ready_attempts(dict.fromkeys(g.job_id for g in gangs))
        except PelotonError as exc:
            self._source.return_admitted([(gang, str(exc)) for gang in gangs])
            return []
        # One snapshot per round (taking one costs a pass over every host); hosts this round
        # leased are left out of it for the next gangs, and a later round's snapshot leaves out
        # the hosts still leased to launches under way.
        offered = self._hosts.snapshot()
        largest = max(int(g.per_task.gpu) for g in gangs)
        self.metrics.gpu_fragmentation.set(engine.gpu_fragmentation(offered, largest))
        snapshot = engine.Snapshot(offered)
        totals: list[bool] = []  # the cluster's hosts read this round (and any known)
        launches: list[Future[int]] = []
        chunk = _Chunk(snapshot)
        returned: list[tuple[Gang, str]] = []  # handed back together at the end of the round
        for gang in gangs:
            if any(p.gang.job_id == gang.job_id for p in chunk.placed):
                self._submit(chunk, launches)  # a record takes one gang per job
            # A slot per gang, released when its launch ends (or here if it is not placed).
            # Gangs placed already go to a worker before waiting for one.
            if not self._slots.acquire(blocking=False):
                self._submit(chunk, launches)
                self._slots.acquire()
            try:
                hosts, leases = self._place(gang, snapshot, chunk.leases)
            except _NotPlaced as exc:
                self._slots.release()
                self._not_placed(gang, exc, totals, returned)
                continue
            chunk.placed.append(_Placed(gang, hosts, leases, ready.get(gang.job_id, {})))
            if len(chunk.placed) == CHUNK:
                self._submit(chunk, launches)
        self._submit(chunk, launches)
        self._source.return_admitted(returned)
        self.metrics.rounds.inc()
        self.metrics.round_seconds.observe(time.perf_counter() - started)
        return launches

    def _submit(self, chunk: _Chunk, launches: list[Future[int]]) -> None:
        """Hand the chunk's gangs to a launch worker (the chunk is emptied). Their hosts leave
        the snapshot: the next gangs are placed while these are recorded and launched."""
        if chunk.placed:
            chunk.snapshot.drop(set(chunk.leases))
            launches.append(self._workers.submit(self._launch_chunk, list(chunk.placed)))
            chunk.placed.clear()
            chunk.leases.clear()

    def _launch_chunk(self, chunk: Sequence[_Placed]) -> int:
        """Record placed gangs in one write and launch them together, on a worker; how many
        were launched."""
        launched = 0
        returned: list[tuple[Gang, str]] = []
        try:
            recorded = self._record(chunk, returned)
            used = _leases(p for p, _, _ in recorded)
            _release(self._hosts, [v for k, v in _leases(chunk).items() if k not in used])
            launched = self._launch(recorded, returned)
        except Exception:
            # A bug, not a refusal: where it stopped is unknown (gangs may be launched), so
            # nothing is undone or retried; a daemon start sends placements left behind back.
            log.exception("launch failed", extra={"job_ids": [p.gang.job_id for p in chunk]})
        finally:
            self._source.return_admitted(returned)
            for _ in chunk:
                self._slots.release()
            self.wake()  # slots are free: gangs left waiting for one may go on
        return launched

    def _not_placed(
        self,
        gang: Gang,
        exc: _NotPlaced,
        totals: list[bool],
        returned: list[tuple[Gang, str]],
    ) -> None:
        """Add ``gang`` with the reason to those to hand back (``returned``), or fail it if it
        can never fit (``totals``: not empty once the cluster's hosts were read this round)."""
        if exc.kind == NO_FIT:
            if not totals:
                totals.append(self._read_totals())
            never = self._never_fits(gang) if totals[0] else None
            if never:
                self.metrics.failures.labels(INFEASIBLE).inc()
                self._fail(gang, never)
                return
        self.metrics.failures.labels(exc.kind).inc()
        returned.append((gang, str(exc)))

    def _read_totals(self) -> bool:
        """Read the cluster's hosts with their totals (once per round, when a gang did not
        fit); whether there are any."""
        totals = self._hosts.totals()
        cluster = (len(totals), sum((h.free for h in totals), ZERO))
        if cluster != self._cluster:
            self._cluster = cluster
            self._feasible.clear()
            self._empty = engine.EmptyCluster(totals)
        return bool(totals)

    def _never_fits(self, gang: Gang) -> str | None:
        """Why ``gang`` fits no set of the cluster's hosts even when they are empty; None if it
        would (then it waits for room)."""
        if gang.job_id in self._feasible:
            return None
        why = self._empty.never_fits(gang)
        if why is None:
            self._feasible.add(gang.job_id)
        return why

    def _fail(self, gang: Gang, why: str) -> None:
        log.warning("gang can never be placed", extra={"job_id": gang.job_id, "why": why})
        try:
            self._jobs.fail_unplaceable(gang.job_id, f"no set of the cluster's hosts fits: {why}")
        except PelotonError:
            log.exception("could not fail an unplaceable gang")

    def _place(
        self, gang: Gang, snapshot: engine.Snapshot, held: dict[str, Lease]
    ) -> tuple[list[str], dict[str, Lease]]:
        """Place every task of a gang and lease the hosts not ``held`` already (by the gangs of
        its chunk; those leased are added): (each task's host, the leases of its hosts)."""
        placement = engine.place_on(gang, snapshot)
        if placement.hosts is None:
            raise _NotPlaced(placement.reason, NO_FIT)
        used = sorted(set(placement.hosts))
        held.update(self._lease_all([h for h in used if h not in held]))
        return list(placement.hosts), {h: held[h] for h in used}

    def _record(
        self, chunk: Sequence[_Placed], returned: list[tuple[Gang, str]]
    ) -> list[tuple[_Placed, Shares, dict[int, int]]]:
        """READY -> PLACING -> PLACED -> LAUNCHING for every task of the chunk's gangs, in one
        transaction, with where each is launched (an attempt that reached a host thus always
        names its sandbox); returns the gangs recorded, with their hosts' tasks and attempts.
        The others are handed back with the reason (their leases are the caller's to
        release)."""
        built: list[tuple[_Placed, Shares, dict[int, int]]] = []
        taken: dict[str, set[int]] = {}  # each host's ports handed to the chunk's gangs
        for placed in chunk:
            try:
                attempts = _attempts(placed.gang, placed.ready)
                shares = self._shares(placed, attempts, taken)
            except (PelotonError, _NotPlaced) as exc:
                self._undo(placed, {}, str(exc), returned)
                continue
            built.append((placed, shares, attempts))
        if not built:
            return []
        try:
            refused = self._jobs.record_launches(
                {
                    placed.gang.job_id: _places(placed, shares, attempts)
                    for placed, shares, attempts in built
                }
            )
        except PelotonError as exc:
            refused = {placed.gang.job_id: str(exc) for placed, _, _ in built}
        recorded = []
        for placed, shares, attempts in built:
            why = refused.get(placed.gang.job_id)
            if why is None:
                recorded.append((placed, shares, attempts))
            else:
                self._undo(placed, attempts, why, returned)
        return recorded

    def _launch(
        self,
        recorded: Sequence[tuple[_Placed, Shares, dict[int, int]]],
        returned: list[tuple[Gang, str]],
    ) -> int:
        """Launch recorded gangs together (a host's offers are accepted once, with every
        gang's task group on it); how many were launched. If they were not, they are handed
        back, their tasks READY again and their leases released."""
        if not recorded:
            return 0
        placed = [p for p, _, _ in recorded]
        if self._leads is not None and not self._leads():
            # Deposed since the (fenced) record: launch nothing, and write nothing either (the
            # fence would refuse it). The next leader finds these tasks LAUNCHING; Mesos never
            # saw them, so reconciliation ends them and they get new attempts. Asked right
            # before the launch: a leader paused since the record must not go on when it
            # resumes.
            _release(self._hosts, _leases(placed).values())
            for p in placed:
                self._undo(p, {}, "this daemon no longer leads: nothing launched", returned)
            return 0
        try:
            self._hosts.launch([share for _, shares, _ in recorded for share in shares])
        except (LeaseError, PelotonError) as exc:
            _release(self._hosts, _leases(placed).values())
            for p, _, attempts in recorded:
                self._undo(p, attempts, f"launch failed: {exc}", returned, str(exc))
            return 0
        for p in placed:
            self._launched(p)
        return len(placed)

    def _launched(self, placed: _Placed) -> None:
        gang = placed.gang
        if gang.admitted_at:
            self.metrics.gang_seconds.observe(max(0.0, time.time() - gang.admitted_at))
        log.info(
            "gang launched",
            extra={
                "job_id": gang.job_id,
                "tasks": gang.size,
                "hosts": len(placed.leases),
                "user": gang.spec.user,
            },
        )
        self._feasible.discard(gang.job_id)

    def _undo(
        self,
        placed: _Placed,
        attempts: dict[int, int],
        why: str,
        returned: list[tuple[Gang, str]],
        requeued: str = "",
    ) -> None:
        """A placed gang is not launched: its tasks (if recorded, ``attempts``) READY again
        (``requeued``: the reason they get, else ``why``), and it is added to those to hand
        back (``returned``) with ``why``. Its leases are the caller's to release (other gangs
        of its chunk may use them)."""
        if attempts:
            self._back_to_ready(placed.gang, attempts, requeued or why)
        self._not_placed(placed.gang, _NotPlaced(why), [], returned)

    def _lease_all(self, agent_ids: Sequence[str]) -> dict[str, Lease]:
        leases: dict[str, Lease] = {}
        for agent_id in agent_ids:
            lease = self._hosts.lease(agent_id)
            if lease is None:
                for got in leases.values():
                    self._hosts.release(got)
                raise _NotPlaced(f"agent {agent_id} was taken by another placement", HOST_TAKEN)
            leases[agent_id] = lease
        return leases

    def _shares(
        self, placed: _Placed, attempts: dict[int, int], taken: dict[str, set[int]]
    ) -> Shares:
        """Each host's tasks, with their ports (from the host's offers, but those ``taken`` by
        other gangs of the chunk on the host: these are added) and environment."""
        gang, hosts, leases = placed.gang, placed.hosts, placed.leases
        names = list(gang.spec.task.ports)
        per_task = gang.ports_per_task
        on_host = Counter(hosts)
        free_ports: dict[str, list[int]] = {}
        for h, n in on_host.items():
            used = taken.setdefault(h, set())
            free_ports[h] = take_ports(leases[h].ports, per_task * n, used)
            used.update(free_ports[h])
        ranks = topology(hosts)
        ports = [
            free_ports[host][r.local_rank * per_task : (r.local_rank + 1) * per_task]
            for host, r in zip(hosts, ranks, strict=True)
        ]
        address = {h: _address(lease) for h, lease in leases.items()}
        peers = [f"{address[h]}:{p[0]}" for h, p in zip(hosts, ports, strict=True)]
        by_host: dict[str, list[LaunchTask]] = {}
        container = container_launch(gang.spec.task)
        elastic: Mapping[str, str] = {}
        if is_elastic(gang.spec) and self._rendezvous is not None:
            elastic = self._rendezvous.task_env(gang.job_id, gang.spec)
        # Only this launch's tasks form its ring: a new secret for it. An elastic gang's members
        # join rings over many launches: its endpoint keeps one secret for the job.
        secret = elastic.get(GANG_SECRET) or new_secret()
        for rank, (instance, host) in enumerate(zip(gang.instances, hosts, strict=True)):
            task_id = attempt_id(gang.job_id, instance, attempts[instance])
            gang_env = GangEnv.at(
                rank,
                gang.size,
                peers,
                ranks[rank],
                job_id=gang.job_id,
                instance_id=instance,
                attempt_id=task_id,
                ports=tuple(zip(names, ports[rank][1:], strict=True)),
                secret=secret,
            )
            env = {**gang.spec.task.env, **gang_env.to_env(), **elastic}
            by_host.setdefault(host, []).append(
                LaunchTask(
                    task_id=task_id,
                    name=f"{gang.spec.name}-{instance}",
                    command=gang.spec.task.command,
                    env=env,
                    resources=gang.per_task,
                    ports=tuple(ports[rank]),
                    kill_grace_seconds=gang.kill_grace_seconds,
                    container=container,
                    user=gang.spec.user,
                )
            )
        return [(leases[h], tasks) for h, tasks in by_host.items()]

    def _back_to_ready(self, gang: Gang, attempts: dict[int, int], why: str) -> None:
        try:
            self._jobs.update_tasks(
                gang.job_id,
                [
                    TaskUpdate(i, attempts[i], TaskState.READY, "requeued", why)
                    for i in gang.instances
                ],
            )
        except PelotonError:
            log.exception("could not requeue a gang whose launch failed")


# Each host's tasks of a gang: what the host manager launches, one task group per host.
Shares = list[tuple[Lease, list[LaunchTask]]]


@dataclass
class _Chunk:
    """Gangs placed in a round and not handed to a launch worker yet, the leases of their
    hosts (shared: a host may hold several of them), and the round's snapshot."""

    snapshot: engine.Snapshot
    placed: list[_Placed] = field(default_factory=list)
    leases: dict[str, Lease] = field(default_factory=dict)


@dataclass(frozen=True)
class _Placed:
    """A gang placed on hosts (each task's agent id, in rank order) and their leases, and the
    attempts of its job's READY tasks (read with its round)."""

    gang: Gang
    hosts: list[str]
    leases: dict[str, Lease]
    ready: dict[int, int]


def _leases(placed: Iterable[_Placed]) -> dict[str, Lease]:
    """The leases of these gangs' hosts, each once, by lease id."""
    return {lease.lease_id: lease for p in placed for lease in p.leases.values()}


def _release(hosts: Hosts, leases: Iterable[Lease]) -> None:
    for lease in leases:
        hosts.release(lease)


def _places(placed: _Placed, shares: Shares, attempts: dict[int, int]) -> dict[int, Placement]:
    """Where each task's attempt is launched: hostname, agent id and executor id."""
    executors = {lease.agent_id: executor_id(tasks) for lease, tasks in shares}
    leases = placed.leases
    return {
        i: Placement(attempts[i], leases[h].hostname, h, executors[h])
        for i, h in zip(placed.gang.instances, placed.hosts, strict=True)
    }


def _attempts(gang: Gang, ready: dict[int, int]) -> dict[int, int]:
    """The attempt of each task of ``gang``, from its job's READY ones."""
    missing = [i for i in gang.instances if i not in ready]
    if missing:
        raise _NotPlaced(f"{len(missing)} tasks of the gang are no longer READY")
    return {i: ready[i] for i in gang.instances}


def _address(lease: Lease) -> str:
    """Where a host's tasks are reached: the agent's IP from its offers (the address its
    tasks listen on with host networking), else its hostname."""
    agent = lease.agent_address
    return agent.rsplit(":", 1)[0] if agent else lease.hostname
