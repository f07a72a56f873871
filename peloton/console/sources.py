"""What the console reads of the daemon's components: snapshots for :mod:`peloton.console.views`,
each through the component's own thread-safe reads, the API servicers where an RPC already
answers the question (so that the console and gRPC answer alike), and the database's job tables
where one read serves a whole page (what every running task holds)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import cast

import grpc

from peloton.api.caller import acting_as
from peloton.api.host_service import HostService
from peloton.console.views import Holder, Holding
from peloton.core.access import ANONYMOUS
from peloton.core.hosts import HostView
from peloton.core.records import JobRecord, attempt_id, parse_attempt_id
from peloton.core.states import TASK_ACTIVE, TaskState
from peloton.errors import PelotonError
from peloton.hostmgr.hosts import HostRegistry
from peloton.jobmgr.manager import JobManager
from peloton.resmgr.manager import QueuedGang, ResourceManager
from peloton.resmgr.metrics import PoolStatus
from peloton.resmgr.pool import PoolTree
from peloton.storage import jobs as job_repo
from peloton.storage.db import Database
from peloton.v1 import host_pb2

# The context of a servicer method the console calls: the methods it calls never read theirs.
NO_CONTEXT = cast(grpc.ServicerContext, None)
# The states of an attempt that holds its resources on a host (once launched on an agent).
_ACTIVE = frozenset(s.value for s in TASK_ACTIVE)
# How long a task's missing GPU report is not asked for again (each ask reads its agent).
REPORT_RETRY_SECONDS = 5.0
# Reports asked for between two looks at what runs (and whether the console stops).
ASKS_PER_ROUND = 32


@dataclass(frozen=True)
class ClusterSnapshot:
    """What the cluster page is built from (:func:`peloton.console.views.cluster_json`)."""

    hosts: list[HostView]
    holdings: list[Holding]
    holders: dict[str, Holder]


class GpuReports:
    """The host GPU indices each running attempt reported (GetTaskGpus), asked by a thread of
    its own (each ask reads the task's agent: never while a page waits), once per attempt (a
    task's GPUs never change) and again after REPORT_RETRY_SECONDS while it has not reported.
    ``reported()`` is called after new reports came (the cluster page then shows them).
    Thread-safe; forgets attempts that no longer run."""

    def __init__(
        self,
        hosts: HostService,
        reported: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._hosts = hosts
        self._reported = reported
        self._clock = clock
        self._cond = threading.Condition()
        self._running: set[str] = set()
        self._known: dict[str, tuple[int, ...]] = {}
        self._asked: dict[str, float] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Ask for reports in the background until :meth:`stop`."""
        self._thread = threading.Thread(target=self._loop, name="console-gpu-reports", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop asking (returns once the ask under way ended)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def known(self, attempt_id: str) -> tuple[int, ...] | None:
        """The GPUs a running attempt reported, if it did and was asked."""
        with self._cond:
            return self._known.get(attempt_id)

    def lookup(self, running: Collection[str]) -> dict[str, tuple[int, ...]]:
        """The reports known of the ``running`` attempts (Mesos task ids); the others are asked
        for in the background."""
        with self._cond:
            self._running = set(running)
            for gone in set(self._known) - self._running:
                del self._known[gone]
            for gone in set(self._asked) - self._running:
                del self._asked[gone]
            self._cond.notify_all()
            return {a: self._known[a] for a in running if a in self._known}

    def _due(self) -> tuple[list[str], float]:
        """The attempts to ask for now, and how long until the next is due (the lock held)."""
        now = self._clock()
        due, wait = [], REPORT_RETRY_SECONDS
        for attempt in self._running - self._known.keys():
            left = self._asked.get(attempt, -math.inf) + REPORT_RETRY_SECONDS - now
            if left <= 0:
                due.append(attempt)
            else:
                wait = min(wait, left)
        return due, wait

    def _loop(self) -> None:
        while True:
            with self._cond:
                due, wait = self._due()
                while not due and not self._stopping:
                    self._cond.wait(wait)
                    due, wait = self._due()
                if self._stopping:
                    return
                due = sorted(due)[:ASKS_PER_ROUND]
                now = self._clock()
                for attempt in due:
                    self._asked[attempt] = now
            found = {a: got for a in due if (got := self._ask(a)) is not None}
            if found:
                with self._cond:
                    self._known.update((a, got) for a, got in found.items() if a in self._running)
                self._reported()

    def _ask(self, attempt: str) -> tuple[int, ...] | None:
        parsed = parse_attempt_id(attempt)
        if parsed is None:
            return None
        job_id, instance, number = parsed
        request = host_pb2.GetTaskGpusRequest(job_id=job_id, instance_id=instance, attempt=number)
        try:
            # As the daemon itself: the indices only place cells; who may see whose is decided
            # when the page is built.
            with acting_as(ANONYMOUS):
                answer = self._hosts.GetTaskGpus(request, NO_CONTEXT)
        except PelotonError:
            return None  # an agent that cannot be read now, an attempt that just ended
        return tuple(answer.gpu_indices) if answer.reported else None


class Sources:
    """Thread-safe reads of the daemon's components for the console's pages."""

    def __init__(
        self,
        jobs: JobManager,
        resmgr: ResourceManager,
        hosts: Callable[[], HostRegistry],
        reports: GpuReports,
        db: Database,
    ) -> None:
        self.jobs = jobs
        self._db = db
        self._resmgr = resmgr
        self._hosts = hosts
        self.reports = reports

    def hosts(self) -> list[HostView]:
        """Every host, by hostname."""
        return self._hosts().list()

    def cluster(self) -> ClusterSnapshot:
        """The hosts, what each attempt launched on one holds there, and the jobs that hold
        it: as the database has them (every daemon's, and the truth a restart rebuilds from),
        in three reads however many tasks run."""
        hosts = self.hosts()
        with self._db.reading() as session:
            job_ids = job_repo.jobs_with_tasks_in(session, TASK_ACTIVE)
            jobs = {j.id: j for j in job_repo.get_jobs(session, job_ids)}
            # A task with a fraction of a GPU still takes a whole one from the others.
            gpus = {j.id: math.ceil(j.spec.task.resources.gpu) for j in jobs.values()}
            holding = [j for j in job_ids if gpus.get(j, 0) > 0]
            tasks = job_repo.task_values(session, holding)
        active = [
            (job, instance, v)
            for (job, instance), v in tasks.items()
            if v["state"] in _ACTIVE and v["agent_id"]
        ]
        ids = [attempt_id(job, instance, v["attempt"]) for job, instance, v in active]
        reported = self.reports.lookup(ids)
        holdings = [
            Holding(a, v["agent_id"], job, i, gpus[job], reported.get(a), v["started_at"])
            for a, (job, i, v) in zip(ids, active, strict=True)
        ]
        holders = {j: Holder(jobs[j].spec.name, jobs[j].spec.pool) for j in holding}
        return ClusterSnapshot(hosts, holdings, holders)

    def pool_tree(self) -> PoolTree:
        """The pool tree this daemon serves."""
        return self._resmgr.pool_tree()

    def statuses(self) -> Mapping[str, PoolStatus]:
        """Every pool's figures as of the resource manager's last cycle."""
        return self._resmgr.statuses()

    def queue(self) -> tuple[dict[str, list[QueuedGang]], dict[str, JobRecord]]:
        """Each leaf pool's waiting gangs in admission order, and their jobs."""
        queues = self._resmgr.queue()
        ids = {g.job_id for gangs in queues.values() for g in gangs}
        return queues, {j.id: j for j in self.jobs.get_jobs(ids)}

    def pending(self, job_ids: Collection[str]) -> dict[str, tuple[int, ...]]:
        """Each job's PENDING instances, ascending."""
        return {j: self.jobs.instances(j, {TaskState.PENDING}) for j in job_ids}
