"""Elastic training benchmark: recovery, scale-up and goodput of peloton's elastic gangs, beside
torchrun's elastic restart of the same worker count on the same machine.

Run from the repository root::

    .venv/bin/python -m bench.bench_elastic [--ranks 2,3,4,5,6,7,8] [--repeats 3]
                                            [--churn-period 2.5] [--quick]

Every worker runs the same small training loop: a gradient of 1 MiB (float32) computed from the
parameters, an allreduce (sum) of it, the update, and a commit every step. Workers write events
with ``time.monotonic()`` (CLOCK_MONOTONIC, one clock for every process of the machine) to one
log file per gang (``O_APPEND``); the driver reads it and takes every time from it.

* **Recovery** (N = 2..8): a peloton gang of N (``@elastic.run``, its rendezvous endpoint served
  by the driver, the same :class:`RendezvousServer` that ``peloton-run --elastic`` serves) runs
  steadily; one non-zero rank is SIGKILLed. Recovery is the time from the kill to the first
  allreduce completed at size N-1 by every survivor (the last survivor's; the first one's is in
  the JSON).
* **Scale-up** (N = 2..8): the survivors (a gang of N-1) run steadily; a new worker process is
  started (the moment capacity is freed). Scale-up is the time from its start to its first
  allreduce in the gang of N: interpreter start and imports, joining the endpoint, the gang's
  next commit ending the generation, the re-form and state sync.
* **torchrun** (same N): ``python -m torch.distributed.run --nnodes=1:1 --nproc-per-node=N
  --max-restarts=3 --rdzv-backend=c10d`` running the same loop with gloo, rank 0 checkpointing
  to a file every step (a restarted process has nothing else to resume from); one non-zero
  worker is SIGKILLed. On one node torchrun's agent stops the whole local worker group, runs a
  new rendezvous and starts N new processes at the same size: its recovery is the time from the
  kill to the first allreduce completed by every restarted worker.
* **Goodput**: a peloton gang starts at 5 and its size changes by one every ``--churn-period``
  seconds, 5 -> 8 -> 2 -> 5 (a new worker started, or a non-zero rank SIGKILLed), 26 s. Goodput
  is the committed steps per second of the gang over the schedule (a step undone by a restore
  counts once), against a fixed-size gang run for as long in the same invocation at the
  schedule's time-weighted mean size (5). Both do the same work per rank per step; on this
  2-core machine a step takes longer the more ranks share the cores, so the fixed gang runs at
  the mean size. Second figure: each size's own steady rate (measured before the kills of the
  recovery runs) weighted by the time the schedule spends at that size (this one does not
  favour the churn: steps/s is convex in the size, so the mean of the rates is above the rate
  at the mean size).

Figures are medians over ``--repeats`` runs, peloton and torchrun interleaved run by run (goodput:
the churn and fixed runs of the repeat whose ratio is the median).
Results go to ``.bench/bench_elastic.json``; the goals of issue 17 are checked at the end.
Every process started is stopped on the way out, failure and Ctrl-C included (workers also ask
the kernel for SIGKILL when their parent dies).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / ".bench" / "bench_elastic.json"
DIM = 1 << 18  # float32 elements: 1 MiB per allreduce
# Goals of issue 17.
GOAL_RECOVERY_S = 1.0  # median recovery of peloton
GOAL_GOODPUT = 0.9  # churn steps/s over fixed-size steps/s
WAIT_S = 90.0  # the most any gang event may take before the benchmark gives up
LOG_ENV = "BENCH_ELASTIC_LOG"  # where a torch worker writes its events
CKPT_ENV = "BENCH_ELASTIC_CHECKPOINT"  # and its checkpoint
# torchrun's group restarts allowed; the figure is to the first restart whose N workers all
# complete an allreduce (the JSON says how many restarts it took).
MAX_RESTARTS = 3


# ---------------------------------------------------------------------------- the workers


def _die_with_parent() -> None:
    """SIGKILL when the process that started us dies (Linux); called by the worker itself, as
    the driver has threads (the rendezvous endpoint) and torchrun starts the torch workers."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(1)


class EventLog:
    """One line per event, ``<monotonic> <pid> <event> <values...>``, appended atomically."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.pid = os.getpid()

    def __call__(self, event: str, *values: object) -> None:
        text = " ".join([f"{time.monotonic():.6f}", str(self.pid), event, *map(str, values)])
        os.write(self.fd, (text + "\n").encode())


def peloton_worker(log_path: str) -> None:
    _die_with_parent()
    log = EventLog(log_path)
    log("started")
    import numpy as np

    import peloton.collective as pc
    from peloton.collective import elastic

    state = elastic.State(params=np.zeros(DIM, dtype=np.float32), step=0)
    log("ready")

    @elastic.run
    def train(state: Any) -> None:  # State with params and step
        size, rank = pc.size(), pc.rank()
        log("form", size, rank)
        first = True
        while True:
            grad = state.params * np.float32(1e-3) + np.float32(1.0)
            total = pc.allreduce(grad, op="sum", name="grad")
            if first:
                log("first", size, rank)
                first = False
            state.params = state.params * np.float32(0.5) + total * np.float32(1e-3 / size)
            state.step += 1
            state.commit()
            if rank == 0:
                log("step", state.step, size)

    train(state)


def torch_worker(log_path: str, checkpoint: str) -> None:
    _die_with_parent()
    log = EventLog(log_path)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log("started", restart)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    size, rank = dist.get_world_size(), dist.get_rank()
    params, step = torch.zeros(DIM, dtype=torch.float32), 0
    if os.path.exists(checkpoint):
        saved = torch.load(checkpoint)
        params, step = saved["params"], int(saved["step"])
    log("form", size, rank, restart)
    first = True
    while True:
        grad = params * 1e-3 + 1.0
        dist.all_reduce(grad)
        if first:
            log("first", size, rank, restart)
            first = False
        params = params * 0.5 + grad * (1e-3 / size)
        step += 1
        if rank == 0:  # the commit: what a restarted worker resumes from
            torch.save({"params": params, "step": step}, checkpoint + ".tmp")
            os.replace(checkpoint + ".tmp", checkpoint)
            log("step", step, size)


# ---------------------------------------------------------------------------- the driver side


@dataclass
class Event:
    t: float
    pid: int
    kind: str
    values: list[int]


class LogReader:
    """The events of one gang's log so far (read incrementally)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.events: list[Event] = []
        self._partial = b""

    def poll(self) -> list[Event]:
        with contextlib.suppress(FileNotFoundError), self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
            self.offset += len(data)
            data, self._partial = self._partial + data, b""
            lines = data.split(b"\n")
            self._partial = lines.pop()
            for line in lines:
                t, pid, kind, *values = line.decode().split()
                self.events.append(Event(float(t), int(pid), kind, [int(v) for v in values]))
        return self.events

    def wait(self, what: str, until: Callable[[list[Event]], Any], timeout: float = WAIT_S) -> Any:
        """Polls until ``until(events)`` is truthy; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            got = until(self.poll())
            if got:
                return got
            if time.monotonic() > deadline:
                raise SystemExit(f"{what}: not within {timeout:g} s (log {self.path})")
            time.sleep(0.01)


def _is_ours(pid: int) -> bool:
    """pid is still one of this benchmark's worker processes."""
    try:
        return b"bench.bench_elastic" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@dataclass
class Children:
    """Every process this benchmark started, to stop them all whatever happens."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    groups: list[subprocess.Popen[bytes]] = field(default_factory=list)  # torchrun: own session
    logs: list[LogReader] = field(default_factory=list)  # worker pids seen in them

    def start(
        self, argv: list[str], env: dict[str, str], group: bool = False, output: Path | None = None
    ) -> Any:
        with contextlib.ExitStack() as stack:
            out = stack.enter_context(output.open("wb")) if output else subprocess.DEVNULL
            p = subprocess.Popen(
                argv,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=group,
            )
        (self.groups if group else self.procs).append(p)
        return p

    def stop_group(self, p: subprocess.Popen[bytes]) -> None:
        """torchrun: SIGTERM (its agent stops its workers), SIGKILL after 5 s."""
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if p.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # anything left in its session
        p.wait()

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for p in self.groups:
            self.stop_group(p)
        # torchrun's workers run in sessions of their own: any that outlived the agent.
        pids = {e.pid for log in self.logs for e in log.events}
        for pid in pids:
            if _is_ours(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while any(_is_ours(pid) and _alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.procs, self.groups, self.logs = [], [], []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def worker_env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONPATH": str(REPO),
        "PELOTON_ELASTIC_TIMEOUT": "60",
    }


def latest_forms(events: Sequence[Event]) -> dict[int, tuple[int, int]]:
    """pid -> (size, rank) of the last generation each worker formed."""
    out: dict[int, tuple[int, int]] = {}
    for e in events:
        if e.kind == "form":
            out[e.pid] = (e.values[0], e.values[1])
    return out


def firsts_after(events: Sequence[Event], t: float, size: int) -> dict[int, float]:
    """pid -> time of its first allreduce at ``size`` after ``t``."""
    out: dict[int, float] = {}
    for e in events:
        if e.kind == "first" and e.t > t and e.values[0] == size and e.pid not in out:
            out[e.pid] = e.t
    return out


def step_rate(events: Sequence[Event], t0: float, t1: float) -> float:
    """Committed steps per second between t0 and t1 (rank 0's step lines; a redone step once)."""
    return (committed(events, t1) - committed(events, t0)) / max(t1 - t0, 1e-9)


def committed(events: Sequence[Event], t: float) -> int:
    """The highest step committed by time t."""
    return max((e.values[0] for e in events if e.kind == "step" and e.t <= t), default=0)


class PelotonGang:
    """Workers of one elastic gang, its endpoint served here."""

    def __init__(self, children: Children, workdir: Path, min_size: int, expect: int) -> None:
        from peloton.collective.rendezvous import RendezvousServer

        self.children = children
        token = secrets.token_hex(8)
        self.server = RendezvousServer(token, min_size, 8, expect)
        self.env = worker_env() | {
            "PELOTON_RENDEZVOUS": self.server.address,
            "PELOTON_RENDEZVOUS_TOKEN": token,
        }
        self.log_path = workdir / f"peloton-{secrets.token_hex(4)}.log"
        self.log = LogReader(self.log_path)
        children.logs.append(self.log)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def spawn(self) -> tuple[int, float]:
        t = time.monotonic()
        argv = [sys.executable, "-m", "bench.bench_elastic", "--worker", "peloton"]
        p = self.children.start([*argv, "--log", str(self.log_path)], self.env)
        self.procs[p.pid] = p
        return p.pid, t

    def wait_formed(self, size: int, after: float, what: str) -> dict[int, float]:
        """Waits until ``size`` workers completed an allreduce at that size after ``after``."""
        return dict(
            self.log.wait(
                what, lambda ev: (f := firsts_after(ev, after, size)) and len(f) >= size and f
            )
        )

    def members(self) -> dict[int, tuple[int, int]]:
        live = {pid for pid, p in self.procs.items() if p.poll() is None}
        return {pid: sr for pid, sr in latest_forms(self.log.poll()).items() if pid in live}

    def kill(self, pid: int) -> float:
        t = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        self.procs[pid].wait()
        return t

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        self.server.close()


def victim(members: dict[int, tuple[int, int]], size: int) -> int:
    """A non-zero rank of the current gang (the middle one)."""
    want = max(1, size // 2)
    current = {pid: r for pid, (s, r) in members.items() if s == size}
    for pid, r in current.items():
        if r == want:
            return pid
    nonzero = [pid for pid, r in current.items() if r != 0]
    if not nonzero:
        raise SystemExit(f"no non-zero rank to kill in a gang of {size}: {members}")
    return nonzero[0]


def peloton_run(children: Children, workdir: Path, n: int, warm: float) -> dict[str, float]:
    """Recovery N -> N-1 then scale-up N-1 -> N in one gang."""
    gang = PelotonGang(children, workdir, 1, n)
    try:
        start = time.monotonic()
        for _ in range(n):
            gang.spawn()
        gang.wait_formed(n, start, f"peloton N={n}: first generation")
        t0 = time.monotonic()
        time.sleep(warm)
        rate = step_rate(gang.log.poll(), t0, time.monotonic())
        pid = victim(gang.members(), n)
        t_kill = gang.kill(pid)
        got = gang.wait_formed(n - 1, t_kill, f"peloton N={n}: recovery to {n - 1}")
        recovery = max(got.values()) - t_kill
        recovery_first = min(got.values()) - t_kill
        time.sleep(warm / 2)
        new, t_start = gang.spawn()
        after = gang.wait_formed(n, t_start, f"peloton N={n}: scale-up from {n - 1}")
        ready = gang.log.wait(
            "ready", lambda ev: next((e.t for e in ev if e.pid == new and e.kind == "ready"), 0)
        )
        return {
            "recovery_s": recovery,
            "recovery_first_rank_s": recovery_first,
            "scaleup_s": after[new] - t_start,
            "scaleup_imports_s": ready - t_start,
            "scaleup_all_s": max(after.values()) - t_start,
            "steady_steps_per_s": rate,
        }
    finally:
        gang.close()


def torchrun_run(children: Children, workdir: Path, n: int, warm: float) -> dict[str, float]:
    """torchrun's elastic agent restarts the gang after one worker is SIGKILLed."""
    from peloton.collective.run import local_free_ports

    tag = secrets.token_hex(4)
    log_path = workdir / f"torchrun-{tag}.log"
    log = LogReader(log_path)
    children.logs.append(log)
    port = local_free_ports(1)[0]
    # A tiny exec wrapper so that the agent dies with us too (PDEATHSIG survives exec).
    wrapper = (
        "import ctypes, os, sys; ctypes.CDLL('libc.so.6').prctl(1, 9); "
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    )
    argv = [
        sys.executable, "-c", wrapper, "-m", "torch.distributed.run",
        "--nnodes=1:1", f"--nproc-per-node={n}", f"--max-restarts={MAX_RESTARTS}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=bench-{tag}",
        "-m", "bench.bench_elastic", "--worker", "torch",
    ]  # fmt: skip
    # The worker's files go in the environment: torchrun's parser takes abbreviations of its
    # own options (--log would be --log-dir) even after the script's name.
    env = worker_env() | {LOG_ENV: str(log_path), CKPT_ENV: str(workdir / f"ckpt-{tag}.pt")}
    # Workers of a restarted group otherwise share the rendezvous's TCP store with the group
    # before it, and gloo's connect read stale peer addresses from it: every restart of N=8 here
    # failed with "Connection refused" (torch 2.13). With this each attempt's rank 0 serves a
    # store of its own, as torchrun did before it shared the rendezvous store.
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    output = workdir / f"torchrun-{tag}.out"
    agent = children.start(argv, env, group=True, output=output)
    try:

        def firsts(restarts: range, after: float) -> Any:
            """(restart count, pid -> time) once all N workers of one restart did an allreduce."""

            def check(ev: list[Event]) -> tuple[int, dict[int, float]] | None:
                got: dict[int, dict[int, float]] = {}
                for e in ev:
                    if e.kind == "first" and e.values[2] in restarts and e.t > after:
                        got.setdefault(e.values[2], {})[e.pid] = e.t
                        if len(got[e.values[2]]) >= n:
                            return e.values[2], got[e.values[2]]
                if agent.poll() is not None:
                    tail = output.read_text(errors="replace").strip().splitlines()[-5:]
                    raise SystemExit(
                        f"torchrun N={n} exited with {agent.returncode}: " + "\n".join(tail)
                    )
                return None

            return check

        start = time.monotonic()
        log.wait(f"torchrun N={n}: first start", firsts(range(1), start))
        t0 = time.monotonic()
        time.sleep(warm)
        rate = step_rate(log.poll(), t0, time.monotonic())
        forms = {e.pid: e.values[1] for e in log.events if e.kind == "form" and e.values[2] == 0}
        want = max(1, n // 2)
        pid = next(p for p, r in forms.items() if r == want)
        t_kill = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        restart, got = log.wait(
            f"torchrun N={n}: restart", firsts(range(1, MAX_RESTARTS + 1), t_kill)
        )
        ev = log.poll()
        started = [e.t for e in ev if e.kind == "started" and e.values[0] == 1]
        formed = [e.t for e in ev if e.kind == "form" and e.values[2] == restart]
        return {
            "restarts": restart,
            "recovery_s": max(got.values()) - t_kill,
            "recovery_first_rank_s": min(got.values()) - t_kill,
            "kill_to_new_processes_s": min(started) - t_kill,
            "kill_to_process_group_s": max(formed) - t_kill,
            "steady_steps_per_s": rate,
        }
    finally:
        children.stop_group(agent)
        children.groups.remove(agent)


def churn_schedule(low: int, high: int) -> list[int]:
    """From the middle size up to ``high``, down to ``low`` and back to the middle, one at a
    time: the time-weighted mean is the middle size, which the fixed-size gang runs at."""
    mid = (low + high) // 2
    return [
        *range(mid, high),
        *range(high, low, -1),
        *range(low, mid + 1),
    ]


def churn_run(
    children: Children, workdir: Path, sizes: Sequence[int], period: float
) -> dict[str, Any]:
    """A gang following the schedule of sizes (one change per period); or a fixed size."""
    gang = PelotonGang(children, workdir, 2, sizes[0])
    changes: list[dict[str, Any]] = []
    try:
        start = time.monotonic()
        for _ in range(sizes[0]):
            gang.spawn()
        gang.wait_formed(sizes[0], start, f"gang of {sizes[0]}: first generation")
        gang.log.wait("first step", lambda ev: any(e.kind == "step" for e in ev))
        t_begin = time.monotonic()
        current = sizes[0]
        for i, size in enumerate(sizes[1:], start=1):
            time.sleep(max(0.0, t_begin + i * period - time.monotonic()))
            if size > current:
                _, t = gang.spawn()
                changes.append({"t": t - t_begin, "size": size, "how": "start"})
            elif size < current:
                members = gang.members()
                size_now = max((s for s, _ in members.values()), default=current)
                t = gang.kill(victim(members, size_now))
                changes.append({"t": t - t_begin, "size": size, "how": "SIGKILL"})
            current = size
        time.sleep(max(0.0, t_begin + len(sizes) * period - time.monotonic()))
        t_end = time.monotonic()
        events = gang.log.poll()
        steps = committed(events, t_end) - committed(events, t_begin)
        # Rank-steps: each committed step times the size it was (last) done at.
        size_of: dict[int, int] = {}
        for e in events:
            if e.kind == "step" and t_begin < e.t <= t_end:
                size_of[e.values[0]] = e.values[1]
        intervals = [
            b.t - a.t
            for a, b in itertools.pairwise(e for e in events if e.kind == "step")
            if t_begin < b.t <= t_end
        ]
        slow = 4 * statistics.median(intervals) if intervals else 0.0
        reforms = sum(1 for e in events if e.kind == "form" and e.values[1] == 0 and e.t > t_begin)
        return {
            "duration_s": t_end - t_begin,
            "steps": steps,
            "steps_per_s": steps / (t_end - t_begin),
            "rank_steps_per_s": sum(size_of.values()) / (t_end - t_begin),
            "changes": changes,
            "reforms": reforms,
            # Time between two of rank 0's steps longer than 4x the median: the re-forms.
            "stalled_s": sum(i for i in intervals if i > slow),
        }
    finally:
        gang.close()


# ---------------------------------------------------------------------------- report


def fmt_s(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def print_table(results: dict[str, Any]) -> None:
    head = [
        "N",
        "peloton recovery",
        "torchrun restart",
        "peloton/torchrun",
        "peloton scale-up",
        "(imports)",
        "steps/s at N",
    ]
    rows = [head]
    for n, r in results.items():
        p, t = r["peloton"], r["torchrun"]
        rows.append(
            [
                n,
                fmt_s(p["recovery_s"]),
                fmt_s(t["recovery_s"]),
                f"{p['recovery_s'] / t['recovery_s']:.3f}x",
                fmt_s(p["scaleup_s"]),
                fmt_s(p["scaleup_imports_s"]),
                f"{p['steady_steps_per_s']:.0f}",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))


def median_of(runs: Sequence[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    out["runs"] = list(runs)
    return out


def drive(args: argparse.Namespace) -> int:
    from bench.bench_jobs import cpu_calibration_ms, log, machine

    report: dict[str, Any] = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "bench.bench_elastic", *sys.argv[1:]]),
        "machine": machine(),
        "loadavg_before": os.getloadavg(),
        "calibration_ms_before": cpu_calibration_ms(),
        "repeats": args.repeats,
        "allreduce_bytes": DIM * 4,
    }
    import torch

    report["machine"]["torch"] = torch.__version__
    started = time.perf_counter()
    children = Children()
    runs: dict[tuple[int, str], list[dict[str, float]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-elastic-") as tmp:
            workdir = Path(tmp)
            for rep in range(args.repeats):
                for n in args.ranks:
                    log(f"run {rep + 1}/{args.repeats}: peloton N={n}")
                    runs.setdefault((n, "peloton"), []).append(
                        peloton_run(children, workdir, n, args.warm)
                    )
                    children.stop_all()
                    log(f"run {rep + 1}/{args.repeats}: torchrun N={n}")
                    runs.setdefault((n, "torchrun"), []).append(
                        torchrun_run(children, workdir, n, args.warm)
                    )
                    children.stop_all()
            sizes = churn_schedule(2, args.churn_top)
            mean = statistics.fmean(sizes)
            fixed_size = round(mean)
            churns: list[dict[str, Any]] = []
            fixeds: list[dict[str, Any]] = []
            for rep in range(args.repeats):
                log(f"run {rep + 1}/{args.repeats}: churn {sizes}, {args.churn_period:g} s each")
                churns.append(churn_run(children, workdir, sizes, args.churn_period))
                children.stop_all()
                log(f"run {rep + 1}/{args.repeats}: fixed size {fixed_size} for as long")
                fixeds.append(
                    churn_run(children, workdir, [fixed_size] * len(sizes), args.churn_period)
                )
                children.stop_all()
    finally:
        children.stop_all()
    results = {
        str(n): {v: median_of(runs[(n, v)]) for v in ("peloton", "torchrun")} for n in args.ranks
    }
    steady = {n: results[str(n)]["peloton"]["steady_steps_per_s"] for n in args.ranks}
    weighted = None
    if all(s in steady for s in sizes):
        weighted = statistics.fmean(steady[s] for s in sizes)
    # The run whose ratio is the median (churn and fixed of the same repeat, side by side).
    pairs = sorted(
        zip(churns, fixeds, strict=True), key=lambda p: p[0]["steps_per_s"] / p[1]["steps_per_s"]
    )
    churn, fixed = pairs[len(pairs) // 2]
    goodput = {
        "runs": [
            {"churn_steps_per_s": c["steps_per_s"], "fixed_steps_per_s": f["steps_per_s"]}
            for c, f in zip(churns, fixeds, strict=True)
        ],
        "schedule": sizes,
        "period_s": args.churn_period,
        "mean_size": mean,
        "churn": churn,
        "fixed": fixed | {"size": fixed_size},
        "ratio_vs_fixed_mean_size": churn["steps_per_s"] / fixed["steps_per_s"],
        "steady_rate_by_size_time_weighted": weighted,
        "ratio_vs_steady_rates_of_the_sizes": (
            churn["steps_per_s"] / weighted if weighted else None
        ),
        "rank_steps_ratio_vs_fixed": churn["rank_steps_per_s"] / fixed["rank_steps_per_s"],
    }
    report |= {
        "results": results,
        "goodput": goodput,
        "loadavg_after": os.getloadavg(),
        "calibration_ms_after": cpu_calibration_ms(),
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    print(
        "\nrecovery: SIGKILL of a non-zero rank -> first allreduce completed by every survivor "
        "(peloton: at N-1; torchrun: all N restarted)\nscale-up: new worker process started -> "
        "its first allreduce in the gang of N (imports: -> numpy and peloton imported)"
    )
    print_table(results)
    print(
        f"\ngoodput under churn {sizes[0]}..{max(sizes)}..{min(sizes)}..{sizes[-1]}, one change "
        f"every {args.churn_period:g} s ({churn['duration_s']:.1f} s, "
        f"{len(churn['changes'])} changes): {churn['steps_per_s']:.1f} committed steps/s; "
        f"fixed size {fixed_size} (mean {mean:.2f}): {fixed['steps_per_s']:.1f} steps/s; ratio "
        f"{goodput['ratio_vs_fixed_mean_size']:.3f} (the median of {args.repeats}); rank 0 "
        f"stalled {churn['stalled_s']:.2f} s in all ({churn['reforms']} re-forms)"
    )
    if weighted:
        print(
            f"  against each size's steady rate weighted by its time: {weighted:.1f} steps/s, "
            f"ratio {goodput['ratio_vs_steady_rates_of_the_sizes']:.3f}; rank-steps/s ratio "
            f"against the fixed run {goodput['rank_steps_ratio_vs_fixed']:.3f}"
        )
    medians = [r["peloton"]["recovery_s"] for r in results.values()]
    worst = max(medians)
    verdicts = [
        f"peloton recovery <= {GOAL_RECOVERY_S:g} s median at every N: "
        f"{'PASS' if worst <= GOAL_RECOVERY_S else 'MISS'} (worst median {fmt_s(worst)})",
        f"goodput >= {GOAL_GOODPUT:g} of fixed size: "
        f"{'PASS' if goodput['ratio_vs_fixed_mean_size'] >= GOAL_GOODPUT else 'MISS'} "
        f"({goodput['ratio_vs_fixed_mean_size']:.3f})",
    ]
    report["goals"] = verdicts
    print()
    for line in verdicts:
        print(line)
    la = report["loadavg_before"]
    print(
        f"\nmedian of {args.repeats} runs; load average {la[0]:.2f} before, "
        f"{report['loadavg_after'][0]:.2f} after; CPU calibration "
        f"{report['calibration_ms_before']:.0f} ms before, {report['calibration_ms_after']:.0f} "
        f"ms after; {report['elapsed_s']:.0f} s"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {args.output}")
    return 0


def _ranks(text: str) -> list[int]:
    out = [int(x) for x in text.split(",") if x.strip()]
    if not out or any(not 2 <= n <= 8 for n in out):
        raise argparse.ArgumentTypeError("ranks: between 2 and 8, e.g. 2,4,8")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_elastic", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--ranks", type=_ranks, default=list(range(2, 9)), help="2,3,...,8")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--warm", type=float, default=1.0, help="steady seconds before a kill")
    parser.add_argument("--churn-top", type=int, default=8, help="churn between 2 and TOP (8)")
    parser.add_argument("--churn-period", type=float, default=2.0, help="seconds per size")
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: N=2,5,8, one run, churn 2..6 (14 s)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results ({RESULTS})")
    # The worker side (started by the driver, or by torchrun).
    parser.add_argument("--worker", choices=("peloton", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker == "peloton":
        peloton_worker(args.log)
        return 0
    if args.worker == "torch":
        torch_worker(os.environ[LOG_ENV], os.environ[CKPT_ENV])
        return 0
    if args.quick:
        args.ranks = [2, 5, 8]
        args.repeats = 1
        args.warm = 0.5
        args.churn_top = 6
        args.churn_period = 1.5
    if args.repeats < 1 or not 4 <= args.churn_top <= 8 or args.churn_period <= 0:
        parser.error("--repeats >= 1, --churn-top between 4 and 8, --churn-period > 0")
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
