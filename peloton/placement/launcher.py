"""The launcher: admitted gangs -> placement -> leases -> one task group per host.

A loop on its own thread, woken when offers arrive or the resource manager admits gangs (and
once a second regardless). For each gang it takes: place every task (the placement engine, on
one snapshot of the offer pool per round), lease every host it uses or none, record READY ->
PLACING -> PLACED -> LAUNCHING (one transaction), and launch. The last two run on launch
workers while the loop places the next gangs (at most IN_FLIGHT_PER_WORKER gangs per worker
placed and not launched yet). Anything that fails before the launch releases the leases and
hands the gang back to the resource manager with the reason, which becomes the job's pending
reason.

Every task starts knowing its gang (task discovery): ``PELOTON_RANK``, ``PELOTON_GANG_SIZE``,
``PELOTON_LOCAL_RANK``/``SIZE`` (among the gang's tasks on its host), ``PELOTON_CROSS_RANK``/
``SIZE`` (among the hosts holding a task of its local rank), ``PELOTON_PEERS`` (``address:port``
of every rank, in rank order: each task's first port, taken from the offers) and
``PELOTON_PORT_<NAME>`` for its named ports. The collective runtime boots from exactly these
(the contract: :mod:`peloton.core.gangenv`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from peloton.core.containers import container_launch
from peloton.core.gang import AdmittedGangs, Gang
from peloton.core.gangenv import GangEnv, topology
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
# Gangs placed and waiting for or in a launch worker, per worker, at most: the loop places the
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
        self._slots = threading.BoundedSemaphore(workers * IN_FLIGHT_PER_WORKER)
        # Gangs found to fit the cluster's hosts when empty; forgotten when the hosts change
        # (their count or total), so a gang is judged once per cluster shape.
        self._feasible: set[str] = set()
        self._cluster: tuple[int, Resources] = (0, ZERO)
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
        placed = self._round()
        return sum(1 for done in placed if done.result())

    def _round(self) -> list[Future[bool]]:
        """Place every admitted gang (up to BATCH) and hand each placed one to a launch
        worker; returns their launches, each True once launched. A gang not placed, or whose
        launch failed, is handed back to the resource manager with the reason."""
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
            for gang in gangs:
                self._source.return_admitted(gang, str(exc))
            return []
        # One snapshot per round (taking one costs a pass over every host); hosts this round
        # leased are left out of it for the next gangs, and a later round's snapshot leaves out
        # the hosts still leased to launches under way.
        offered = self._hosts.snapshot()
        largest = max(int(g.per_task.gpu) for g in gangs)
        self.metrics.gpu_fragmentation.set(engine.gpu_fragmentation(offered, largest))
        snapshot = engine.Snapshot(offered)
        totals: list[Sequence[HostOffers]] = []  # the cluster's, read once per round if needed
        placed: list[Future[bool]] = []
        for gang in gangs:
            self._slots.acquire()  # released when its launch ends (or here if not placed)
            try:
                hosts, leases = self._place(gang, snapshot)
            except _NotPlaced as exc:
                self._slots.release()
                self._not_placed(gang, exc, totals)
                continue
            # Leased hosts leave the snapshot at once, so the next gangs are placed while this
            # one is recorded and launched on a worker.
            snapshot.drop(set(leases))
            attempts = ready.get(gang.job_id, {})
            placed.append(self._workers.submit(self._launch_placed, gang, hosts, leases, attempts))
        self.metrics.rounds.inc()
        self.metrics.round_seconds.observe(time.perf_counter() - started)
        return placed

    def _launch_placed(
        self, gang: Gang, hosts: Sequence[str], leases: dict[str, Lease], ready: dict[int, int]
    ) -> bool:
        """:meth:`_launch` on a worker; whether the gang was launched."""
        try:
            self._launch(gang, hosts, leases, ready)
        except _NotPlaced as exc:
            self._not_placed(gang, exc, [])
            return False
        except Exception:
            # A bug, not a refusal: where it stopped is unknown (the gang may be launched), so
            # nothing is undone or retried; a daemon start sends placements left behind back.
            log.exception("launch failed", extra={"job_id": gang.job_id})
            return False
        finally:
            self._slots.release()
            self.wake()  # a slot is free: gangs left waiting for one may go on
        self._feasible.discard(gang.job_id)
        return True

    def _not_placed(self, gang: Gang, exc: _NotPlaced, totals: list[Sequence[HostOffers]]) -> None:
        """Hand ``gang`` back with the reason, or fail it if it can never fit (``totals``: the
        cluster's hosts if read already this round)."""
        if exc.kind == NO_FIT:
            if not totals:
                totals.append(self._totals())
            never = self._never_fits(gang, totals[0])
            if never:
                self.metrics.failures.labels(INFEASIBLE).inc()
                self._fail(gang, never)
                return
        self.metrics.failures.labels(exc.kind).inc()
        self._source.return_admitted(gang, str(exc))

    def _totals(self) -> Sequence[HostOffers]:
        """The cluster's hosts with their totals (once per round, when a gang did not fit)."""
        totals = self._hosts.totals()
        cluster = (len(totals), sum((h.free for h in totals), ZERO))
        if cluster != self._cluster:
            self._cluster = cluster
            self._feasible.clear()
        return totals

    def _never_fits(self, gang: Gang, totals: Sequence[HostOffers]) -> str | None:
        """Why ``gang`` fits no set of the cluster's hosts even when they are empty; None if it
        would (then it waits for room). With no host known yet, nothing is judged."""
        if not totals or gang.job_id in self._feasible:
            return None
        why = engine.never_fits(gang, totals)
        if why is None:
            self._feasible.add(gang.job_id)
        return why

    def _fail(self, gang: Gang, why: str) -> None:
        log.warning("gang can never be placed", extra={"job_id": gang.job_id, "why": why})
        try:
            self._jobs.fail_unplaceable(gang.job_id, f"no set of the cluster's hosts fits: {why}")
        except PelotonError:
            log.exception("could not fail an unplaceable gang")

    def _place(self, gang: Gang, snapshot: engine.Snapshot) -> tuple[list[str], dict[str, Lease]]:
        """Place every task of a gang and lease the hosts: (each task's host, the leases)."""
        placement = engine.place_on(gang, snapshot)
        if placement.hosts is None:
            raise _NotPlaced(placement.reason, NO_FIT)
        return list(placement.hosts), self._lease_all(sorted(set(placement.hosts)))

    def _launch(
        self, gang: Gang, hosts: Sequence[str], leases: dict[str, Lease], ready: dict[int, int]
    ) -> None:
        """Record and launch a placed gang (``ready``: the attempts of its job's READY tasks);
        on failure its leases are released."""
        attempts: dict[int, int] = {}
        try:
            attempts = _attempts(gang, ready)
            shares = self._shares(gang, hosts, leases, attempts)
            executors = {lease.agent_id: executor_id(tasks) for lease, tasks in shares}
            self._record(gang, [(leases[h].hostname, h, executors[h]) for h in hosts], attempts)
        except (PelotonError, _NotPlaced) as exc:
            for lease in leases.values():
                self._hosts.release(lease)
            if attempts:
                self._back_to_ready(gang, attempts, str(exc))
            raise _NotPlaced(str(exc)) from exc
        if self._leads is not None and not self._leads():
            # Deposed since the (fenced) record: launch nothing, and write nothing either (the
            # fence would refuse it). The next leader finds these tasks LAUNCHING; Mesos never
            # saw them, so reconciliation ends them and they get new attempts.
            for lease in leases.values():
                self._hosts.release(lease)
            raise _NotPlaced("this daemon no longer leads: nothing launched")
        try:
            self._hosts.launch(shares)
        except (LeaseError, PelotonError) as exc:
            for lease in leases.values():
                self._hosts.release(lease)
            self._back_to_ready(gang, attempts, str(exc))
            raise _NotPlaced(f"launch failed: {exc}") from exc
        if gang.admitted_at:
            self.metrics.gang_seconds.observe(max(0.0, time.time() - gang.admitted_at))
        log.info(
            "gang launched",
            extra={"job_id": gang.job_id, "tasks": gang.size, "hosts": len(leases)},
        )

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
        self,
        gang: Gang,
        hosts: Sequence[str],
        leases: dict[str, Lease],
        attempts: dict[int, int],
    ) -> list[tuple[Lease, list[LaunchTask]]]:
        """Each host's tasks, with their ports (from the host's offers) and environment."""
        names = list(gang.spec.task.ports)
        per_task = gang.ports_per_task
        on_host = Counter(hosts)
        free_ports = {h: take_ports(leases[h].ports, per_task * n) for h, n in on_host.items()}
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
                )
            )
        return [(leases[h], tasks) for h, tasks in by_host.items()]

    def _record(
        self, gang: Gang, places: Sequence[tuple[str, str, str]], attempts: dict[int, int]
    ) -> None:
        """READY -> PLACING -> PLACED -> LAUNCHING for every task, in one transaction, with
        where each is launched (``places``: hostname, agent id, executor id per task): an
        attempt that reached a host thus always names its sandbox."""
        self._jobs.record_launch(
            gang.job_id,
            {
                i: Placement(attempts[i], *place)
                for i, place in zip(gang.instances, places, strict=True)
            },
        )

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
