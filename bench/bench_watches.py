"""Unary API latency while WatchJob streams are open, against a real peloton daemon.

Run from the repository root::

    .venv/bin/python -m bench.bench_watches [--backend sqlite|postgresql|both] [--repeats N]

For each backend it creates a throwaway database, starts ``peloton server`` as a separate process
and creates 10 pending jobs. Then, for 0, 100 and 1,000 open watches (spread over those jobs,
opened by a separate client process, each stream confirmed by its first event), this process
times ``--calls`` sequential calls each of CreateJob (1 task), GetJob and Health and reports
p50/p99, the ratio of each p99 to the one with no watches, and the daemon's threads and resident
memory (from /proc: open streams must cost neither a thread each nor much memory). Every level is
measured ``--repeats`` times (default 3) and the table shows medians. Results also go to
``.bench/bench_watches.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench._client_worker import job_spec
from bench.bench_jobs import BACKENDS, Daemon, database, log, machine, migrate_db, percentile
from peloton.v1 import job_pb2, job_pb2_grpc

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / ".bench" / "bench_watches.json"
LEVELS = (0, 100, 1000)
WATCHED_JOBS = 10
OPEN_DEADLINE_S = 120.0
METHODS = ("CreateJob", "GetJob", "Health")


def _hold_watches(target: str, job_ids: list[str], count: int, ready: Any, done: Any) -> None:
    """In a child process: open ``count`` streams over ``job_ids``, read each one's first event,
    say so on ``ready``, keep them open until ``done`` is set."""
    with grpc.insecure_channel(target) as channel:
        stub = job_pb2_grpc.JobServiceStub(channel)
        streams = [
            stub.WatchJob(job_pb2.WatchJobRequest(job_id=job_ids[i % len(job_ids)]))
            for i in range(count)
        ]
        for stream in streams:
            next(stream)
        ready.set()
        done.wait(OPEN_DEADLINE_S * 10)
        for stream in streams:
            stream.cancel()


def _daemon_status(pid: int) -> dict[str, float]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {
        "threads": float(fields["Threads"].strip()),
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
    }


def _time(call: Callable[[], object], calls: int) -> list[float]:
    for _ in range(10):  # warm-up
        call()
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


def measure_level(daemon: Daemon, job_ids: list[str], watches: int, calls: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(
        target=_hold_watches, args=(daemon.target, job_ids, watches, ready, done), daemon=True
    )
    holder.start()
    try:
        if not ready.wait(OPEN_DEADLINE_S):
            raise RuntimeError(f"{watches} watches not open within {OPEN_DEADLINE_S:.0f}s")
        result = _daemon_status(daemon.pid)
        with grpc.insecure_channel(daemon.target) as channel:
            jobs = job_pb2_grpc.JobServiceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            job_id = job_ids[0]
            timed = {
                "CreateJob": lambda: jobs.CreateJob(
                    job_pb2.CreateJobRequest(spec=job_spec("bench-watch", pool="/default")),
                    timeout=30,
                ),
                "GetJob": lambda: jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=30),
                "Health": lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=30),
            }
            for method, call in timed.items():
                samples = _time(call, calls)
                result[f"{method}_p50_ms"] = percentile(samples, 50) * 1000
                result[f"{method}_p99_ms"] = percentile(samples, 99) * 1000
        return result
    finally:
        done.set()
        holder.join(30)
        if holder.is_alive():
            holder.kill()


def run_backend(backend: str, calls: int, repeats: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="peloton-bench-watches-") as tmp:
        workdir = Path(tmp)
        with database(backend, workdir) as url:
            migrate_db(url, workdir)
            daemon = Daemon(url, workdir)
            daemon.start()
            try:
                with grpc.insecure_channel(daemon.target) as channel:
                    stub = job_pb2_grpc.JobServiceStub(channel)
                    job_ids = [
                        stub.CreateJob(
                            job_pb2.CreateJobRequest(spec=job_spec(f"watched-{i}", pool="/default"))
                        ).job.job_id
                        for i in range(WATCHED_JOBS)
                    ]
                runs: dict[int, list[dict[str, float]]] = {level: [] for level in LEVELS}
                for run in range(repeats):
                    for level in LEVELS:
                        log(f"{backend}: run {run + 1}/{repeats}, {level} open watches")
                        runs[level].append(measure_level(daemon, job_ids, level, calls))
            finally:
                daemon.stop()
    return {
        str(level): {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        for level, rows in runs.items()
    }


def print_table(backend: str, result: dict[str, dict[str, float]]) -> None:
    print(f"\n{backend}: medians of the runs (ms; ratio: p99 / p99 with no watches)")
    header = ["watches", *(f"{m} p50/p99 (x)" for m in METHODS), "threads", "RSS MiB"]
    print(" | ".join(header))
    base = result[str(LEVELS[0])]
    for level in LEVELS:
        row = result[str(level)]
        cells = [str(level)]
        for m in METHODS:
            ratio = row[f"{m}_p99_ms"] / base[f"{m}_p99_ms"]
            cells.append(f"{row[f'{m}_p50_ms']:.2f}/{row[f'{m}_p99_ms']:.2f} ({ratio:.2f})")
        cells += [f"{row['threads']:.0f}", f"{row['rss_mib']:.0f}"]
        print(" | ".join(cells))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_watches", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=3, help="runs per level (default 3)")
    parser.add_argument("--calls", type=int, default=300, help="timed calls per method and run")
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results ({RESULTS})")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.calls < 1:
        parser.error("--repeats and --calls must be at least 1")
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    report: dict[str, Any] = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(
            [Path(sys.executable).name, "-m", "bench.bench_watches", *(argv or sys.argv[1:])]
        ),
        "machine": machine(),
        "backends": {b: run_backend(b, args.calls, args.repeats) for b in backends},
    }
    for backend in backends:
        print_table(backend, report["backends"][backend])
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nresults written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
