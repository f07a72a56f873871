"""The web console on a large cluster (issue 22): its JSON reads, the page's load in a real
headless Chromium, and how soon a change shows on the page, with 10,000 tasks RUNNING on 1,250
hosts.

Run from the repository root (needs Debian's Chromium, ``make chromium``, and Playwright, in the
dev extras)::

    .venv/bin/python -m bench.bench_console [--repeats N] [--hosts H] [--tasks T]

Setup as ``bench.bench_e2e``: a throwaway PostgreSQL database, a simulated minicluster of
``--hosts`` agents of 8 GPUs in ``--racks`` racks, one ``peloton server`` with its console on a
free port; ``--tasks`` one-GPU tasks in gangs of 1 to 64 are submitted and awaited RUNNING, and
``--waiting`` more gangs that cannot fit wait in the queue. Then, each figure a median of
``--repeats`` (p90 beside it):

- **API**: wall time of each console read (``/api/v1/cluster``, ``/jobs``, ``/queue``, ``/pools``,
  one job's page) over HTTP from this process, and its size;
- **page load**: a fresh browser page opened at ``#/cluster`` until every GPU cell is drawn, and at
  ``#/jobs`` until the job rows are;
- **update latency**: with ``#/cluster`` open, a gang killed over gRPC (``KillJob`` returns) until
  the page no longer draws it on any GPU; and, for the server's part, until the console's event
  stream (``/api/v1/events``) announces the job.

The raw runs go to ``.bench/bench_console.json``. No peer console runs on this machine to compare
with (Ray's dashboard and KueueViz need their own clusters); the figures stand alone.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from bench.bench_e2e import (
    GPUS_PER_HOST,
    START_TIMEOUT_S,
    Cluster,
    _counts,
    _gpu_capacity,
    _wait,
    gang_sizes,
    job_spec,
)
from bench.bench_jobs import (
    REPO,
    Daemon,
    cpu_calibration_ms,
    database,
    log,
    machine,
    migrate_db,
    percentile,
)
from peloton.client import PelotonClient
from peloton.console.cache import MAX_AGE_SECONDS
from peloton.core.states import TaskState
from peloton.storage.db import make_engine
from peloton.v1 import common_pb2, job_pb2

RESULTS = REPO / ".bench" / "bench_console.json"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RUNNING_TIMEOUT_S = 900.0
# Longer than the console reuses a built answer without an event.
SHARED_ANSWER_S = MAX_AGE_SECONDS + 0.2
PAGE_TIMEOUT_MS = 120_000
# Killed gangs for the update figure: small ones, so that a kill is one change, not a burst.
KILL_GANG_MAX = 8


def _get(base: str, path: str) -> tuple[float, int]:
    """Seconds and bytes on the wire of one GET of the console's JSON, gzipped as a browser
    asks for it."""
    start = time.perf_counter()
    ask = urllib.request.Request(base + path, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(ask, timeout=60) as answer:
        size = len(answer.read())
    return time.perf_counter() - start, size


def _figure(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "p90": percentile(values, 90)}


def measure_api(base: str, job_id: str, repeats: int) -> dict[str, Any]:
    """Each read back to back (the views of the cluster, pools and queue are then the answer
    built for the previous call: shared until something changes) and cold (apart by more than
    the console reuses an answer for: built again each time, as after a change)."""
    routes = {
        "cluster": "/api/v1/cluster",
        "jobs": "/api/v1/jobs",
        "queue": "/api/v1/queue",
        "pools": "/api/v1/pools",
        "job page": f"/api/v1/jobs/{job_id}",
    }
    figures: dict[str, Any] = {}
    for name, path in routes.items():
        _get(base, path)  # warm: the first answer builds caches a user's first visit pays once
        warm = [_get(base, path) for _ in range(repeats)]
        cold = []
        for _ in range(repeats):
            time.sleep(SHARED_ANSWER_S)
            cold.append(_get(base, path)[0])
        figures[name] = {**_figure([t for t, _ in warm]), "cold": _figure(cold)}
        figures[name]["bytes"] = warm[-1][1]
        log(
            f"GET {path}: {figures[name]['median'] * 1000:.1f} ms back to back, "
            f"{figures[name]['cold']['median'] * 1000:.1f} ms cold, {warm[-1][1]:,} bytes gzipped"
        )
    return figures


@contextmanager
def _browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as play:
        browser = play.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def _page_load(browser: Any, url: str, ready_js: str, arg: Any) -> float:
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    try:
        start = time.perf_counter()
        page.goto(url)
        page.wait_for_function(ready_js, arg=arg, timeout=PAGE_TIMEOUT_MS, polling="raf")
        return time.perf_counter() - start
    finally:
        page.close()


GPUS_DRAWN = "n => document.querySelectorAll('[data-gpu]').length >= n"
ROWS_DRAWN = "n => document.querySelectorAll('[data-job-row]').length >= n"
GANG_GONE = 'id => !document.querySelector(`[data-gpu][data-job="${id}"]`)'
GANG_SHOWN = 'id => !!document.querySelector(`[data-gpu][data-job="${id}"]`)'


def measure_pages(browser: Any, base: str, gpus: int, rows: int, repeats: int) -> dict[str, Any]:
    cluster = [_page_load(browser, base + "/#/cluster", GPUS_DRAWN, gpus) for _ in range(repeats)]
    jobs = [_page_load(browser, base + "/#/jobs", ROWS_DRAWN, rows) for _ in range(repeats)]
    log(
        f"page load: #/cluster {statistics.median(cluster):.2f} s ({gpus:,} GPU cells), "
        f"#/jobs {statistics.median(jobs):.2f} s ({rows} rows)"
    )
    return {"cluster": _figure(cluster), "jobs": _figure(jobs)}


class EventStream:
    """The console's event stream, read on a thread: when each job id was first announced."""

    def __init__(self, base: str) -> None:
        host, port = base.removeprefix("http://").split(":")
        self._conn = http.client.HTTPConnection(host, int(port), timeout=RUNNING_TIMEOUT_S)
        self._conn.request("GET", "/api/v1/events", headers={"Accept": "text/event-stream"})
        self._answer = self._conn.getresponse()
        if self._answer.status != 200:
            raise RuntimeError(f"/api/v1/events answered {self._answer.status}")
        self.seen: dict[str, float] = {}
        self._changed = threading.Condition()
        threading.Thread(target=self._read, name="events", daemon=True).start()

    def _read(self) -> None:
        for raw in self._answer:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            now = time.perf_counter()
            jobs = json.loads(line.removeprefix("data:")).get("jobs", [])
            with self._changed:
                for job in jobs:
                    self.seen.setdefault(job, now)
                self._changed.notify_all()

    def wait_for(self, job_id: str, timeout: float) -> float:
        with self._changed:
            if not self._changed.wait_for(lambda: job_id in self.seen, timeout):
                raise RuntimeError(f"no event named job {job_id} within {timeout:g} s")
            return self.seen[job_id]

    def close(self) -> None:
        self._conn.close()


def measure_updates(
    browser: Any, base: str, client: PelotonClient, victims: Sequence[str], gpus: int
) -> dict[str, Any]:
    """Kill each of ``victims`` with the cluster page open: until the page stops drawing it, and
    until the event stream names it."""
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    events = EventStream(base)
    page_s: list[float] = []
    event_s: list[float] = []
    try:
        page.goto(base + "/#/cluster")
        page.wait_for_function(GPUS_DRAWN, arg=gpus, timeout=PAGE_TIMEOUT_MS)
        for job_id in victims:
            page.wait_for_function(GANG_SHOWN, arg=job_id, timeout=PAGE_TIMEOUT_MS)
            start = time.perf_counter()
            client.kill_job(job_id, "bench_console: update latency")
            page.wait_for_function(GANG_GONE, arg=job_id, timeout=PAGE_TIMEOUT_MS, polling="raf")
            page_s.append(time.perf_counter() - start)
            event_s.append(events.wait_for(job_id, 60) - start)
    finally:
        events.close()
        page.close()
    log(
        f"kill -> page shows the GPUs free: {statistics.median(page_s):.2f} s; "
        f"-> first event naming the job: {statistics.median(event_s):.3f} s"
    )
    return {"kill_to_page": _figure(page_s), "kill_to_event": _figure(event_s)}


def _fill(client: PelotonClient, cfg: argparse.Namespace, engine: Engine) -> list[job_pb2.Job]:
    """Submit the tasks, await them RUNNING, then add the gangs that wait."""
    sizes = gang_sizes(cfg.tasks, 64, cfg.seed)
    jobs = [client.create_job(job_spec(i, size)) for i, size in enumerate(sizes)]

    def running() -> bool:
        running_now: int = _counts(engine).get(TaskState.RUNNING, 0)
        return running_now >= int(cfg.tasks)

    _wait(running, RUNNING_TIMEOUT_S, f"{cfg.tasks} tasks RUNNING", interval=0.5)
    for i in range(cfg.waiting):
        client.create_job(
            job_pb2.JobSpec(
                name=f"waiting-{i}",
                instances=GPUS_PER_HOST,
                task=job_pb2.TaskSpec(
                    command="python train.py",
                    resources=common_pb2.Resources(cpu=2.0, mem_mb=8192.0, gpu=1.0),
                ),
            )
        )
    log(f"{cfg.tasks:,} tasks RUNNING in {len(jobs):,} gangs; {cfg.waiting} gangs waiting")
    return jobs


def run(cfg: argparse.Namespace) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="peloton-console-") as tmp,
        database("postgresql", Path(tmp)) as url,
    ):
        workdir = Path(tmp)
        migrate_db(url, workdir)
        cluster = Cluster(workdir, cfg.hosts, cfg.racks)
        daemon = Daemon(url, workdir)
        engine = make_engine(url, pool_size=1)
        try:
            cluster.start()
            daemon.args += ["--mesos-master", cluster.address]
            daemon.start()
            base = f"http://127.0.0.1:{daemon.console_port}"
            with PelotonClient(daemon.target, timeout=120) as client:
                capacity = cfg.hosts * GPUS_PER_HOST
                _wait(
                    lambda: _gpu_capacity(client) >= capacity,
                    START_TIMEOUT_S,
                    f"the daemon to see {capacity} GPUs",
                )
                jobs = _fill(client, cfg, engine)
                small = [j.job_id for j in jobs if j.spec.instances <= KILL_GANG_MAX]
                biggest = max(jobs, key=lambda j: j.spec.instances).job_id
                result: dict[str, Any] = {"api": measure_api(base, biggest, cfg.api_repeats)}
                rows = min(len(jobs), cfg.rows)
                with _browser() as browser:
                    result["page_load"] = measure_pages(browser, base, capacity, rows, cfg.repeats)
                    result["update"] = measure_updates(
                        browser, base, client, small[: cfg.repeats], capacity
                    )
            return result
        except Exception:
            log(f"run failed; the daemon's log ends with:\n{daemon.tail()}")
            raise
        finally:
            engine.dispose()
            daemon.stop()
            cluster.stop()


def _print(report: dict[str, Any]) -> None:
    result = report["result"]
    print(
        f"\nthe console with {report['settings']['tasks']:,} tasks RUNNING on "
        f"{report['settings']['hosts']:,} hosts x {GPUS_PER_HOST} GPUs; medians (p90)"
    )
    print("  API reads: back to back / cold (built again), and gzipped size")
    for name, figure in result["api"].items():
        cold = figure["cold"]
        print(
            f"  GET {name:<10} {figure['median'] * 1000:8.1f} ms ({figure['p90'] * 1000:.1f})"
            f" / {cold['median'] * 1000:8.1f} ms ({cold['p90'] * 1000:.1f})"
            f"  {figure['bytes'] / 1024:8.0f} KiB"
        )
    for name, figure in result["page_load"].items():
        print(f"  page load #/{name:<8} {figure['median']:6.2f} s ({figure['p90']:.2f})")
    for name, figure in result["update"].items():
        print(f"  {name.replace('_', ' '):<22} {figure['median']:6.3f} s ({figure['p90']:.3f})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_console", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--hosts", type=int, default=1_250, help="agents of 8 GPUs each")
    parser.add_argument("--racks", type=int, default=25)
    parser.add_argument("--waiting", type=int, default=20, help="gangs left waiting")
    parser.add_argument("--rows", type=int, default=100, help="job rows the jobs page must draw")
    parser.add_argument("--repeats", type=int, default=5, help="page loads and kills")
    parser.add_argument("--api-repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.hosts * GPUS_PER_HOST < args.tasks:
        parser.error(f"{args.hosts} hosts have fewer than {args.tasks} GPUs")
    calibration = cpu_calibration_ms()
    report: dict[str, Any] = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "bench.bench_console", *(argv or sys.argv[1:])]),
        "machine": machine(),
        "settings": {k: v for k, v in vars(args).items() if k != "output"},
        "result": run(args),
    }
    report["cpu_calibration_ms"] = [calibration, cpu_calibration_ms()]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    _print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
