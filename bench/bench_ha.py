"""Several daemons on one PostgreSQL database (issue 19): failover time, and submission-to-RUNNING
throughput with one and with three daemons beside the daemon as it was before the issue.

Run from the repository root::

    .venv/bin/python -m bench.bench_ha [--rounds R] [--repeats N] [--before-commit C] [--check]

**Failover.** For each lease setting (the default time to live and renewal, and a 3 s lease
renewed every second) a fresh database, a simulated minicluster (``--failover-hosts`` agents of 8
GPUs) and ``--daemons`` ``peloton server --daemon-id dN`` processes, started one after the other.
A trickle of one-GPU gangs (one every ``TRICKLE_SECONDS``, running until the end: the cluster
has room for them all) is submitted round-robin through the daemons' gRPC APIs, so that the
scheduler always has something to admit. Each of ``--rounds`` rounds waits
until the leader (the ``leader_leases`` row) has admitted gangs for a while, takes it out of the
trickle, SIGKILLs it, and polls the database every ``POLL_SECONDS`` for

* *takeover*: the lease row under the next epoch (its ``acquired_at``, the database's clock);
* *failover*: the first admission after the kill (the first ``PENDING -> READY`` task event
  stamped after it: only the leader admits, and the killed one is gone), the figure the goals
  are about;
* *first launch*: the first task event ``-> LAUNCHING`` stamped after the kill.

All three are measured from the kill on this machine's wall clock (the daemons, PostgreSQL and
this process share it). The killed daemon is then started again (same id, now a follower) before
the next round. Afterwards every trickled job must have left PENDING and none may have failed,
and no CreateJob of the trickle may have been refused.

**Throughput.** ``bench.bench_e2e``'s run (10,000 one-GPU tasks in gangs of 1-64 submitted by 4
callers over gRPC to a simulated minicluster of 1,250 hosts, timed to every task RUNNING as
persisted) against: the daemon as it was before the issue (``--before-commit``, default 7a4ab45,
checked out in a ``git worktree`` and run with this venv through ``PYTHONPATH``: its own
migrations and daemon; the minicluster and the benchmark are today's); today's daemon alone (no
daemon id: always the leader); and ``--daemons`` of today's daemons with ids and the default
lease, the callers spread over their APIs (job ``i`` through daemon ``i mod N``; only the leader
schedules, and it learns of jobs written through the others by polling the job events). The
configurations take turns run by run, so that a change in the machine's load falls on each alike.

Today's daemon is this checkout's, or with ``--today-commit C`` that commit's from a worktree as
for "before" (for figures of a commit while the checkout is being edited).

``--check`` is one failover round per lease setting with 2 daemons and one 1,000-task run of
today's daemon alone and of 3 daemons (no "before"), and fails if a takeover or a job is missing;
it is what ``make bench`` runs. The raw results go to ``.bench/bench_ha.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from bench.bench_e2e import (
    GPUS_PER_HOST,
    START_TIMEOUT_S,
    Cluster,
    DaemonStarter,
    Settings,
    _gpu_capacity,
    _wait,
    one_daemon,
    run_once,
)
from bench.bench_jobs import (
    REPO,
    Daemon,
    _cpu_steal,
    cpu_calibration_ms,
    database,
    log,
    machine,
    migrate_db,
)
from peloton.client import PelotonClient
from peloton.config import ServerConfig
from peloton.storage.db import make_engine
from peloton.storage.leases import SCHEDULER_LEASE
from peloton.v1 import common_pb2, job_pb2

RESULTS = REPO / ".bench" / "bench_ha.json"
BEFORE_COMMIT = "7a4ab45"  # main when issue 19 was opened
DEFAULT_TTL = ServerConfig().leader_lease_ttl_seconds
DEFAULT_RENEW = ServerConfig().leader_lease_renew_seconds
# Goals (issue 19): failover with the default lease and with a 3 s one; throughput.
GOAL_FAILOVER_DEFAULT_S = 15.0
GOAL_FAILOVER_SHORT_S = 5.0
SHORT_TTL, SHORT_RENEW = 3.0, 1.0
GOAL_TASKS_PER_S = 1_000.0
GOAL_SPEEDUP = 2.0
POLL_SECONDS = 0.05
TRICKLE_SECONDS = 0.2
# Before a kill: the leader has admitted a gang within this long (it is scheduling).
STEADY_SECONDS = 1.0
FAILOVER_TIMEOUT_S = 120.0


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------------------- daemons


class HaDaemon(Daemon):
    """A ``peloton server --daemon-id`` in its own directory under the run's."""

    def __init__(
        self, url: str, workdir: Path, daemon_id: str, master: str, ttl: float, renew: float
    ) -> None:
        own = workdir / daemon_id
        own.mkdir(exist_ok=True)
        args = [
            "--mesos-master",
            master,
            "--daemon-id",
            daemon_id,
            "--leader-lease-ttl-seconds",
            f"{ttl:g}",
            "--leader-lease-renew-seconds",
            f"{renew:g}",
        ]
        super().__init__(url, own, args)
        self.daemon_id = daemon_id

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


@dataclass(frozen=True)
class Lease:
    holder: str
    epoch: int
    acquired_at: float  # seconds since the epoch, the database's clock


def lease(engine: Engine) -> Lease | None:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT holder, epoch, acquired_at FROM leader_leases WHERE name = :name"),
            {"name": SCHEDULER_LEASE},
        ).one_or_none()
    return None if row is None else Lease(row[0], int(row[1]), row[2].timestamp())


def start_ha_daemons(
    url: str,
    workdir: Path,
    master: str,
    daemons: list[Daemon],
    count: int,
    ttl: float,
    renew: float,
) -> None:
    """``count`` daemons with ids d1, d2, ... one after the other (two starting at once on a new
    database would both create /default); d1 first, and holding the lease before the others."""
    engine = make_engine(url, pool_size=1)
    started = time.monotonic()
    try:
        for i in range(count):
            daemon = HaDaemon(url, workdir, f"d{i + 1}", master, ttl, renew)
            daemons.append(daemon)
            daemon.start()
            if i == 0:
                started = time.monotonic()
                _wait(
                    lambda: (held := lease(engine)) is not None and held.holder == "d1",
                    START_TIMEOUT_S,
                    "d1 to hold the lease",
                )
        # Work around a bug: the leader polls the job events for jobs written through the others
        # from its first poll on, one renewal after it started, so a job written through a
        # follower before then is never scheduled. Give it that first poll.
        time.sleep(max(0.0, started + renew + 0.5 - time.monotonic()))
    finally:
        engine.dispose()


def ha_starter(count: int, ttl: float = DEFAULT_TTL, renew: float = DEFAULT_RENEW) -> DaemonStarter:
    def start(url: str, workdir: Path, master: str, daemons: list[Daemon]) -> None:
        start_ha_daemons(url, workdir, master, daemons, count, ttl, renew)

    return start


# ---------------------------------------------------------------------------- the earlier daemon


@contextlib.contextmanager
def _pythonpath(tree: Path | None) -> Iterator[None]:
    """Processes started meanwhile import ``peloton`` from ``tree`` (ahead of the editable
    install, whose finder comes after the path); None: from this checkout."""
    if tree is None:
        yield
        return
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


@contextlib.contextmanager
def worktree(commit: str) -> Iterator[tuple[Path, str]]:
    """``commit`` checked out in a throwaway git worktree (and its full hash), with this
    checkout's built extension modules linked in where the old tree has none."""
    full = subprocess.run(
        ["git", "rev-parse", "--verify", f"{commit}^{{commit}}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tree = Path(tempfile.mkdtemp(prefix=f"peloton-{full[:7]}-"))
    tree.rmdir()
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(tree), full],
        cwd=REPO,
        capture_output=True,
        check=True,
    )
    try:
        for built in (REPO / "peloton").rglob("*.so"):
            there = tree / built.relative_to(REPO)
            if there.parent.is_dir() and not there.exists():
                there.symlink_to(built)
        check = subprocess.run(
            [sys.executable, "-c", "import peloton.server, sys; print(peloton.server.__file__)"],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            capture_output=True,
            text=True,
        )
        if check.returncode != 0 or not check.stdout.startswith(str(tree)):
            raise RuntimeError(f"{commit}'s daemon does not import: {check.stderr or check.stdout}")
        yield tree, full
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True
        )


def _describe(commit: str) -> str:
    """``commit`` (empty: this checkout's HEAD, '+' if its tracked files differ) abbreviated."""
    rev = subprocess.run(
        ["git", "rev-parse", "--short", commit or "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    if commit:
        return rev
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "peloton"], cwd=REPO)
    return rev + ("+" if dirty.returncode else "")


def in_tree(tree: Path | None, starter: DaemonStarter) -> DaemonStarter:
    """``starter`` with the daemons' code from ``tree`` (None: this checkout)."""

    def start(url: str, workdir: Path, master: str, daemons: list[Daemon]) -> None:
        with _pythonpath(tree):
            starter(url, workdir, master, daemons)

    return start


def migrate_in(tree: Path | None) -> Callable[[str, Path], None]:
    """``peloton db upgrade`` with the code and migrations of ``tree`` (None: this checkout)."""

    def migrate(url: str, workdir: Path) -> None:
        with _pythonpath(tree):
            migrate_db(url, workdir)

    return migrate


# ---------------------------------------------------------------------------- failover


class Trickle:
    """One one-GPU gang every ``TRICKLE_SECONDS``, round-robin through the daemons in
    ``targets`` (which the caller changes), on a thread."""

    def __init__(self, targets: dict[str, str]) -> None:
        self.targets = targets
        self.lock = threading.Lock()
        self.created = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        # Held during each call: this process forks daemons, and a fork while a gRPC call is in
        # flight skips gRPC's fork handlers (a restarted daemon once died of SIGABRT in gRPC's
        # poller, 'epoll_wait error: Bad file descriptor').
        self._calling = threading.Lock()
        self._clients: dict[str, PelotonClient] = {}
        self._thread = threading.Thread(target=self._run, name="trickle", daemon=True)

    def set_target(self, daemon_id: str, target: str | None) -> None:
        """Send to ``daemon_id`` at ``target`` from now on (None: no more), once the call in
        flight (which may be through its old channel) has returned."""
        with self._calling, self.lock:
            if target is None:
                self.targets.pop(daemon_id, None)
            else:
                self.targets[daemon_id] = target
            stale = self._clients.pop(daemon_id, None)
        if stale is not None:
            stale.close()

    def start(self) -> None:
        self._thread.start()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No call in flight meanwhile (for starting a process)."""
        with self._calling:
            yield

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self.lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    def _run(self) -> None:
        index = 0
        while not self._stop.wait(TRICKLE_SECONDS):
            with self.lock:
                ids = sorted(self.targets)
                if not ids:
                    continue
                daemon_id = ids[index % len(ids)]
                target = self.targets[daemon_id]
                client = self._clients.get(daemon_id)
                if client is None:
                    client = self._clients[daemon_id] = PelotonClient(target, timeout=10)
            spec = job_pb2.JobSpec(
                name=f"trickle-{index}",
                instances=1,
                task=job_pb2.TaskSpec(
                    command="python train.py",
                    resources=common_pb2.Resources(cpu=2.0, mem_mb=8192.0, gpu=1.0),
                ),
            )
            index += 1
            with self._calling:
                try:
                    client.create_job(spec)
                    self.created += 1
                except Exception as exc:  # counted and reported
                    self.errors.append(f"{daemon_id}: {exc}")


def _first_event_after(engine: Engine, to_state: str, after: float) -> float | None:
    with engine.connect() as conn:
        first = conn.execute(
            text(
                "SELECT min(time) FROM job_events WHERE instance_id IS NOT NULL "
                "AND to_state = :state AND time > :after"
            ),
            {"state": to_state, "after": datetime.fromtimestamp(after, UTC)},
        ).scalar()
    return None if first is None else float(first.timestamp())


def _jobs_by_state(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            s: int(n)
            for s, n in conn.execute(text("SELECT state, count(*) FROM jobs GROUP BY state"))
        }


def failover_setting(
    ttl: float, renew: float, daemons: int, rounds: int, hosts: int
) -> dict[str, Any]:
    """``rounds`` SIGKILLs of the leader among ``daemons`` daemons on one lease setting."""
    results: list[dict[str, Any]] = []
    problems: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="peloton-ha-") as tmp,
        database("postgresql", Path(tmp)) as url,
    ):
        workdir = Path(tmp)
        migrate_db(url, workdir)
        cluster = Cluster(workdir, hosts, 2)
        started: list[Daemon] = []
        engine = make_engine(url, pool_size=2)
        trickle: Trickle | None = None
        try:
            cluster.start()
            start_ha_daemons(url, workdir, cluster.address, started, daemons, ttl, renew)
            by_id = {d.daemon_id: d for d in started if isinstance(d, HaDaemon)}
            with PelotonClient(by_id["d1"].target, timeout=30) as client:
                capacity = hosts * GPUS_PER_HOST
                _wait(
                    lambda: _gpu_capacity(client) >= capacity,
                    START_TIMEOUT_S,
                    f"the leader to see {capacity} GPUs",
                )
            trickle = Trickle({i: d.target for i, d in by_id.items()})
            trickle.start()
            for r in range(rounds):
                result = _failover_round(engine, by_id, trickle, ttl)
                results.append(result)
                log(
                    f"lease {ttl:g}/{renew:g} s, round {r + 1}/{rounds}: killed "
                    f"{result['killed']} (epoch {result['epoch']}); {result['successor']} took "
                    f"over after {result['takeover_s']:.2f} s, first admission "
                    f"{result['failover_s']:.2f} s, first launch {result['first_launch_s']:.2f} s"
                )
            trickle.stop()
            # Every trickled job leaves PENDING; none fails.
            deadline = time.monotonic() + FAILOVER_TIMEOUT_S
            while True:
                states = _jobs_by_state(engine)
                if not states.get("PENDING") and not states.get("INITIALIZED"):
                    break
                if time.monotonic() > deadline:
                    problems.append(f"trickled jobs still waiting: {states}")
                    break
                time.sleep(0.5)
            waited = time.monotonic() - deadline + FAILOVER_TIMEOUT_S
            log(f"trickled jobs by state {states}, {waited:.1f} s after the trickle stopped")
            bad = {s: n for s, n in states.items() if s not in ("RUNNING", "SUCCEEDED")}
            if bad:
                problems.append(f"trickled jobs by state {states}")
            if trickle.errors:
                problems.append(
                    f"{len(trickle.errors)} CreateJob calls failed: {trickle.errors[0]}"
                )
            if sum(states.values()) != trickle.created:
                problems.append(f"{trickle.created} jobs created, {sum(states.values())} stored")
        except Exception:
            for daemon in started:
                log(f"failover run failed; {daemon.workdir.name}'s log ends with:\n{daemon.tail()}")
            raise
        finally:
            if trickle is not None:
                trickle.stop()
            engine.dispose()
            for daemon in started:
                daemon.stop()
            cluster.stop()
    created = trickle.created if trickle is not None else 0
    errors = trickle.errors if trickle is not None else []
    summary = {
        key: {
            "median": _median([r[key] for r in results]),
            "min": min(r[key] for r in results),
            "max": max(r[key] for r in results),
        }
        for key in ("takeover_s", "failover_s", "first_launch_s")
    }
    return {
        "ttl_s": ttl,
        "renew_s": renew,
        "daemons": daemons,
        "rounds": results,
        "summary": summary,
        "trickled_jobs": created,
        "trickle_errors": errors[:10],
        "trickle_error_count": len(errors),
        "problems": problems,
    }


def _failover_round(
    engine: Engine, by_id: dict[str, HaDaemon], trickle: Trickle, ttl: float
) -> dict[str, Any]:
    held = lease(engine)
    assert held is not None, "nobody holds the lease"
    # The leader is scheduling: it admitted a gang lately.
    _wait(
        lambda: _first_event_after(engine, "READY", time.time() - STEADY_SECONDS) is not None,
        FAILOVER_TIMEOUT_S,
        f"{held.holder} to admit trickled gangs",
        interval=POLL_SECONDS,
    )
    victim = by_id[held.holder]
    trickle.set_target(victim.daemon_id, None)
    killed = time.time()
    victim.kill()
    marks: dict[str, float] = {}
    taken: Lease | None = None
    deadline = time.monotonic() + FAILOVER_TIMEOUT_S
    while len(marks) < 3:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"after {FAILOVER_TIMEOUT_S:g} s no takeover and admissions: {marks}, {taken}"
            )
        time.sleep(POLL_SECONDS)
        if "takeover" not in marks:
            now_held = lease(engine)
            if now_held is not None and now_held.epoch > held.epoch:
                taken = now_held
                marks["takeover"] = now_held.acquired_at
        for key, state in (("failover", "READY"), ("first_launch", "LAUNCHING")):
            if key not in marks:
                first = _first_event_after(engine, state, killed)
                if first is not None:
                    marks[key] = first
    assert taken is not None
    # The killed daemon comes back as a follower, and takes trickled gangs again.
    with trickle.paused():
        victim.start()
    trickle.set_target(victim.daemon_id, victim.target)
    return {
        "killed": held.holder,
        "epoch": held.epoch,
        "successor": taken.holder,
        "new_epoch": taken.epoch,
        "takeover_s": marks["takeover"] - killed,
        "failover_s": marks["failover"] - killed,
        "first_launch_s": marks["first_launch"] - killed,
        "ttl_s": ttl,
    }


# ---------------------------------------------------------------------------- throughput


@dataclass(frozen=True)
class Config:
    name: str
    label: str
    start: DaemonStarter
    migrate: Callable[[str, Path], None] = migrate_db


def throughput(configs: Sequence[Config], cfg: Settings) -> dict[str, Any]:
    """``cfg.repeats`` runs of each configuration, taking turns."""
    runs: dict[str, list[dict[str, Any]]] = {c.name: [] for c in configs}
    for r in range(cfg.repeats):
        for c in configs:
            result = run_once("postgresql", cfg, r, c.start, c.migrate)
            result["calibration_ms"] = cpu_calibration_ms()
            result["loadavg"] = os.getloadavg()
            runs[c.name].append(result)
            cpu = result["cpu_s"]
            log(
                f"{c.label} run {r + 1}/{cfg.repeats}: {cfg.tasks} tasks in {result['jobs']} "
                f"gangs: admitted {result['admitted_s']:.2f} s, launched "
                f"{result['launched_s']:.2f} s, RUNNING {result['running_s']:.2f} s = "
                f"{result['tasks_per_s']:.0f} tasks/s; CPU s: "
                + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
                + f"; calibration {result['calibration_ms']:.1f} ms"
                + ("" if not result["problems"] else f"; PROBLEMS: {result['problems']}")
            )
    keys = ("submitted_s", "admitted_s", "launched_s", "running_s", "tasks_per_s")
    out: dict[str, Any] = {}
    for c in configs:
        median: dict[str, Any] = {k: _median([x[k] for x in runs[c.name]]) for k in keys}
        median["cpu_s"] = {
            who: _median([x["cpu_s"][who] for x in runs[c.name]])
            for who in runs[c.name][0]["cpu_s"]
        }
        out[c.name] = {"label": c.label, "runs": runs[c.name], "median": median}
    return out


# ---------------------------------------------------------------------------- report


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def print_report(report: dict[str, Any]) -> bool:
    """Print the tables; whether anything was off (a problem, not a missed goal)."""
    failed = False
    print(
        f"\nseveral daemons (issue 19); {report['machine']['nproc']} CPUs, load "
        + "/".join(f"{x:.2f}" for x in report["machine"]["loadavg_at_start"])
        + f" at start; CPU steal {report['cpu_steal_pct']:.0f}%, calibration loop "
        + "/".join(f"{c:.1f}" for c in report["cpu_calibration_ms"])
        + " ms (before/after)"
    )
    for fo in report["failover"]:
        s = fo["summary"]
        goal = GOAL_FAILOVER_DEFAULT_S if fo["ttl_s"] == DEFAULT_TTL else GOAL_FAILOVER_SHORT_S
        print(
            f"\nfailover, {fo['daemons']} daemons, lease {fo['ttl_s']:g} s renewed every "
            f"{fo['renew_s']:g} s, {len(fo['rounds'])} SIGKILLs of the leader "
            f"({fo['trickled_jobs']} trickled gangs, {fo['trickle_error_count']} failed calls)"
        )
        print(f"{'from the kill to':<26} {'median':>7} {'min':>7} {'max':>7}  rounds (s)")
        for key, what in (
            ("takeover_s", "the lease taken over"),
            ("failover_s", "the first admission"),
            ("first_launch_s", "the first launch"),
        ):
            rounds = " ".join(f"{r[key]:.2f}" for r in fo["rounds"])
            print(
                f"{what:<26} {s[key]['median']:>7.2f} {s[key]['min']:>7.2f} "
                f"{s[key]['max']:>7.2f}  {rounds}"
            )
        median = s["failover_s"]["median"]
        print(
            f"goal: first admission <= {goal:g} s: {_verdict(median <= goal)} (median "
            f"{median:.2f} s = {median / goal:.2f}x the goal; worst {s['failover_s']['max']:.2f} s)"
        )
        for problem in fo["problems"]:
            failed = True
            print(f"PROBLEM: {problem}")
    tp = report["throughput"]
    if tp:
        st = report["throughput_settings"]
        print(
            f"\nsubmission to RUNNING, {st['tasks']:,} one-GPU tasks in gangs of 1-"
            f"{st['max_gang']}, {st['hosts']:,} hosts x {GPUS_PER_HOST} GPUs, PostgreSQL; "
            f"median of {st['repeats']}"
        )
        print(
            f"{'daemon':<34} {'tasks/s':>8} {'RUNNING s':>10} {'admitted s':>11} "
            f"{'launched s':>11}  runs (tasks/s)"
        )
        for result in tp.values():
            m = result["median"]
            runs = " ".join(f"{r['tasks_per_s']:.0f}" for r in result["runs"])
            print(
                f"{result['label']:<34} {m['tasks_per_s']:>8.0f} {m['running_s']:>10.2f} "
                f"{m['admitted_s']:>11.2f} {m['launched_s']:>11.2f}  {runs}"
            )
            print(f"{'':<34} CPU s: " + ", ".join(f"{k} {v:.1f}" for k, v in m["cpu_s"].items()))
            for r in result["runs"]:
                for problem in r["problems"]:
                    failed = True
                    print(f"PROBLEM: {problem}")
        rate = {name: result["median"]["tasks_per_s"] for name, result in tp.items()}
        best = max(rate.get("one", 0.0), rate.get("several", 0.0))
        if "before" in rate and "one" in rate:
            ratio = rate["one"] / rate["before"]
            print(
                f"today's daemon / before: {ratio:.2f}x (goal >= {GOAL_SPEEDUP:g}x: "
                f"{_verdict(ratio >= GOAL_SPEEDUP)})"
            )
        if "before" in rate and "several" in rate:
            print(f"{report['daemons']} daemons / before: {rate['several'] / rate['before']:.2f}x")
        if "one" in rate and "several" in rate:
            print(f"{report['daemons']} daemons / 1 daemon: {rate['several'] / rate['one']:.2f}x")
        print(
            f"best today {best:.0f} tasks/s = {best / GOAL_TASKS_PER_S:.2f}x the goal of "
            f"{GOAL_TASKS_PER_S:,.0f} ({_verdict(best >= GOAL_TASKS_PER_S)})"
        )
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_ha", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--daemons", type=int, default=3, help="daemons sharing the database")
    parser.add_argument("--rounds", type=int, default=5, help="leader SIGKILLs per lease setting")
    parser.add_argument("--failover-hosts", type=int, default=128)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--hosts", type=int, default=1_250, help="agents of 8 GPUs each")
    parser.add_argument("--max-gang", type=int, default=64, help="gang sizes are 1..this")
    parser.add_argument("--callers", type=int, default=4, help="concurrent CreateJob callers")
    parser.add_argument("--repeats", type=int, default=3, help="throughput runs per daemon")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument(
        "--before-commit", default=BEFORE_COMMIT, help="the earlier daemon's commit ('' : none)"
    )
    parser.add_argument(
        "--today-commit",
        default="",
        help="run today's daemon from this commit's worktree instead of this checkout (a "
        "checkout being edited meanwhile gives figures of no commit)",
    )
    parser.add_argument("--skip-failover", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument(
        "--check", action="store_true", help="a small quick run that must pass (make bench)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.check:
        args.rounds, args.daemons, args.failover_hosts = 1, 2, 64
        args.tasks, args.hosts, args.repeats, args.before_commit = 1_000, 160, 1, ""
    if args.hosts * GPUS_PER_HOST < args.tasks:
        parser.error(f"{args.hosts} hosts have fewer than {args.tasks} GPUs")
    cfg = Settings(args.tasks, args.hosts, 2, args.max_gang, args.callers, args.repeats, args.seed)
    steal0, calibration = _cpu_steal(), cpu_calibration_ms()
    report: dict[str, Any] = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "bench.bench_ha", *(argv or sys.argv[1:])]),
        "commit": _describe(args.today_commit),
        "machine": machine(),
        "daemons": 3 if args.check else args.daemons,
        "failover": [],
        "throughput": {},
    }
    with contextlib.ExitStack() as stack:
        today: Path | None = None
        if args.today_commit:
            today, _ = stack.enter_context(worktree(args.today_commit))
        if not args.skip_failover:
            for ttl, renew in ((DEFAULT_TTL, DEFAULT_RENEW), (SHORT_TTL, SHORT_RENEW)):
                with _pythonpath(today):
                    report["failover"].append(
                        failover_setting(ttl, renew, args.daemons, args.rounds, args.failover_hosts)
                    )
        if not args.skip_throughput:
            several = report["daemons"]
            configs = []
            if args.before_commit:
                before, full = stack.enter_context(worktree(args.before_commit))
                report["before_commit"] = full
                configs.append(
                    Config(
                        "before",
                        f"before ({full[:7]}), 1 daemon",
                        in_tree(before, one_daemon),
                        migrate_in(before),
                    )
                )
            configs.append(
                Config(
                    "one",
                    f"today ({report['commit']}), 1 daemon",
                    in_tree(today, one_daemon),
                    migrate_in(today),
                )
            )
            configs.append(
                Config(
                    "several",
                    f"today, {several} daemons (lease {DEFAULT_TTL:g} s)",
                    in_tree(today, ha_starter(several)),
                    migrate_in(today),
                )
            )
            report["throughput_settings"] = cfg.__dict__
            report["throughput"] = throughput(configs, cfg)
    steal1 = _cpu_steal()
    total = steal1[1] - steal0[1]
    report["cpu_steal_pct"] = 100.0 * (steal1[0] - steal0[0]) / total if total > 0 else 0.0
    report["cpu_calibration_ms"] = [calibration, cpu_calibration_ms()]
    report["loadavg_at_end"] = os.getloadavg()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    failed = print_report(report)
    print(f"results written to {args.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
