"""Simulator benchmark: every policy side by side on a synthetic trace and on a public one.

Run from the repository root::

    .venv/bin/python -m bench.bench_sim [--part synthetic|public ...] [--jobs N] [--policy NAME ...]
        [--quick] [--profile FILE]

Each part replays one trace through the scheduler on a virtual clock, in the same run, under
PRIORITY_FIFO (today's pipeline), BACKFILL and LAS (the production resource manager and placement
engine) and under the simulator's ``baseline-backfill`` (plain backfill, not peloton):

- ``synthetic``: a Philly-like trace (``peloton simulate generate --jobs 10000 --gpus 512 --load
  0.9 --seed 1``) on 64 hosts x 8 GPUs in 8 racks;
- ``public``: ``cluster04.csv`` of the Microsoft ITP trace (:data:`PUBLIC_TRACE`, a copy of
  ``data/raw-traces.tar.gz`` of github.com/microsoft/elasticflow-traces, read as ``peloton
  simulate convert --itp`` reads it): 15,802 real jobs of 1-64 GPUs submitted over 59.5 days, on
  72 hosts x 8 GPUs in 8 racks. The trace does not say how big its cluster was. Its jobs ask for
  495 GPUs on average over its span (GPU-seconds over seconds), so 576 GPUs is an offered load of
  0.86, next to the synthetic trace's 0.9: on 512 GPUs (0.97) its bursts keep the GPUs 96 % busy
  and even plain backfill makes jobs wait 13 h on average; on 640 (0.77) every policy's mean wait
  is under 80 minutes and there is little queueing left to compare.

For each run: wall seconds, jobs simulated per second, resource-manager cycles (and per cycle),
mean JCT and wait, GPU utilization; then, per part, the ratio of mean JCTs to the baseline's and
to today's pipeline, and the worst wait of 16+ GPU gangs against today's. Goals: mean JCT <= 0.55x
today's with no worse a worst wait for 16+ GPU gangs; 10,000 synthetic jobs in under a minute per
policy on this 2-core machine. The machine is shared: the CPU calibration loop of
:mod:`bench.bench_jobs` is printed before and after, so a slow run can be told from a slow
machine.

``--quick`` is a smoke run (1,000 synthetic jobs, the public trace's first 2,000). ``--profile
FILE`` runs the first policy of the first part under cProfile and writes the stats (read them with
``python -m pstats FILE``). Results also go to ``.bench/bench_sim.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.bench_jobs import cpu_calibration_ms
from peloton.sim.cluster import Cluster, generate_hosts
from peloton.sim.policy import BASELINE_BACKFILL, parse_policy
from peloton.sim.report import summarize
from peloton.sim.simulator import simulate
from peloton.sim.trace import TraceJob, generate, itp_jobs

OUT = Path(".bench/bench_sim.json")
GOAL_S = 60.0
# Today's pipeline, the policies against it, and the goal for their mean JCT.
TODAY = "PRIORITY_FIFO"
DEFAULT_POLICIES = [TODAY, "BACKFILL", "LAS", BASELINE_BACKFILL]
JCT_GOAL = 0.55
PARTS = ("synthetic", "public")
# The public trace (bench/traces/README.md says where it comes from) and the cluster replaying it.
PUBLIC_TRACE = Path(__file__).parent / "traces" / "elasticflow-raw-traces.tar.gz"
PUBLIC_CLUSTER = "cluster04.csv"
PUBLIC_HOSTS = 72
QUICK_PUBLIC_JOBS = 2_000


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.1f} h"


def offered_load(jobs: Sequence[TraceJob], gpus: float) -> float:
    """GPU-seconds the jobs ask for per second of their arrivals, over the cluster's GPUs."""
    span = jobs[-1].arrival_s - jobs[0].arrival_s
    return sum(j.gpus * j.duration_s for j in jobs) / span / gpus


def public_jobs(limit: int | None = None) -> list[TraceJob]:
    """The public trace's jobs (the first ``limit`` by arrival), read out of the archive."""
    with tarfile.open(PUBLIC_TRACE) as archive:
        member = archive.extractfile(PUBLIC_CLUSTER)
        if member is None:
            raise SystemExit(f"{PUBLIC_TRACE}: {PUBLIC_CLUSTER} is not a file in it")
        text = io.TextIOWrapper(member, encoding="utf-8", newline="")
        jobs = itp_jobs(text, name=f"{PUBLIC_TRACE.name}:{PUBLIC_CLUSTER}").jobs
    return jobs[:limit] if limit else jobs


def run(
    jobs: Sequence[TraceJob], cluster: Cluster, policies: list[str], profile: str | None
) -> list[dict[str, Any]]:
    """Simulate ``jobs`` under each policy (the first under cProfile if ``profile``)."""
    runs: list[dict[str, Any]] = []
    for i, policy in enumerate(policies):
        profiler = cProfile.Profile() if profile and i == 0 else None
        if profiler is not None:
            profiler.enable()
        result = simulate(jobs, cluster, policy=policy, clock=time.perf_counter)
        if profiler is not None:
            profiler.disable()
            assert profile is not None
            profiler.dump_stats(profile)
        s = summarize(result)
        s.pop("series")
        s["jobs_per_s"] = len(jobs) / result.wall_seconds
        s["seconds_per_cycle"] = result.wall_seconds / result.cycles if result.cycles else None
        runs.append(s)
        cycles = (
            f"{result.cycles} cycles, {1e3 * s['seconds_per_cycle']:.2f} ms each"
            if (result.cycles)
            else "no resource-manager cycles"
        )
        profiled = " (under cProfile)" if profiler is not None else ""
        print(
            f"{policy:>18}: {result.wall_seconds:6.1f} s{profiled}, {s['jobs_per_s']:,.0f} jobs/s, "
            f"{result.instants} instants, {cycles}; mean JCT {s['jct_s']['mean'] / 3600:.2f} h, "
            f"mean wait {s['wait_s']['mean'] / 3600:.2f} h, GPU utilization "
            f"{100 * s['gpu_utilization']:.1f} %, {s['preemptions']} preemptions",
            flush=True,
        )
    return runs


def compare(runs: list[dict[str, Any]]) -> None:
    """Print (and record in each run) its mean JCT against the baseline's and today's, and its
    worst wait of 16+ GPU gangs against today's, with the goal's verdict."""
    base = next((r for r in runs if r["baseline"]), None)
    for r in runs:
        if base is not None and r is not base:
            ratio = r["jct_s"]["mean"] / base["jct_s"]["mean"]
            r["mean_jct_vs_baseline"] = ratio
            print(f"mean JCT {r['policy']} / {BASELINE_BACKFILL}: {ratio:.2f}")
    today = next((r for r in runs if r["policy"] == TODAY), None)
    for r in runs:
        if today is not None and r is not today and not r["baseline"]:
            ratio = r["jct_s"]["mean"] / today["jct_s"]["mean"]
            worst, was = r["worst_wait_16plus_gpus_s"], today["worst_wait_16plus_gpus_s"]
            r["mean_jct_vs_today"] = ratio
            ok = ratio <= JCT_GOAL and (worst is None or was is None or worst <= was)
            print(
                f"mean JCT {r['policy']} / {TODAY}: {ratio:.2f} (goal <= {JCT_GOAL}); worst wait "
                f"of 16+ GPU gangs {_hours(worst)} against {_hours(was)}: "
                f"{'PASS' if ok else 'FAIL'}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--part",
        action="append",
        choices=PARTS,
        help="which trace to replay (repeat); default both",
    )
    parser.add_argument("--jobs", type=int, default=10_000, help="synthetic jobs")
    parser.add_argument(
        "--policy",
        action="append",
        help=f"policies to run (repeat); default {', '.join(DEFAULT_POLICIES)}",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: 1,000 synthetic jobs, the public trace's first {QUICK_PUBLIC_JOBS:,}",
    )
    parser.add_argument("--profile", help="cProfile the first policy's run into this file")
    args = parser.parse_args()
    jobs = 1_000 if args.quick else args.jobs
    parts = list(dict.fromkeys(args.part or PARTS))
    policies = [parse_policy(p) for p in (args.policy or DEFAULT_POLICIES)]
    calibration = cpu_calibration_ms()
    print(
        f"simulator benchmark on {platform.node()} ({os.cpu_count()} cpus, load average "
        f"{os.getloadavg()[0]:.1f}); CPU calibration {calibration:.0f} ms",
        flush=True,
    )
    results: dict[str, Any] = {}
    for n, part in enumerate(parts):
        made = time.perf_counter()
        if part == "synthetic":
            trace = generate(jobs, 512, 0.9, seed=1)
            cluster = generate_hosts(64, 8, racks=8)
            what = f"synthetic trace: {jobs:,} jobs (load 0.9, seed 1)"
        else:
            trace = public_jobs(QUICK_PUBLIC_JOBS if args.quick else None)
            cluster = generate_hosts(PUBLIC_HOSTS, 8, racks=8)
            what = f"public trace: {PUBLIC_TRACE.name}:{PUBLIC_CLUSTER}, {len(trace):,} jobs"
        made = time.perf_counter() - made
        load = offered_load(trace, cluster.total_gpus)
        print(
            f"{what} on {cluster.describe()}, offered load {load:.2f} (trace made in {made:.1f} s)",
            flush=True,
        )
        runs = run(trace, cluster, policies, args.profile if n == 0 else None)
        compare(runs)
        results[part] = {
            "jobs": len(trace),
            "cluster": cluster.describe(),
            "offered_load": load,
            "trace_seconds": made,
            "runs": runs,
        }
    after = cpu_calibration_ms()
    if "synthetic" in results:
        slowest = max(r["wall_s"] for r in results["synthetic"]["runs"])
        verdict = "PASS" if slowest < GOAL_S or jobs < 10_000 else "FAIL"
        print(
            f"slowest synthetic run {slowest:.1f} s (goal < {GOAL_S:.0f} s for 10,000 jobs: "
            f"{verdict})"
        )
    print(f"CPU calibration {calibration:.0f} ms before, {after:.0f} ms after")
    OUT.parent.mkdir(exist_ok=True)
    results.update({"calibration_ms_before": calibration, "calibration_ms_after": after})
    OUT.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
