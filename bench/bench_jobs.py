"""Job API benchmark against a real peloton daemon on PostgreSQL and on SQLite.

Run from the repository root::

    .venv/bin/python -m bench.bench_jobs [--backend sqlite|postgresql|both] [--repeats N] [--quick]

For each backend it creates a throwaway database, migrates it with ``peloton db upgrade``, starts
``peloton server`` as a separate process and measures, over gRPC:

* CreateJob latency (p50/p99) and throughput of 8 concurrent callers creating 1-task jobs. The
  callers run in separate processes (4 processes x 2 threads by default, each process with its own
  channel, warmed up first) so they never compete for the daemon's GIL. The same latency with a
  single caller is measured too, and the CPU time per job of the daemon, of PostgreSQL and of the
  callers (from /proc), since all of them share the machine;
* the wall time of one CreateJob of a 10,000-task job and of a 100,000-task job;
* ListJobs latency (pages of 100, newest first: page 1, page 2 via the token, a state filter and a
  label filter) with 100,000 jobs stored. The jobs missing to that number are bulk-inserted by
  this process through the storage layer (the rows CreateJob writes: job, labels, 1-4 tasks, one
  event); 1% of them are then killed through the job manager so that the state filter selects
  something, and PostgreSQL gets the VACUUM ANALYZE autovacuum would give it. Page 1 holds the
  big jobs created before, page 2 only small ones.

Every measurement is repeated ``--repeats`` times (default 3) and the tables show the median of
the runs; ``--quick`` is a smoke test (fewer calls, 10,000 stored jobs, one run). The results
also go to ``.bench/bench_jobs.json``. The daemon and the client processes are always stopped,
and the PostgreSQL database dropped, even when a step fails or the run is interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from queue import Empty
from types import FrameType
from typing import Any

import grpc
import psycopg2
import sqlalchemy
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url

from bench._client_worker import create_worker, job_spec
from peloton.client import PelotonClient
from peloton.core import spec as specs
from peloton.core.states import JobState, TaskState
from peloton.jobmgr.manager import JobManager
from peloton.storage import jobs as repo
from peloton.storage.db import Database
from peloton.storage.models import JobRow
from peloton.v1 import job_pb2, job_pb2_grpc, pool_pb2

REPO = Path(__file__).resolve().parents[1]
PELOTON = Path(sys.executable).with_name("peloton")
RESULTS = REPO / ".bench" / "bench_jobs.json"
PG_ADMIN_URL = os.environ.get(
    "PELOTON_BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
BACKENDS = ("postgresql", "sqlite")
DAEMON_START_DEADLINE_S = 60.0
DAEMON_STOP_DEADLINE_S = 30.0
BIG_JOB_TIMEOUT_S = 600.0


# ---------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    repeats: int
    create_jobs: int  # measured CreateJob calls per repeat, over all callers
    procs: int  # client processes
    threads: int  # callers per client process
    warmup: int  # warm-up calls per caller
    big_jobs: tuple[int, ...]  # task counts of the single big CreateJob calls
    stored_jobs: int  # jobs in the database while ListJobs is measured
    killed_every: int  # every n-th filled job is killed (the state filter selects them)
    list_calls: int  # timed ListJobs calls per variant and repeat
    list_warmup: int


def settings(args: argparse.Namespace) -> Settings:
    if args.quick:
        base = Settings(
            repeats=1,
            create_jobs=800,
            procs=args.procs,
            threads=args.callers // args.procs,
            warmup=10,
            big_jobs=(10_000, 100_000),
            stored_jobs=10_000,
            killed_every=100,
            list_calls=50,
            list_warmup=5,
        )
    else:
        base = Settings(
            repeats=3,
            create_jobs=4_000,
            procs=args.procs,
            threads=args.callers // args.procs,
            warmup=25,
            big_jobs=(10_000, 100_000),
            stored_jobs=100_000,
            killed_every=100,
            list_calls=200,
            list_warmup=10,
        )
    overrides: dict[str, Any] = {}
    if args.repeats is not None:
        overrides["repeats"] = args.repeats
    if args.create_jobs is not None:
        overrides["create_jobs"] = args.create_jobs
    if args.stored_jobs is not None:
        overrides["stored_jobs"] = args.stored_jobs
    return Settings(**{**base.__dict__, **overrides})


# ---------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    # ("<=", x) or (">=", x): the PostgreSQL target; None: reported only.
    target: tuple[str, float] | None = None


METRICS = (
    Metric("create_p50_ms", "CreateJob 1 task, {callers} callers, p50", "ms", ("<=", 5.0)),
    Metric("create_p99_ms", "CreateJob 1 task, {callers} callers, p99", "ms"),
    Metric("create_jobs_per_s", "CreateJob throughput, {callers} callers", "jobs/s", (">=", 500)),
    # The same call with nobody else waiting: the latency under 8 callers is mostly queueing
    # (8 callers / throughput, by Little's law). Shown against the same 5 ms for reference.
    Metric("create1_p50_ms", "CreateJob 1 task, 1 caller, p50", "ms", ("<=", 5.0)),
    Metric("create1_p99_ms", "CreateJob 1 task, 1 caller, p99", "ms"),
    Metric("create_10000_tasks_s", "CreateJob 10,000-task job", "s", ("<=", 2.0)),
    Metric("create_100000_tasks_s", "CreateJob 100,000-task job", "s"),
    # The newest page holds the big jobs created above: their tasks are counted for it.
    Metric("list_page1_p50_ms", "ListJobs page 1 (has the big jobs), p50", "ms", ("<=", 20.0)),
    Metric("list_page1_p99_ms", "ListJobs page 1 (has the big jobs), p99", "ms"),
    Metric("list_page2_p50_ms", "ListJobs page 2 (token), p50", "ms", ("<=", 20.0)),
    Metric("list_page2_p99_ms", "ListJobs page 2 (token), p99", "ms"),
    Metric("list_state_p50_ms", "ListJobs state=KILLED (1%), p50", "ms", ("<=", 20.0)),
    Metric("list_state_p99_ms", "ListJobs state=KILLED (1%), p99", "ms"),
    Metric("list_label_p50_ms", "ListJobs label team=team-3 (10%), p50", "ms", ("<=", 20.0)),
    Metric("list_label_p99_ms", "ListJobs label team=team-3 (10%), p99", "ms"),
)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = min(max(1, math.ceil(q / 100 * len(ordered))), len(ordered))
    return ordered[rank - 1]


def check(metric: Metric, value: float) -> bool | None:
    if metric.target is None:
        return None
    op, bound = metric.target
    return value <= bound if op == "<=" else value >= bound


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------- processes


def _load_prctl() -> Any:
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    return None


# Resolved here, not in the forked child, where loading a library could deadlock.
_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the benchmark process dies (Linux). Only for a
    process without gRPC channels: see :func:`dies_with_us`."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def dies_with_us(cmd: Sequence[str]) -> list[str]:
    """``cmd`` run so that it gets SIGTERM if the benchmark process dies (util-linux setpriv,
    where there is one). Not a preexec_fn: with one, subprocess forks instead of vforking, and
    gRPC's fork handlers, in a process that ever had a channel, restart its poller in the child,
    whose epoll descriptor the close of inherited descriptors then takes away: the child
    aborted ('epoll_wait error: Bad file descriptor') before it could run the daemon."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", *cmd] if setpriv else list(cmd)


class Daemon:
    """``peloton server`` on a database, in its own process, on free ports (``args``: more
    options, e.g. ``--mesos-master``)."""

    def __init__(self, url: str, workdir: Path, args: Sequence[str] = ()) -> None:
        self.url = url
        self.workdir = workdir
        self.args = list(args)
        self.log_path = workdir / "server.log"
        self.port_file = workdir / "ports"
        self.proc: subprocess.Popen[bytes] | None = None
        self.grpc_port = 0
        self.console_port = 0  # 0 where the port file names none (the console is off)

    @property
    def pid(self) -> int:
        assert self.proc is not None, "daemon not started"
        return self.proc.pid

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> None:
        self.port_file.unlink(missing_ok=True)
        cmd = [
            str(PELOTON),
            "server",
            "--db-url",
            self.url,
            "--data-dir",
            str(self.workdir / "data"),
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            "--port-file",
            str(self.port_file),
            "--log-level",
            "warning",
            *self.args,
        ]
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                dies_with_us(cmd),
                cwd=REPO,
                # The console on a free port (several daemons run at once), by environment
                # rather than flag: an earlier commit's daemon (bench_ha) has no such option.
                env={**os.environ, "PELOTON_CONSOLE_PORT": "0"},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches us; we stop it in order
            )
        deadline = time.monotonic() + DAEMON_START_DEADLINE_S
        while True:
            if self.port_file.exists():
                text_ = self.port_file.read_text().split()
                if text_:
                    self.grpc_port = int(text_[0])
                    # "grpc metrics console": the console's where the daemon serves one.
                    self.console_port = int(text_[2]) if len(text_) > 2 else 0
                    break
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"peloton server exited with {self.proc.returncode}:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"peloton server did not write {self.port_file} within "
                    f"{DAEMON_START_DEADLINE_S:.0f}s:\n{self.tail()}"
                )
            time.sleep(0.05)
        with grpc.insecure_channel(self.target) as channel:
            grpc.channel_ready_future(channel).result(timeout=DAEMON_START_DEADLINE_S)
        log(f"daemon pid {self.proc.pid} serving on {self.target}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=DAEMON_STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            log(f"daemon pid {proc.pid} ignored SIGTERM for {DAEMON_STOP_DEADLINE_S:.0f}s; killing")
            proc.kill()
            proc.wait()
        if proc.returncode not in (0, -signal.SIGTERM):
            log(f"daemon exited with {proc.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


# The leaf pools the benchmark's jobs go to (jobs run only in leaf pools, which must exist).
BENCH_POOLS = ("/bench", "/bench/create", "/bench/big", *(f"/bench/p{i}" for i in range(5)))


def create_pools(target: str) -> None:
    """The benchmark's pool tree, parents first, without reservations."""
    with PelotonClient(target, timeout=30) as client:
        for path in BENCH_POOLS:
            client.create_pool(pool_pb2.PoolSpec(path=path))


def migrate_db(url: str, workdir: Path) -> None:
    cmd = [str(PELOTON), "db", "upgrade", "--db-url", url, "--data-dir", str(workdir / "data")]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"peloton db upgrade failed ({done.returncode}):\n{done.stderr}")


def _pg_admin() -> Any:
    url = make_url(PG_ADMIN_URL)
    conn = psycopg2.connect(
        host=url.host,
        port=url.port or 5432,
        user=url.username,
        password=url.password,
        dbname=url.database or "postgres",
        connect_timeout=5,
    )
    conn.autocommit = True
    return conn


@contextlib.contextmanager
def database(backend: str, workdir: Path) -> Iterator[str]:
    """A throwaway database URL for ``backend``; a PostgreSQL database is dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{workdir / 'bench.db'}"
        return
    name = f"peloton_bench_{uuid.uuid4().hex[:12]}"
    admin = _pg_admin()
    try:
        with admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        try:
            yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.cursor() as cur:
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            log(f"dropped database {name}")
    finally:
        admin.close()


# ---------------------------------------------------------------------------- CreateJob


def measure_create(
    target: str, procs: int, threads: int, jobs: int, warmup: int, tag: str, server_pid: int
) -> dict[str, float]:
    """CreateJob p50/p99 and throughput of ``procs x threads`` callers in client processes,
    with the CPU time per job of the callers, the daemon and PostgreSQL (all its processes)."""
    per_caller = max(1, jobs // (procs * threads))
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    queue: Any = ctx.Queue()
    workers = [
        ctx.Process(
            target=create_worker,
            args=(target, w, threads, warmup, per_caller, tag, go, queue),
            daemon=True,
            name=f"bench-client-{w}",
        )
        for w in range(procs)
    ]
    try:
        for p in workers:
            p.start()
        _collect(queue, workers, "ready", deadline_s=300)
        cpu_before = (_cpu_seconds([server_pid]), _cpu_seconds(_postgres_pids()))
        go.set()
        reports = _collect(queue, workers, "ok", deadline_s=1800)
        cpu_after = (_cpu_seconds([server_pid]), _cpu_seconds(_postgres_pids()))
        for p in workers:
            p.join(timeout=30)
    finally:
        for p in workers:
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        queue.close()
    runs: list[tuple[float, float, list[float]]] = [run for r, _ in reports for run in r]
    latencies = [x for _, _, lat in runs for x in lat]
    wall = max(end for _, end, _ in runs) - min(start for start, _, _ in runs)
    n = len(latencies)
    return {
        "create_p50_ms": percentile(latencies, 50) * 1e3,
        "create_p99_ms": percentile(latencies, 99) * 1e3,
        "create_jobs_per_s": n / wall,
        "create_jobs": float(n),
        "create_wall_s": wall,
        "cpu_ms_per_job_clients": sum(cpu for _, cpu in reports) / n * 1e3,
        "cpu_ms_per_job_daemon": (cpu_after[0] - cpu_before[0]) / n * 1e3,
        # Every postgres process on the machine (0 where /proc does not show them).
        "cpu_ms_per_job_postgres": (cpu_after[1] - cpu_before[1]) / n * 1e3,
    }


def _cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time of processes (and their reaped children), from /proc."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15]) / tick
    return total


def cpu_calibration_ms() -> float:
    """Milliseconds for a fixed pure-Python loop (median of 5): how fast this machine is now."""
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        sum(i * i for i in range(300_000))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _cpu_steal() -> tuple[int, int]:
    """(steal, total) jiffies of the machine so far: time a hypervisor gave our vCPUs to others."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return fields[7], sum(fields[:8])
    return 0, 0


def _postgres_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
    return pids


def _collect(queue: Any, workers: Sequence[Any], expect: str, deadline_s: float) -> list[Any]:
    """One ``expect`` report from every worker; fail fast if one errs, dies or is late."""
    reports: dict[int, Any] = {}
    deadline = time.monotonic() + deadline_s
    while len(reports) < len(workers):
        try:
            status, worker, payload = queue.get(timeout=0.5)
        except Empty:
            for p in workers:
                if p.exitcode is not None and p.exitcode != 0:
                    raise RuntimeError(f"{p.name} exited with {p.exitcode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"client processes not {expect} in {deadline_s:.0f} s") from None
            continue
        if status != expect:
            raise RuntimeError(f"client process {worker} failed:\n{payload}")
        reports[worker] = payload
    return [reports[w] for w in sorted(reports)]


def measure_big_job(target: str, instances: int, tag: str) -> float:
    """Wall time of one CreateJob of an ``instances``-task job, as the client sees it."""
    with grpc.insecure_channel(
        target, options=[("grpc.max_receive_message_length", 64 << 20)]
    ) as channel:
        stub = job_pb2_grpc.JobServiceStub(channel)
        request = job_pb2.CreateJobRequest(
            spec=job_spec(f"big-{instances}-{tag}", instances=instances, pool="/bench/big")
        )
        t0 = time.perf_counter()
        response = stub.CreateJob(request, timeout=BIG_JOB_TIMEOUT_S)
        elapsed = time.perf_counter() - t0
    counts = {c.state: c.count for c in response.job.task_states}
    if counts.get(job_pb2.TASK_STATE_PENDING) != instances:
        raise RuntimeError(f"big job has task counts {counts}, expected {instances} PENDING")
    return elapsed


# ---------------------------------------------------------------------------- filling


class _RowCapture:
    """Stands in for the Session given to ``repo.insert_job``: keeps the rows of its
    ``INSERT INTO table VALUES`` statements, per table, instead of sending them."""

    def __init__(self) -> None:
        self.rows: dict[Any, list[dict[str, Any]]] = {}

    def execute(self, statement: Any, params: Any = None) -> None:
        table = getattr(statement, "table", None)
        if not isinstance(statement, sqlalchemy.Insert) or table is None or params is None:
            raise RuntimeError(f"the bulk fill cannot replay {statement!r}; update bench_jobs")
        if getattr(statement, "select", None) is not None:
            raise RuntimeError("the bulk fill cannot replay INSERT ... SELECT; use <= 100 tasks")
        self.rows.setdefault(table, []).extend(params if isinstance(params, list) else [params])


def fill_jobs(url: str, count: int, killed_every: int, chunk: int = 2_000) -> dict[str, float]:
    """Store ``count`` more jobs with the rows CreateJob writes, bulk-inserted, then kill every
    ``killed_every``-th of them through the job manager (a real kill: tasks, events, job state).

    Job ``i`` has 1-4 tasks, labels team=team-<i%10> and bench=fill, and a distinct creation time
    (older than now), so newest-first paging walks a realistic index."""
    db = Database.from_url(url)
    t0 = time.perf_counter()
    to_kill: list[str] = []
    try:
        base = datetime.now(UTC) - timedelta(milliseconds=count + 60_000)
        for start in range(0, count, chunk):
            capture = _RowCapture()
            for i in range(start, min(start + chunk, count)):
                job_id = str(uuid.uuid4())
                raw = job_spec(f"fill-{i}", instances=1 + i % 4, team=i, pool=f"/bench/p{i % 5}")
                raw.labels["bench"] = "fill"
                spec = specs.with_defaults(raw)
                specs.validate_job_spec(spec)
                # The rows CreateJob writes, made by the code that writes them, kept for a
                # bulk insert per table below.
                repo.insert_job(
                    capture,  # type: ignore[arg-type]
                    job_id=job_id,
                    spec=spec,
                    request_id=None,
                    now=base + timedelta(milliseconds=i),
                    task_state=TaskState.PENDING,
                    job_state=JobState.PENDING,
                )
                if killed_every and i % killed_every == killed_every // 2:
                    to_kill.append(job_id)
            with db.writing() as session:
                for table, rows in capture.rows.items():  # in insert order: parents first
                    session.execute(sqlalchemy.insert(table), rows)
        inserted = time.perf_counter()
        manager = JobManager(db)
        for job_id in to_kill:
            manager.kill_job(job_id, "benchmark")
        killed = time.perf_counter()
        if db.dialect == "postgresql":
            # What autovacuum does soon after a bulk load (PostgreSQL 13+ vacuums after inserts
            # too): statistics for the planner and a visibility map for index-only scans.
            with db.engine.connect() as conn:
                auto = conn.execution_options(isolation_level="AUTOCOMMIT")
                auto.execute(text("VACUUM ANALYZE"))
                # Write the load out now rather than while ListJobs is measured (superuser only).
                with contextlib.suppress(sqlalchemy.exc.DBAPIError):
                    auto.execute(text("CHECKPOINT"))
        with db.reading() as session:
            total = session.scalar(select(func.count()).select_from(JobRow)) or 0
    finally:
        db.dispose()
    return {
        "fill_jobs": float(count),
        "fill_insert_s": inserted - t0,
        "fill_killed": float(len(to_kill)),
        "fill_kill_s": killed - inserted,
        "stored_jobs": float(total),
    }


def stored_jobs(url: str) -> int:
    db = Database.from_url(url)
    try:
        with db.reading() as session:
            return int(session.scalar(select(func.count()).select_from(JobRow)) or 0)
    finally:
        db.dispose()


# ---------------------------------------------------------------------------- ListJobs


def _time_calls(call: Callable[[], Any], calls: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        call()
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


def measure_list(target: str, cfg: Settings) -> dict[str, float]:
    """ListJobs latency (pages of 100) for the unfiltered first and second page and two filters."""
    out: dict[str, float] = {}
    with grpc.insecure_channel(target) as channel:
        stub = job_pb2_grpc.JobServiceStub(channel)

        def lister(request: Any) -> Callable[[], Any]:
            # Every variant must return jobs; all but the 1% state filter a full page.
            first = stub.ListJobs(request, timeout=60)
            full = not request.states
            if not first.jobs or (full and (len(first.jobs) != 100 or not first.next_page_token)):
                raise RuntimeError(f"ListJobs {request} returned {len(first.jobs)} jobs")
            return lambda: stub.ListJobs(request, timeout=60)

        page1 = job_pb2.ListJobsRequest(page_size=100)
        token = stub.ListJobs(page1, timeout=60).next_page_token
        variants = {
            "page1": page1,
            "page2": job_pb2.ListJobsRequest(page_size=100, page_token=token),
            "state": job_pb2.ListJobsRequest(page_size=100, states=[job_pb2.JOB_STATE_KILLED]),
            "label": job_pb2.ListJobsRequest(page_size=100, labels={"team": "team-3"}),
        }
        for name, request in variants.items():
            latencies = _time_calls(lister(request), cfg.list_calls, cfg.list_warmup)
            out[f"list_{name}_p50_ms"] = percentile(latencies, 50) * 1e3
            out[f"list_{name}_p99_ms"] = percentile(latencies, 99) * 1e3
    return out


# ---------------------------------------------------------------------------- one backend


def run_backend(backend: str, cfg: Settings, run_id: str) -> dict[str, Any]:
    runs: dict[str, list[float]] = {}
    info: dict[str, Any] = {}

    def record(values: dict[str, float]) -> None:
        for k, v in values.items():
            runs.setdefault(k, []).append(v)

    steal_before = _cpu_steal()
    calibration = cpu_calibration_ms()

    with (
        tempfile.TemporaryDirectory(prefix=f"peloton-bench-{backend}-") as tmp,
        database(backend, Path(tmp)) as url,
    ):
        workdir = Path(tmp)
        log(f"{backend}: migrating {make_url(url).render_as_string(hide_password=True)}")
        migrate_db(url, workdir)
        daemon = Daemon(url, workdir)
        try:
            daemon.start()
            create_pools(daemon.target)
            callers = cfg.procs * cfg.threads
            for r in range(cfg.repeats):
                values = measure_create(
                    daemon.target,
                    cfg.procs,
                    cfg.threads,
                    cfg.create_jobs,
                    cfg.warmup,
                    f"{r}",
                    daemon.pid,
                )
                log(
                    f"{backend}: CreateJob, {callers} callers, run {r + 1}/{cfg.repeats}: "
                    f"{values['create_jobs']:.0f} jobs, p50 {values['create_p50_ms']:.2f} ms, "
                    f"p99 {values['create_p99_ms']:.2f} ms, "
                    f"{values['create_jobs_per_s']:.0f} jobs/s; CPU per job: "
                    f"daemon {values['cpu_ms_per_job_daemon']:.2f} ms, "
                    f"postgres {values['cpu_ms_per_job_postgres']:.2f} ms, "
                    f"callers {values['cpu_ms_per_job_clients']:.2f} ms"
                )
                record(values)
                single = measure_create(
                    daemon.target, 1, 1, cfg.create_jobs // 4, cfg.warmup, f"{r}-1", daemon.pid
                )
                log(
                    f"{backend}: CreateJob, 1 caller, run {r + 1}/{cfg.repeats}: "
                    f"{single['create_jobs']:.0f} jobs, p50 {single['create_p50_ms']:.2f} ms, "
                    f"p99 {single['create_p99_ms']:.2f} ms; CPU per job: "
                    f"daemon {single['cpu_ms_per_job_daemon']:.2f} ms"
                )
                record(
                    {
                        "create1_p50_ms": single["create_p50_ms"],
                        "create1_p99_ms": single["create_p99_ms"],
                        "cpu1_ms_per_job_daemon": single["cpu_ms_per_job_daemon"],
                    }
                )
            for r in range(cfg.repeats):
                for n in cfg.big_jobs:
                    seconds = measure_big_job(daemon.target, n, f"{run_id}-r{r}")
                    log(
                        f"{backend}: CreateJob of {n:,} tasks, "
                        f"run {r + 1}/{cfg.repeats}: {seconds:.2f} s"
                    )
                    record({f"create_{n}_tasks_s": seconds})
            existing = stored_jobs(url)
            missing = max(0, cfg.stored_jobs - existing)
            log(f"{backend}: storing {missing:,} more jobs (have {existing:,})")
            filled = fill_jobs(url, missing, cfg.killed_every)
            info.update(filled)
            log(
                f"{backend}: stored {filled['stored_jobs']:,.0f} jobs "
                f"(bulk insert {filled['fill_insert_s']:.1f} s, "
                f"{filled['fill_killed']:.0f} kills {filled['fill_kill_s']:.1f} s)"
            )
            for r in range(cfg.repeats):
                values = measure_list(daemon.target, cfg)
                log(
                    f"{backend}: ListJobs run {r + 1}/{cfg.repeats}: "
                    + ", ".join(f"{k.removeprefix('list_')} {v:.2f}" for k, v in values.items())
                    + " ms"
                )
                record(values)
        except Exception:
            log(f"{backend}: failed; the daemon's log ends with:\n{daemon.tail()}")
            raise
        finally:
            daemon.stop()
    metrics: dict[str, Any] = {}
    for m in METRICS:
        samples = runs.get(m.key)
        if not samples:
            continue
        median = statistics.median(samples)
        metrics[m.key] = {
            "label": m.label.format(callers=cfg.procs * cfg.threads),
            "unit": m.unit,
            "runs": samples,
            "median": median,
            "target": None if m.target is None else {"op": m.target[0], "value": m.target[1]},
            "pass": check(m, median),
        }
    extra = {k: v for k, v in runs.items() if k not in metrics}
    steal_after = _cpu_steal()
    total = steal_after[1] - steal_before[1]
    steal = 100.0 * (steal_after[0] - steal_before[0]) / total if total > 0 else 0.0
    return {
        "metrics": metrics,
        "runs_other": extra,
        "fill": info,
        "cpu_steal_pct": steal,
        "cpu_calibration_ms": [calibration, cpu_calibration_ms()],
    }


# ---------------------------------------------------------------------------- report


def machine() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    pg = ""
    with contextlib.suppress(Exception):
        conn = _pg_admin()
        with conn.cursor() as cur:
            cur.execute("SHOW server_version")
            pg = cur.fetchone()[0]
        conn.close()
    return {
        "nproc": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgresql": pg,
        "sqlite": sqlite3.sqlite_version,
        "sqlalchemy": sqlalchemy.__version__,
        "grpcio": grpc.__version__,
        "loadavg_at_start": os.getloadavg(),
    }


def _fmt(value: float, unit: str) -> str:
    if unit == "jobs/s":
        return f"{value:.0f}"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def print_table(backend: str, result: dict[str, Any], cfg: Settings) -> None:
    metrics = result["metrics"]
    targets_apply = backend == "postgresql"
    print()
    print(
        f"== {backend}: median of {cfg.repeats} run(s); {cfg.procs}x{cfg.threads} callers; "
        f"ListJobs with {result['fill'].get('stored_jobs', 0):,.0f} jobs stored; "
        f"CPU steal {result['cpu_steal_pct']:.0f}%; calibration loop "
        f"{'/'.join(f'{c:.1f}' for c in result['cpu_calibration_ms'])} ms (before/after)"
        + ("" if targets_apply else " (targets are for PostgreSQL; shown in brackets)")
    )
    header = f"{'measurement':<42} {'median':>9} {'unit':<7} {'runs':<22} {'target':<9} result"
    print(header)
    print("-" * len(header))
    for m in METRICS:
        entry = metrics.get(m.key)
        if entry is None:
            continue
        runs = " ".join(_fmt(v, m.unit) for v in entry["runs"])
        target = "" if m.target is None else f"{m.target[0]} {m.target[1]:g}"
        verdict = ""
        if entry["pass"] is not None:
            verdict = "PASS" if entry["pass"] else "FAIL"
            if not targets_apply:
                verdict = f"({verdict.lower()})"
        print(
            f"{entry['label']:<42} {_fmt(entry['median'], m.unit):>9} {m.unit:<7} {runs:<22} "
            f"{target:<9} {verdict}"
        )
    other = result["runs_other"]
    parts = [
        f"{who} {statistics.median(other[key]):.2f} ms"
        for who, key in (
            ("daemon", "cpu_ms_per_job_daemon"),
            ("postgres", "cpu_ms_per_job_postgres"),
            ("callers", "cpu_ms_per_job_clients"),
        )
        if other.get(key) and (who != "postgres" or backend == "postgresql")
    ]
    if parts:
        callers = cfg.procs * cfg.threads
        print(f"CPU per CreateJob with {callers} callers (median): {', '.join(parts)}")
    if other.get("cpu1_ms_per_job_daemon"):
        single = statistics.median(other["cpu1_ms_per_job_daemon"])
        print(f"CPU per CreateJob with 1 caller (median): daemon {single:.2f} ms")


# ---------------------------------------------------------------------------- main


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_jobs", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument(
        "--repeats", type=int, default=None, help="runs per measurement (default 3)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke test: small and one run")
    parser.add_argument("--procs", type=int, default=4, help="client processes (default 4)")
    parser.add_argument("--callers", type=int, default=8, help="concurrent CreateJob callers")
    parser.add_argument("--create-jobs", type=int, default=None, help="CreateJob calls per run")
    parser.add_argument("--stored-jobs", type=int, default=None, help="jobs stored for ListJobs")
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results ({RESULTS})")
    args = parser.parse_args(argv)
    if args.callers % args.procs:
        parser.error("--callers must be a multiple of --procs")
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    cfg = settings(args)
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    signal.signal(signal.SIGTERM, _terminate)

    report: dict[str, Any] = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(
            [Path(sys.executable).name, "-m", "bench.bench_jobs", *(argv or sys.argv[1:])]
        ),
        "machine": machine(),
        "settings": {**cfg.__dict__, "big_jobs": list(cfg.big_jobs)},
        "backends": {},
    }
    run_id = uuid.uuid4().hex[:8]
    started = time.perf_counter()
    for backend in backends:
        report["backends"][backend] = run_backend(backend, cfg, run_id)
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    for backend in backends:
        print_table(backend, report["backends"][backend], cfg)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nresults written to {args.output} ({report['elapsed_s']:.0f} s)")
    failed = [
        k
        for k, v in report["backends"].get("postgresql", {}).get("metrics", {}).items()
        if v["pass"] is False
    ]
    if failed:
        print(f"PostgreSQL targets missed: {', '.join(failed)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted: daemon and callers stopped, database dropped", file=sys.stderr)
        sys.exit(130)
