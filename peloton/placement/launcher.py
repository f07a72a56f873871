"""The launcher: admitted gangs -> placement -> leases -> one task group per host.

A loop on its own thread, woken when offers arrive or the resource manager admits gangs (and
once a second regardless). For each gang it takes: place every task (the placement engine, on
one snapshot of the offer pool per round), lease every host it uses or none, record READY ->
PLACING -> PLACED -> LAUNCHING, and launch. Anything that fails before the launch releases the
leases and hands the gang back to the resource manager with the reason, which becomes the job's
pending reason.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Protocol

from peloton.errors import PelotonError
from peloton.gang import AdmittedGangs, Gang
from peloton.hostmgr.launch import LaunchTask
from peloton.hostmgr.offers import HostOffers, Lease, LeaseError, take_ports
from peloton.jobmgr.manager import JobManager
from peloton.jobmgr.records import TaskUpdate
from peloton.jobmgr.states import TaskState
from peloton.placement import engine

log = logging.getLogger(__name__)

# Gangs taken from the resource manager per round.
BATCH = 64


class Hosts(Protocol):
    """What the launcher needs of the host manager."""

    def snapshot(self) -> list[HostOffers]: ...

    def lease(self, hostname: str) -> Lease | None: ...

    def release(self, lease: Lease) -> None: ...

    def launch(self, shares: Sequence[tuple[Lease, Sequence[LaunchTask]]]) -> None: ...

    def set_demand(self, demand: bool) -> None: ...


class _NotPlaced(Exception):
    """The gang goes back to the resource manager with this reason."""


class Launcher:
    """Places and launches admitted gangs until ``stop()``."""

    def __init__(
        self, source: AdmittedGangs, hosts: Hosts, jobs: JobManager, interval: float = 1.0
    ) -> None:
        self._source = source
        self._hosts = hosts
        self._jobs = jobs
        self._interval = interval
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

    def wake(self) -> None:
        """Something changed (offers arrived, gangs admitted): run a round now."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            try:
                self.run_once()
            except Exception:
                log.exception("launcher round failed")

    def run_once(self) -> int:
        """One round: every admitted gang is tried once. Returns how many were launched."""
        gangs = self._source.take_admitted(BATCH)
        # Demand exists while gangs wait, placeable or not (then more offers may help).
        self._hosts.set_demand(bool(gangs))
        launched = 0
        # One snapshot per round (taking one costs a pass over every host); hosts this round
        # leased are left out of it for the next gangs.
        snapshot = engine.Snapshot(self._hosts.snapshot() if gangs else [])
        for gang in gangs:
            try:
                used = self._place_and_launch(gang, snapshot)
                launched += 1
                snapshot.drop(used)
            except _NotPlaced as exc:
                self._source.return_admitted(gang, str(exc))
        return launched

    def _place_and_launch(self, gang: Gang, snapshot: engine.Snapshot) -> set[str]:
        """Place, lease, record and launch one gang; returns the hosts it leased."""
        placement = engine.place_on(gang, snapshot)
        if placement.hosts is None:
            raise _NotPlaced(placement.reason)
        leases = self._lease_all(sorted(set(placement.hosts)))
        attempts: dict[int, int] = {}
        try:
            attempts = self._attempts(gang)
            shares = self._shares(gang, placement.hosts, leases, attempts)
            self._record(gang, placement.hosts, attempts)
        except (PelotonError, _NotPlaced) as exc:
            for lease in leases.values():
                self._hosts.release(lease)
            if attempts:
                self._back_to_ready(gang, attempts, str(exc))
            raise _NotPlaced(str(exc)) from exc
        try:
            self._hosts.launch(shares)
        except (LeaseError, PelotonError) as exc:
            for lease in leases.values():
                self._hosts.release(lease)
            self._back_to_ready(gang, attempts, str(exc))
            raise _NotPlaced(f"launch failed: {exc}") from exc
        log.info(
            "gang launched",
            extra={"job_id": gang.job_id, "tasks": gang.size, "hosts": len(leases)},
        )
        return set(leases)

    def _lease_all(self, hostnames: Sequence[str]) -> dict[str, Lease]:
        leases: dict[str, Lease] = {}
        for name in hostnames:
            lease = self._hosts.lease(name)
            if lease is None:
                for got in leases.values():
                    self._hosts.release(got)
                raise _NotPlaced(f"host {name} was taken by another placement")
            leases[name] = lease
        return leases

    def _attempts(self, gang: Gang) -> dict[int, int]:
        tasks, _ = self._jobs.list_tasks(gang.job_id, frozenset({TaskState.READY}), 10_000)
        attempts = {t.instance_id: t.current.attempt for t in tasks}
        missing = [i for i in gang.instances if i not in attempts]
        if missing:
            raise _NotPlaced(f"{len(missing)} tasks of the gang are no longer READY")
        return attempts

    def _shares(
        self,
        gang: Gang,
        hosts: Sequence[str],
        leases: dict[str, Lease],
        attempts: dict[int, int],
    ) -> list[tuple[Lease, list[LaunchTask]]]:
        by_host: dict[str, list[LaunchTask]] = {}
        names = list(gang.spec.task.ports)
        ports_left = {h: list(lease.ports) for h, lease in leases.items()}
        used_ports: dict[str, int] = {}
        for rank, (instance, host) in enumerate(zip(gang.instances, hosts, strict=True)):
            task_id = f"{gang.job_id}-{instance}-{attempts[instance]}"
            ports: list[int] = []
            if names:
                offset = used_ports.get(host, 0)
                ports = take_ports(ports_left[host], offset + len(names))[offset:]
                used_ports[host] = offset + len(names)
            env = dict(gang.spec.task.env)
            env.update(
                PELOTON_JOB_ID=gang.job_id,
                PELOTON_INSTANCE_ID=str(instance),
                PELOTON_ATTEMPT_ID=task_id,
                PELOTON_RANK=str(rank),
                PELOTON_GANG_SIZE=str(gang.size),
            )
            env.update(
                {f"PELOTON_PORT_{n.upper()}": str(p) for n, p in zip(names, ports, strict=True)}
            )
            by_host.setdefault(host, []).append(
                LaunchTask(
                    task_id=task_id,
                    name=f"{gang.spec.name}-{instance}",
                    command=gang.spec.task.command,
                    env=env,
                    resources=gang.per_task,
                    ports=tuple(ports),
                    kill_grace_seconds=gang.kill_grace_seconds,
                )
            )
        return [(leases[h], tasks) for h, tasks in by_host.items()]

    def _record(self, gang: Gang, hosts: Sequence[str], attempts: dict[int, int]) -> None:
        for state, reason in (
            (TaskState.PLACING, "placing"),
            (TaskState.PLACED, "placed"),
            (TaskState.LAUNCHING, "launching"),
        ):
            self._jobs.update_tasks(
                gang.job_id,
                [
                    TaskUpdate(i, attempts[i], state, reason, "", host)
                    for i, host in zip(gang.instances, hosts, strict=True)
                ],
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
