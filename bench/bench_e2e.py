"""End-to-end scheduling throughput: submission to RUNNING of 10,000 tasks through gRPC, the
database and a simulated minicluster (issue 5).

Run from the repository root::

    .venv/bin/python -m bench.bench_e2e [--backend postgresql|sqlite|both] [--repeats N] [--check]

Each run gets a fresh database (a throwaway PostgreSQL database, or a SQLite file) migrated with
``peloton db upgrade``, a simulated minicluster (``peloton minicluster up --simulated``: no
processes, a task is RUNNING as soon as it is launched) with ``--hosts`` agents of 8 GPUs spread
over ``--racks`` racks, and a ``peloton server`` with ``--mesos-master`` pointing at it. All three
are separate processes, as in a deployment: on this 2-core machine the daemon's GIL is then not
shared with the master or with the callers, so what is measured is the daemon's own throughput.
Once the daemon has every agent's capacity, ``--callers`` threads submit jobs over gRPC
(``peloton.client``) totalling ``--tasks`` one-GPU tasks in gangs of 1 to ``--max-gang`` tasks
(seeded sizes; each job is one gang). The clock runs from the first CreateJob until every task is
RUNNING *as persisted*: this process counts the tasks by state in the database every
``POLL_SECONDS``, and also notes when every task was admitted (left PENDING) and launched
(LAUNCHING or later, written before the ACCEPT). Each run then checks the history: one event
per task change (PENDING -> READY -> PLACING -> PLACED -> LAUNCHING -> STARTING -> RUNNING) and
every job RUNNING.

Figures are medians over ``--repeats`` runs (default 3); ``--check`` is a small, single run
(1,000 tasks on 160 hosts, PostgreSQL) that fails if anything is off, for ``make bench``. The
raw runs go to ``.bench/bench_e2e.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import text
from sqlalchemy.engine import Engine

from bench.bench_jobs import (
    PELOTON,
    REPO,
    Daemon,
    _cpu_seconds,
    _cpu_steal,
    _postgres_pids,
    cpu_calibration_ms,
    database,
    dies_with_us,
    log,
    machine,
    migrate_db,
)
from peloton.client import PelotonClient
from peloton.core.states import TaskState
from peloton.storage.db import make_engine
from peloton.v1 import common_pb2, job_pb2

RESULTS = REPO / ".bench" / "bench_e2e.json"
GPUS_PER_HOST = 8
# Room for eight one-GPU tasks and the executors of several gangs sharing a host.
HOST_RESOURCES = "cpus:32;mem:262144;disk:1000000;gpus:8;ports:[31000-32000]"
# How often the database is asked how far the tasks got: the figures' resolution.
POLL_SECONDS = 0.1
START_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 900.0
# What every task goes through, one event each, on the way to RUNNING.
PATH_TO_RUNNING = (
    TaskState.READY,
    TaskState.PLACING,
    TaskState.PLACED,
    TaskState.LAUNCHING,
    TaskState.STARTING,
    TaskState.RUNNING,
)
LAUNCHED = frozenset(
    {TaskState.LAUNCHING, TaskState.LAUNCHED, TaskState.STARTING, TaskState.RUNNING}
)


@dataclass(frozen=True)
class Settings:
    tasks: int
    hosts: int
    racks: int
    max_gang: int
    callers: int
    repeats: int
    seed: int


def gang_sizes(total: int, max_gang: int, seed: int) -> list[int]:
    """Seeded gang sizes, uniform in 1..max_gang, adding up to exactly ``total``."""
    rng = random.Random(seed)
    sizes: list[int] = []
    left = total
    while left:
        size = min(left, rng.randint(1, max_gang))
        sizes.append(size)
        left -= size
    return sizes


def job_spec(index: int, size: int) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name=f"e2e-{index}",
        instances=size,
        task=job_pb2.TaskSpec(
            command="python train.py",
            resources=common_pb2.Resources(cpu=2.0, mem_mb=8192.0, gpu=1.0),
        ),
    )


# ---------------------------------------------------------------------------- processes


class Cluster:
    """``peloton minicluster up --simulated`` in its own process, on a free port."""

    def __init__(self, workdir: Path, hosts: int, racks: int) -> None:
        self.workdir = workdir
        self.hosts = hosts
        self.racks = racks
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    @property
    def pid(self) -> int:
        assert self.proc is not None, "minicluster not started"
        return self.proc.pid

    def start(self) -> None:
        agents = [
            {
                "hostname": f"host-{i:05d}",
                "resources": HOST_RESOURCES,
                # Contiguous racks, as hosts are numbered in a data centre.
                "attributes": f"rack:r{i * self.racks // self.hosts};gpu_model:A100",
            }
            for i in range(self.hosts)
        ]
        agents_file = self.workdir / "agents.yaml"
        agents_file.write_text(yaml.safe_dump(agents))
        cmd = [
            str(PELOTON),
            "minicluster",
            "up",
            "--simulated",
            "--port",
            "0",
            "--agents-file",
            str(agents_file),
            "--log-level",
            "warning",
        ]
        with (self.workdir / "minicluster.log").open("ab") as err:
            self.proc = subprocess.Popen(
                dies_with_us(cmd),
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
            )
        assert self.proc.stdout is not None
        # "minicluster master at 127.0.0.1:PORT with N agents (simulated)"
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline().decode() if ready else ""
        if " at " not in line:
            self.stop()
            raise RuntimeError(f"minicluster did not start: {line!r}")
        self.address = line.split(" at ", 1)[1].split()[0]

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _wait(check: Any, timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def _gpu_capacity(client: PelotonClient) -> float:
    status = client.get_pool("/").status.get("gpu")
    return status.reservation if status is not None else 0.0


# ---------------------------------------------------------------------------- one run


def _counts(engine: Engine) -> dict[TaskState, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT state, count(*) FROM tasks GROUP BY state"))
        return {TaskState(s): int(n) for s, n in rows}


def _check_history(engine: Engine, cfg: Settings, jobs: int) -> list[str]:
    """What is wrong with the persisted history of a finished run (empty: nothing)."""
    problems = []
    with engine.connect() as conn:
        per_task = conn.execute(
            text(
                "SELECT count(*), count(DISTINCT job_id || '/' || instance_id) FROM job_events "
                "WHERE instance_id IS NOT NULL"
            )
        ).one()
        chain = conn.execute(
            text(
                "SELECT from_state, to_state, count(*) FROM job_events "
                "WHERE instance_id IS NOT NULL GROUP BY from_state, to_state"
            )
        ).all()
        job_states: dict[str, int] = {
            s: n for s, n in conn.execute(text("SELECT state, count(*) FROM jobs GROUP BY state"))
        }
    expected = len(PATH_TO_RUNNING) * cfg.tasks
    if per_task[0] != expected or per_task[1] != cfg.tasks:
        problems.append(
            f"{per_task[0]} task events for {per_task[1]} tasks, expected {expected} for "
            f"{cfg.tasks}"
        )
    steps = {(a, b): n for a, b, n in chain}
    previous = TaskState.PENDING
    for state in PATH_TO_RUNNING:
        if steps.get((previous.value, state.value)) != cfg.tasks:
            problems.append(
                f"{steps.get((previous.value, state.value), 0)} events "
                f"{previous.value} -> {state.value}, expected {cfg.tasks}"
            )
        previous = state
    if job_states != {"RUNNING": jobs}:
        problems.append(f"jobs by state {job_states}, expected {jobs} RUNNING")
    return problems


# Starts the daemons of a run on its database and master, appending each to the list before
# starting it (so that it is stopped, whatever happens); the first one appended schedules.
DaemonStarter = Callable[[str, Path, str, list[Daemon]], None]


def one_daemon(url: str, workdir: Path, master: str, daemons: list[Daemon]) -> None:
    """The only daemon (no daemon id: always the leader)."""
    daemon = Daemon(url, workdir, ["--mesos-master", master])
    daemons.append(daemon)
    daemon.start()


def run_once(
    backend: str,
    cfg: Settings,
    run: int,
    start_daemons: DaemonStarter = one_daemon,
    migrate: Callable[[str, Path], None] = migrate_db,
) -> dict[str, Any]:
    """One run: a fresh database migrated by ``migrate``, a minicluster, the daemons
    ``start_daemons`` starts, and ``cfg.tasks`` tasks submitted over every daemon's API."""
    sizes = gang_sizes(cfg.tasks, cfg.max_gang, cfg.seed + run)
    specs = [job_spec(i, size) for i, size in enumerate(sizes)]
    with (
        tempfile.TemporaryDirectory(prefix=f"peloton-e2e-{backend}-") as tmp,
        database(backend, Path(tmp)) as url,
    ):
        workdir = Path(tmp)
        migrate(url, workdir)
        cluster = Cluster(workdir, cfg.hosts, cfg.racks)
        daemons: list[Daemon] = []
        engine = make_engine(url, pool_size=1)
        try:
            cluster.start()
            start_daemons(url, workdir, cluster.address, daemons)
            with contextlib.ExitStack() as stack:
                clients = [
                    stack.enter_context(PelotonClient(d.target, timeout=120)) for d in daemons
                ]
                capacity = cfg.hosts * GPUS_PER_HOST
                _wait(
                    lambda: _gpu_capacity(clients[0]) >= capacity,
                    START_TIMEOUT_S,
                    f"the daemon to see {capacity} GPUs",
                )
                pids = [d.pid for d in daemons]
                result = _measure(engine, clients, specs, cfg, pids, cluster.pid)
            problems = _check_history(engine, cfg, len(specs))
            result["problems"] = problems
            result["jobs"] = len(specs)
        except Exception:
            for daemon in daemons:
                log(f"{backend}: run failed; the daemon's log ends with:\n{daemon.tail()}")
            raise
        finally:
            engine.dispose()
            for daemon in daemons:
                daemon.stop()
            cluster.stop()
    return result


def _measure(
    engine: Engine,
    clients: Sequence[PelotonClient],
    specs: Sequence[job_pb2.JobSpec],
    cfg: Settings,
    daemon_pids: Sequence[int],
    cluster_pid: int,
) -> dict[str, Any]:
    """Submit ``specs`` (job i through ``clients[i % len(clients)]``) and time them to RUNNING."""
    pg = _postgres_pids()
    pids = [*daemon_pids, cluster_pid]
    cpu0 = [_cpu_seconds([p]) for p in pids] + [_cpu_seconds(pg), time.process_time()]
    submitted: list[float] = []

    def create(index: int) -> job_pb2.Job:
        return clients[index % len(clients)].create_job(specs[index])

    def submit() -> None:
        with ThreadPoolExecutor(cfg.callers, thread_name_prefix="submit") as callers:
            for job in callers.map(create, range(len(specs))):
                if job.state != job_pb2.JOB_STATE_PENDING:
                    raise RuntimeError(f"job {job.job_id} created as {job.state}")
        submitted.append(time.perf_counter() - start)

    start = time.perf_counter()
    submitter = threading.Thread(target=submit, name="submitter")
    submitter.start()
    marks: dict[str, float] = {}
    deadline = start + RUN_TIMEOUT_S
    counts: dict[TaskState, int] = {}
    while "running" not in marks:
        time.sleep(POLL_SECONDS)
        counts = _counts(engine)
        now = time.perf_counter() - start
        stored = sum(counts.values())
        if stored == cfg.tasks:
            if "admitted" not in marks and not counts.get(TaskState.PENDING):
                marks["admitted"] = now
            if "launched" not in marks and sum(counts.get(s, 0) for s in LAUNCHED) == cfg.tasks:
                marks["launched"] = now
            if counts.get(TaskState.RUNNING) == cfg.tasks:
                marks["running"] = now
        if time.perf_counter() > deadline:
            raise RuntimeError(f"not every task RUNNING after {RUN_TIMEOUT_S:g} s: {counts}")
    submitter.join()
    cpu1 = [_cpu_seconds([p]) for p in pids] + [_cpu_seconds(pg), time.process_time()]
    cpu = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
    daemons = len(daemon_pids)
    cpu_s = {"daemon": sum(cpu[:daemons])}
    if daemons > 1:  # each daemon's too, in the order started (the first schedules)
        cpu_s.update({f"daemon {i + 1}": c for i, c in enumerate(cpu[:daemons])})
    cpu_s.update(minicluster=cpu[daemons], postgres=cpu[daemons + 1], bench=cpu[daemons + 2])
    wall = marks["running"]
    return {
        "submitted_s": submitted[0] if submitted else float("nan"),
        "admitted_s": marks.get("admitted", wall),
        "launched_s": marks.get("launched", wall),
        "running_s": wall,
        "tasks_per_s": cfg.tasks / wall,
        "cpu_s": cpu_s,
    }


# ---------------------------------------------------------------------------- report


def run_backend(backend: str, cfg: Settings) -> dict[str, Any]:
    runs = []
    for r in range(cfg.repeats):
        result = run_once(backend, cfg, r)
        cpu = result["cpu_s"]
        log(
            f"{backend} run {r + 1}/{cfg.repeats}: {cfg.tasks} tasks in {result['jobs']} gangs: "
            f"submitted {result['submitted_s']:.2f} s, admitted {result['admitted_s']:.2f} s, "
            f"launched {result['launched_s']:.2f} s, RUNNING {result['running_s']:.2f} s = "
            f"{result['tasks_per_s']:.0f} tasks/s; CPU s: "
            + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
            + ("" if not result["problems"] else f"; PROBLEMS: {result['problems']}")
        )
        runs.append(result)
    keys = ("submitted_s", "admitted_s", "launched_s", "running_s", "tasks_per_s")
    median = {k: statistics.median(r[k] for r in runs) for k in keys}
    median["cpu_s"] = {
        who: statistics.median(r["cpu_s"][who] for r in runs) for who in runs[0]["cpu_s"]
    }
    return {"runs": runs, "median": median}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_e2e", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--backend", choices=("postgresql", "sqlite", "both"), default="both")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--hosts", type=int, default=1_250, help="agents of 8 GPUs each")
    parser.add_argument("--racks", type=int, default=2)
    parser.add_argument("--max-gang", type=int, default=64, help="gang sizes are 1..this")
    parser.add_argument("--callers", type=int, default=4, help="concurrent CreateJob callers")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument(
        "--check", action="store_true", help="one small PostgreSQL run (1,000 tasks), must pass"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.check:
        args.tasks, args.hosts, args.repeats, args.backend = 1_000, 160, 1, "postgresql"
    if args.hosts * GPUS_PER_HOST < args.tasks:
        parser.error(f"{args.hosts} hosts have fewer than {args.tasks} GPUs")
    cfg = Settings(
        args.tasks, args.hosts, args.racks, args.max_gang, args.callers, args.repeats, args.seed
    )
    backends = ("postgresql", "sqlite") if args.backend == "both" else (args.backend,)
    steal0, calibration = _cpu_steal(), cpu_calibration_ms()
    report: dict[str, Any] = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "bench.bench_e2e", *(argv or sys.argv[1:])]),
        "machine": machine(),
        "settings": cfg.__dict__,
        "backends": {b: run_backend(b, cfg) for b in backends},
    }
    steal1 = _cpu_steal()
    total = steal1[1] - steal0[1]
    report["cpu_steal_pct"] = 100.0 * (steal1[0] - steal0[0]) / total if total > 0 else 0.0
    report["cpu_calibration_ms"] = [calibration, cpu_calibration_ms()]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"\nsubmission to RUNNING, {cfg.tasks:,} one-GPU tasks in gangs of 1-{cfg.max_gang}, "
        f"{cfg.hosts:,} hosts x {GPUS_PER_HOST} GPUs in {cfg.racks} racks; median of "
        f"{cfg.repeats}; CPU steal {report['cpu_steal_pct']:.0f}%, calibration loop "
        + "/".join(f"{c:.1f}" for c in report["cpu_calibration_ms"])
        + " ms (before/after)"
    )
    print(
        f"{'backend':<11} {'tasks/s':>8} {'RUNNING s':>10} {'admitted s':>11} "
        f"{'launched s':>11} {'submitted s':>12}  runs (tasks/s)"
    )
    failed = False
    for backend, result in report["backends"].items():
        m = result["median"]
        runs = " ".join(f"{r['tasks_per_s']:.0f}" for r in result["runs"])
        print(
            f"{backend:<11} {m['tasks_per_s']:>8.0f} {m['running_s']:>10.2f} "
            f"{m['admitted_s']:>11.2f} {m['launched_s']:>11.2f} {m['submitted_s']:>12.2f}  {runs}"
        )
        cpu = m["cpu_s"]
        print("            CPU s: " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()))
        for r in result["runs"]:
            for problem in r["problems"]:
                failed = True
                print(f"            PROBLEM: {problem}")
    print(f"results written to {args.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
