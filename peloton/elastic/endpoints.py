"""The rendezvous endpoints of elastic gangs, served by the daemon: how the scheduler tells a
running gang about every change of its membership.

Each elastic job gets its own endpoint (:class:`peloton.collective.rendezvous.RendezvousServer`,
the protocol ``peloton-run --elastic`` serves too) when its first tasks launch, on a port from
the kernel at ``rendezvous_host``, with a per-job token; the launcher puts both in every task's
environment (``PELOTON_RENDEZVOUS``, ``PELOTON_RENDEZVOUS_TOKEN``, ``PELOTON_ELASTIC_TIMEOUT``),
with the job's gang secret (``PELOTON_GANG_SECRET``): the members of every generation, grown or
restarted ones too, prove it to one another when their runtimes connect. The endpoint itself
answers only sessions that present the token. A worker is known by its task's attempt id
(``PELOTON_ATTEMPT_ID``).

- A task the gang grows into joins its endpoint when its process starts: the generation ends,
  every rank re-forms at the new size at its next commit, state kept.
- When the scheduler shrinks the gang (preemption) or a task fails or its host is lost, it
  :meth:`Endpoints.drain`\\ s their attempts: the generation ends at once, the survivors re-form
  without them (keeping their state on a drain, restoring the last commit on a failure) and a
  drained rank, told so when it asks to re-join, leaves and exits.

Every generation that forms is recorded on the job (``job get`` shows it) with a job event that
says how and why the gang changed (``resized 2 -> 6 (capacity freed)``, ``shrunk 6 -> 4
(preempted: …)``), and counted in the metrics. An endpoint closes when its job ends. Endpoints
live in the daemon's memory: ranks of a daemon that restarted lose theirs and fail, and their
gang restarts with the new daemon's.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from peloton.collective.rendezvous import Generation, RendezvousServer
from peloton.core import gangenv
from peloton.core.ledger import GenerationLedger
from peloton.core.records import AttemptRecord, parse_attempt_id
from peloton.core.states import TASK_ACTIVE, TaskState
from peloton.elastic import metrics as m
from peloton.elastic.metrics import ElasticMetrics
from peloton.errors import PelotonError
from peloton.v1 import job_pb2

log = logging.getLogger(__name__)

# How long the explanation of a generation waits for the status update of a rank that left
# (a killed process drops its session before its executor reports it).
EXPLAIN_WAIT_SECONDS = 5.0
# Reasons of tasks the scheduler took back.
_PREEMPTED = "preempted"


class Changes(Protocol):
    """The job event bus, as the endpoints wait on it."""

    def generation(self) -> int: ...

    def wait(self, seen: int, timeout: float) -> int: ...


@dataclass
class _Endpoint:
    server: RendezvousServer
    # The gang secret every member of every generation holds (PELOTON_GANG_SECRET).
    secret: str = field(default_factory=gangenv.new_secret, repr=False)
    size: int = 0


class Endpoints:
    """Every running elastic gang's rendezvous endpoint (see the module doc)."""

    def __init__(
        self,
        jobs: GenerationLedger,
        changes: Changes,
        host: str,
        metrics: ElasticMetrics | None = None,
    ) -> None:
        """``host``: where endpoints listen and tasks connect (every agent must reach it)."""
        self._jobs = jobs
        self._changes = changes
        self.host = host
        self.metrics = metrics or ElasticMetrics()
        self._lock = threading.Lock()
        self._endpoints: dict[str, _Endpoint] = {}
        self._ended: set[str] = set()  # jobs told changed that may have ended
        self._wake = threading.Condition(self._lock)
        self._stopped = False
        self.metrics.watch(self.sizes)
        self._thread = threading.Thread(target=self._reap, name="elastic-endpoints", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the launcher's side

    def task_env(self, job_id: str, spec: job_pb2.JobSpec) -> Mapping[str, str]:
        """The variables that point a task of elastic job ``job_id`` at its gang's endpoint
        (opened now if the job has none)."""
        with self._lock:
            endpoint = self._endpoints.get(job_id)
            if endpoint is None:
                endpoint = self._open(job_id, spec)
            server = endpoint.server
        return {
            gangenv.RENDEZVOUS: server.address,
            gangenv.RENDEZVOUS_TOKEN: server.token,
            gangenv.GANG_SECRET: endpoint.secret,
            gangenv.ELASTIC_TIMEOUT: str(spec.gang.elastic_timeout_seconds),
        }

    def _open(self, job_id: str, spec: job_pb2.JobSpec) -> _Endpoint:
        gang = spec.gang

        def on_generation(g: Generation) -> None:
            self._formed(job_id, g)

        server = RendezvousServer(
            secrets.token_hex(16),
            gang.min_instances,
            gang.max_instances,
            gang.min_instances,
            host=self.host,
            log=lambda line: log.info(
                "elastic gang rendezvous", extra={"job_id": job_id, "event": line}
            ),
            on_generation=on_generation,
            on_rollback=self.metrics.steps_lost.inc,
        )
        endpoint = self._endpoints[job_id] = _Endpoint(server)
        log.info(
            "elastic gang endpoint opened", extra={"job_id": job_id, "address": server.address}
        )
        return endpoint

    # ------------------------------------------------------------------ the scheduler's side

    def drain(self, job_id: str, attempt_ids: Sequence[str], why: str) -> None:
        """The gang shrinks: these ranks leave it (survivors re-form without them)."""
        with self._lock:
            endpoint = self._endpoints.get(job_id)
        if endpoint is not None and attempt_ids:
            endpoint.server.drain(attempt_ids, why)

    def job_changed(self, job_id: str) -> None:
        """A job changed (an event bus listener: cheap); an ended job's endpoint is closed."""
        with self._lock:
            if job_id in self._endpoints:
                self._ended.add(job_id)
                self._wake.notify()

    def sizes(self) -> dict[str, int]:
        """Ranks in each running elastic gang's current generation, by job id."""
        with self._lock:
            return {job_id: e.size for job_id, e in self._endpoints.items() if e.size}

    def addresses(self) -> dict[str, str]:
        """Each open endpoint's address, by job id."""
        with self._lock:
            return {job_id: e.server.address for job_id, e in self._endpoints.items()}

    def close(self) -> None:
        with self._lock:
            self._stopped = True
            self._wake.notify()
            endpoints, self._endpoints = list(self._endpoints.values()), {}
        for e in endpoints:
            e.server.close()
        self._thread.join(timeout=10)

    def _reap(self) -> None:
        """Closes the endpoints of jobs that ended (reads the job off the bus's thread)."""
        while True:
            with self._lock:
                self._wake.wait_for(lambda: self._stopped or bool(self._ended))
                if self._stopped:
                    return
                changed, self._ended = self._ended, set()
            for job_id in changed:
                try:
                    ended = self._jobs.get_job(job_id).terminal
                except PelotonError:  # deleted, or the database is away: check again later
                    ended = False
                if ended:
                    self._close(job_id)

    def _close(self, job_id: str) -> None:
        with self._lock:
            endpoint = self._endpoints.pop(job_id, None)
        if endpoint is not None:
            endpoint.server.close()
            log.info("elastic gang endpoint closed", extra={"job_id": job_id})

    # ------------------------------------------------------------------ generations

    def _formed(self, job_id: str, g: Generation) -> None:
        """A generation formed (on the endpoint's callback thread): record and explain it."""
        with self._lock:
            endpoint = self._endpoints.get(job_id)
            if endpoint is not None:
                endpoint.size = len(g.members)
        cause, why = self._explain(job_id, g)
        message = describe(len(g.previous), len(g.members), why)
        self.metrics.resizes.labels(cause).inc()
        self.metrics.rendezvous_seconds.observe(g.waited)
        try:
            self._jobs.record_generation(job_id, g.number, len(g.members), message)
        except PelotonError:
            log.exception("could not record an elastic gang's generation")

    def _explain(self, job_id: str, g: Generation) -> tuple[str, str]:
        """Why generation ``g`` formed: (metric cause, words)."""
        if not g.previous:
            return m.STARTED, f"generation {g.number}"
        gone = [a for a in g.previous if a not in g.members]
        if not gone:
            return m.CAPACITY_FREED, "capacity freed"
        attempts = self._ended_attempts(job_id, gone)
        preempted = [a for a in attempts if a.reason == _PREEMPTED]
        if preempted:
            return m.PREEMPTED, f"preempted: {preempted[0].message}"
        failed = [a for a in attempts if a.state in (TaskState.FAILED, TaskState.LOST)]
        if failed:
            a = failed[0]
            detail = f": {a.message}" if a.message else ""
            return m.TASK_FAILED, f"instance {a.instance_id} {a.state.value.lower()}{detail}"
        return m.LEFT, ", ".join(f"instance {i} left" for i in _instances(gone))

    def _ended_attempts(self, job_id: str, attempt_ids: Iterable[str]) -> list[AttemptRecord]:
        """The attempts of ranks that left, once the scheduler knows why (each has ended or is
        being stopped), waiting up to EXPLAIN_WAIT_SECONDS for their status updates."""
        wanted = [p for p in map(parse_attempt_id, attempt_ids) if p is not None]
        seen = self._changes.generation()
        left = EXPLAIN_WAIT_SECONDS
        while True:
            found = [self._attempt(job_id, i, n) for _, i, n in wanted]
            known = [a for a in found if a is not None]
            settled = all(a.state not in _STILL_RUNNING for a in known)
            if settled or left <= 0:
                return known
            waited = time.monotonic()
            seen = self._changes.wait(seen, left)
            left -= time.monotonic() - waited

    def _attempt(self, job_id: str, instance: int, attempt: int) -> AttemptRecord | None:
        try:
            task, _ = self._jobs.get_task(job_id, instance)
        except PelotonError:
            return None
        attempts = {a.attempt: a for a in (task.current, *task.history)}
        found, later = attempts.get(attempt), attempts.get(attempt + 1)
        if found is not None and later is not None and later.reason == _PREEMPTED:
            # Its kill already ended it (KILLED, reason "killed"): why it was being stopped is
            # its next attempt's reason, which the job manager carries over.
            return replace(found, reason=later.reason, message=later.message)
        return found


# A rank that left while its task still reads as running: its status update is on the way.
_STILL_RUNNING = TASK_ACTIVE - {TaskState.PREEMPTING, TaskState.KILLING}


def describe(before: int, after: int, why: str) -> str:
    """A generation's event message: ``resized 6 -> 8 (capacity freed)``."""
    if not before:
        return f"started with {after} ranks ({why})"
    if after < before:
        return f"shrunk {before} -> {after} ({why})"
    if after > before:
        return f"resized {before} -> {after} ({why})"
    return f"re-formed at {after} ranks ({why})"


def _instances(attempt_ids: Iterable[str]) -> list[int]:
    return sorted(p[1] for p in map(parse_attempt_id, attempt_ids) if p is not None)


def default_host(rendezvous_host: str, grpc_host: str) -> str:
    """Where endpoints listen: the configured host, else the API's unless it is a wildcard,
    else this host's address."""
    if rendezvous_host:
        return rendezvous_host
    if grpc_host not in ("", "0.0.0.0", "::", "[::]"):
        return grpc_host
    return socket.gethostbyname(socket.gethostname())
