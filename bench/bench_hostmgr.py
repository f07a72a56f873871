"""Host manager benchmark: offers processed per second and launch throughput (tasks/s) against a
simulated 10,000-agent minicluster.

Run from the repository root::

    .venv/bin/python -m bench.bench_hostmgr [--agents N] [--gangs G] [--gang-size S] [--quick]

A simulated minicluster (``peloton.minicluster``, no processes: tasks "run" on a clock) serves
the Mesos v1 API on loopback with ``--agents`` agents (8 cpus, 64 GiB, 8 GPUs each). The host
manager subscribes through pymesos exactly as the daemon does, with a job manager on a throwaway
SQLite database, and measures:

* **offers**: from SUBSCRIBE until every agent's offer sits in the offer pool (parsed, per-host,
  host records written), so offers/s = agents / that time.
* **launch**: ``--gangs`` gangs of ``--gang-size`` one-GPU tasks are admitted at once; the
  launcher places them (leases, READY -> PLACING -> PLACED -> LAUNCHING in the database) and sends
  one ACCEPT per host; tasks/s = tasks / time until the last ACCEPT was sent, and also until every
  task's TASK_RUNNING was persisted and acknowledged.

Results are printed as a table and written to ``.bench/bench_hostmgr.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from peloton.core.gang import Gang
from peloton.core.states import TaskState
from peloton.hostmgr.framework import HostManager, MesosSettings
from peloton.hostmgr.metrics import HostmgrMetrics
from peloton.jobmgr.manager import JobManager
from peloton.minicluster import AgentSpec, Minicluster
from peloton.placement.launcher import Launcher
from peloton.storage import jobs as job_repo
from peloton.storage import migrate
from peloton.storage.db import Database
from peloton.storage.hosts import SqlHostStore
from peloton.v1 import common_pb2, job_pb2

RESOURCES = "cpus:8;mem:65536;disk:1000000;gpus:8;ports:[31000-32000]"
ATTRIBUTES = "rack:r1;gpu_model:A100"
OUT = Path(".bench")


class Gangs:
    """An AdmittedGangs source holding the benchmark's gangs (the resource manager's role)."""

    def __init__(self, gangs: Sequence[Gang]) -> None:
        self.gangs = list(gangs)
        self.returned = 0

    def take_admitted(self, limit: int) -> Sequence[Gang]:
        taken, self.gangs = self.gangs[:limit], self.gangs[limit:]
        return taken

    def return_admitted(self, returned: Sequence[tuple[Gang, str]]) -> None:
        self.returned += len(returned)
        self.gangs.extend(gang for gang, _ in returned)


def wait(pred: Any, timeout: float, what: str) -> float:
    start = time.perf_counter()
    while not pred():
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)
    return time.perf_counter() - start


def make_gangs(jobs: JobManager, n: int, size: int) -> list[Gang]:
    spec = job_pb2.JobSpec(
        name="bench",
        instances=size,
        task=job_pb2.TaskSpec(
            command="sleep 3600", resources=common_pb2.Resources(cpu=1, mem_mb=1024, gpu=1)
        ),
    )
    gangs = []
    for _ in range(n):
        job, _ = jobs.create_job(spec)
        ids = jobs.admit_pending([(job.id, size, "bench")])[0]
        gangs.append(Gang.of_job(job.id, job.spec, ids, datetime.now(UTC)))
    return gangs


def run(agents: int, n_gangs: int, gang_size: int, workdir: Path) -> dict[str, Any]:
    db = Database.from_url(f"sqlite:///{workdir / 'peloton.db'}")
    migrate.upgrade(db.engine)
    jobs = JobManager(db)
    cluster = Minicluster(
        AgentSpec.uniform(agents, resources=RESOURCES, attributes=ATTRIBUTES),
        port=0,
        work_dir=workdir / "cluster",
        simulated=True,
    )
    cluster.start()
    hm = HostManager(
        MesosSettings(master=cluster.address, offer_hold_seconds=600, lease_seconds=600),
        jobs,
        SqlHostStore(db),
        HostmgrMetrics(CollectorRegistry()),
    )
    results: dict[str, Any] = {"agents": agents, "gangs": n_gangs, "gang_size": gang_size}
    try:
        gangs = make_gangs(jobs, n_gangs, gang_size)
        start = time.perf_counter()
        hm.start()
        first = wait(lambda: len(hm.pool.snapshot()) >= agents, 600, "an offer from every agent")
        results["offers_first_s"] = first
        results["offers_first_per_s"] = agents / first
        wait(lambda: len(hm.hosts.list()) >= agents, 600, "host records")

        source = Gangs(gangs)
        launcher = Launcher(source, hm, jobs)
        tasks = n_gangs * gang_size
        start = time.perf_counter()
        while source.gangs:
            launcher.run_once()
        launched = time.perf_counter() - start
        results["launch_s"] = launched
        results["launch_tasks_per_s"] = tasks / launched

        def all_running() -> bool:
            with db.reading() as session:
                counts = job_repo.count_tasks_by_state(session)
            return counts.get(TaskState.RUNNING.value, 0) >= tasks

        running = wait(all_running, 600, "every task RUNNING") + launched
        results["running_s"] = running
        results["running_tasks_per_s"] = tasks / running
        results["returned_gangs"] = source.returned
    finally:
        hm.stop()
        cluster.stop()
        db.dispose()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--gangs", type=int, default=200)
    parser.add_argument("--gang-size", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="smoke test: 500 agents, 20 gangs")
    args = parser.parse_args(argv)
    if args.quick:
        args.agents, args.gangs = 500, 20
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-hostmgr-") as tmp:
        results = run(args.agents, args.gangs, args.gang_size, Path(tmp))
    results["machine"] = (
        f"{platform.processor() or platform.machine()}, {platform.python_version()}"
    )
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_hostmgr.json").write_text(json.dumps(results, indent=2))
    print(f"host manager vs simulated minicluster: {args.agents} agents")
    print(f"  offers, first subscription : {results['offers_first_per_s']:10.0f} offers/s")
    tasks = args.gangs * args.gang_size
    print(
        f"  launch ({args.gangs} gangs x {args.gang_size}, placement engine, up to ACCEPT): "
        f"{results['launch_tasks_per_s']:8.0f} tasks/s ({tasks} tasks)"
    )
    print(f"  launch up to TASK_RUNNING persisted: {results['running_tasks_per_s']:8.0f} tasks/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
