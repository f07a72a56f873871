"""A resource manager over a real database (or, with no database, the in-memory ledger of
``ledger_memory.py``) with a scripted cluster: tests drive cycles, place admitted gangs, end tasks
and complete kills, and read what happened."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ledger_memory import MemoryLedger, MemoryPoolStore
from support import FakeClock, RecordingKiller

from peloton.core.ledger import PoolStore
from peloton.core.pools import KindConfig, Policy, PoolConfig
from peloton.core.records import JobRecord, TaskRecord, TaskUpdate
from peloton.core.resources import Resources
from peloton.core.states import TaskState
from peloton.jobmgr.manager import JobManager
from peloton.resmgr.manager import ResourceManager
from peloton.storage.db import Database
from peloton.storage.pools import SqlPoolStore
from peloton.v1 import common_pb2, job_pb2

T = TaskState
TO_RUNNING = (T.PLACING, T.PLACED, T.LAUNCHING, T.RUNNING)


@dataclass
class Preemption:
    cycle: int
    job_id: str
    pool: str
    message: str
    tasks: int = 0  # tasks an elastic gang was shrunk by; 0: the whole gang


@dataclass
class Harness:
    """Pools, jobs and a resource manager whose cycles the test runs one at a time; ``db``
    None: jobs and pools in memory (:class:`MemoryLedger`), no database."""

    db: Database | None
    capacity: Resources
    clock: FakeClock = field(default_factory=FakeClock)
    killer: RecordingKiller = field(default_factory=RecordingKiller)
    cycles: int = 0
    preemptions: list[Preemption] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.jobs: JobManager | MemoryLedger
        self.pools: PoolStore
        if self.db is None:
            self.jobs = MemoryLedger(clock=self.clock, killer=self.killer)
            self.pools = MemoryPoolStore(self.jobs)
        else:
            self.jobs = JobManager(self.db, clock=self.clock, killer=self.killer)
            self.pools = SqlPoolStore(self.db)
        self.rm = ResourceManager(self.pools, self.jobs, clock=self.seconds)
        self.jobs.set_scheduler(self.rm)
        self.rm.load()
        self.rm.set_capacity(self.capacity)
        self._killed_seen = 0
        self._pool_of: dict[str, str] = {}
        real_preempt = self.jobs.preempt

        def recording_preempt(job_id: str, message: str, count: int = 0) -> JobRecord:
            pool = self._pool_of[job_id]
            self.preemptions.append(Preemption(self.cycles, job_id, pool, message, count))
            return real_preempt(job_id, message, count)

        self.jobs.preempt = recording_preempt  # type: ignore[method-assign]

    @classmethod
    def in_memory(cls, capacity: Resources) -> Harness:
        """A harness on the in-memory ledger and pool store."""
        return cls(None, capacity)

    def seconds(self) -> float:
        """The resource manager's clock: the job manager's, in seconds."""
        return self.clock().timestamp()

    # ---------------------------------------------------------------- setup

    def pool(
        self,
        path: str,
        gpu_reservation: float = 0,
        gpu_limit: float = math.inf,
        *,
        share: float = 1,
        policy: Policy = Policy.ELASTIC,
    ) -> None:
        kinds = {"gpu": KindConfig(gpu_reservation, gpu_limit, share, policy)}
        self.rm.create_pool(PoolConfig(path, kinds=kinds))

    def submit(
        self,
        pool: str,
        instances: int,
        gpu: float = 1,
        *,
        name: str = "job",
        priority: int = 0,
        preemptible: bool = True,
        min_instances: int = 0,
        max_failures: int | None = None,
        backoff_seconds: int | None = None,
        max_runtime_seconds: int = 0,
        cpu: float = 1,
        mem_mb: float = 64,
        elastic: bool = False,
    ) -> str:
        """A job of ``instances`` tasks; ``elastic``: an elastic gang of ``min_instances`` to
        ``instances`` tasks."""
        spec = job_pb2.JobSpec(
            name=name,
            pool=pool,
            priority=priority,
            instances=instances,
            task=job_pb2.TaskSpec(
                command="train", resources=common_pb2.Resources(cpu=cpu, mem_mb=mem_mb, gpu=gpu)
            ),
        )
        spec.gang.min_instances = min_instances
        if elastic:
            spec.gang.max_instances = instances
        if max_failures is not None:
            spec.restart.max_failures = max_failures
        if backoff_seconds is not None:
            spec.restart.backoff_seconds = backoff_seconds
        spec.max_runtime_seconds = max_runtime_seconds
        spec.preemption.preemptible = preemptible
        spec.preemption.kill_grace_seconds = 5
        self.clock.advance(0.001)  # submissions are ordered in time
        job, _ = self.jobs.create_job(spec)
        self._pool_of[job.id] = pool
        return job.id

    # ---------------------------------------------------------------- the cluster's side

    def cycle(self, n: int = 1) -> None:
        for _ in range(n):
            self.cycles += 1
            self.clock.advance(1.0)
            self.rm.run_cycle()

    def place_all(self) -> list[str]:
        """Launch every admitted gang at once (as a placer with room would); returns the jobs."""
        placed = []
        for gang in self.rm.take_admitted(10_000):
            self._move(gang.job_id, gang.instances, TO_RUNNING)
            placed.append(gang.job_id)
        return placed

    def finish(self, job_id: str) -> None:
        running = self.jobs.instances(job_id, {T.RUNNING})
        self._move(job_id, running, (T.SUCCEEDED,))

    def complete_kills(self) -> int:
        """Every task the killer was asked to stop reports KILLED; returns how many."""
        killed = self.killer.killed[self._killed_seen :]
        self._killed_seen += len(killed)
        for attempt_id in killed:
            job_id, instance, attempt = attempt_id.rsplit("-", 2)
            self.jobs.update_tasks(job_id, [TaskUpdate(int(instance), int(attempt), T.KILLED)])
        return len(killed)

    def _move(self, job_id: str, instances: Sequence[int], states: Sequence[TaskState]) -> None:
        attempts = {t.instance_id: t.current.attempt for t in self.tasks(job_id)}
        for state in states:
            self.jobs.update_tasks(
                job_id, [TaskUpdate(i, attempts[i], state, host=f"h{i}") for i in instances]
            )

    # ---------------------------------------------------------------- reading

    def job(self, job_id: str) -> JobRecord:
        return self.jobs.get_job(job_id)

    def counts(self, job_id: str) -> dict[str, int]:
        return {s.value: n for s, n in self.job(job_id).task_counts.items() if n}

    def tasks(self, job_id: str) -> list[TaskRecord]:
        records, _ = self.jobs.list_tasks(job_id, frozenset(), 10_000, "")
        return records

    def gpus_held(self, pool: str) -> float:
        return self.rm.status(pool).kinds["gpu"].allocation
