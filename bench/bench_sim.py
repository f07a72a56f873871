"""Simulator benchmark: a 10,000-job trace on 512 GPUs through the scheduler on a virtual clock.

Run from the repository root::

    .venv/bin/python -m bench.bench_sim [--jobs N] [--policy NAME ...] [--quick] [--profile FILE]

A synthetic Philly-like trace (``peloton simulate generate --jobs 10000 --gpus 512 --load 0.9
--seed 1``) is replayed on 64 hosts x 8 GPUs in 8 racks under PRIORITY_FIFO (today's pipeline),
BACKFILL and LAS (the production resource manager and placement engine) and under the
simulator's ``baseline-backfill`` (plain backfill, not peloton). For each run: wall seconds, jobs
simulated per second, resource-manager cycles (and per cycle), mean JCT and wait, GPU
utilization; then the ratio of mean JCTs to the baseline's and to today's pipeline, and the
worst wait of 16+ GPU gangs against today's. Goals: mean JCT <= 0.55x today's with no worse a
worst wait for 16+ GPU gangs; 10,000 jobs in under a minute per policy on this 2-core machine.
The machine is shared: the CPU calibration loop of :mod:`bench.bench_jobs` is printed before and
after, so a slow run can be told from a slow machine.

``--profile FILE`` runs the first policy under cProfile and writes the stats (read them with
``python -m pstats FILE``). Results also go to ``.bench/bench_sim.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from bench.bench_jobs import cpu_calibration_ms
from peloton.sim.cluster import generate_hosts
from peloton.sim.policy import BASELINE_BACKFILL, parse_policy
from peloton.sim.report import summarize
from peloton.sim.simulator import simulate
from peloton.sim.trace import generate

OUT = Path(".bench/bench_sim.json")
GOAL_S = 60.0
# Today's pipeline, the policies against it, and the goal for their mean JCT.
TODAY = "PRIORITY_FIFO"
DEFAULT_POLICIES = [TODAY, "BACKFILL", "LAS", BASELINE_BACKFILL]
JCT_GOAL = 0.55


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.1f} h"


def run(jobs: int, policies: list[str], profile: str | None) -> dict[str, Any]:
    made = time.perf_counter()
    trace = generate(jobs, 512, 0.9, seed=1)
    made = time.perf_counter() - made
    cluster = generate_hosts(64, 8, racks=8)
    runs: list[dict[str, Any]] = []
    for i, policy in enumerate(policies):
        profiler = cProfile.Profile() if profile and i == 0 else None
        if profiler is not None:
            profiler.enable()
        result = simulate(trace, cluster, policy=policy, clock=time.perf_counter)
        if profiler is not None:
            profiler.disable()
            assert profile is not None
            profiler.dump_stats(profile)
        s = summarize(result)
        s.pop("series")
        s["jobs_per_s"] = jobs / result.wall_seconds
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
    return {"trace_seconds": made, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument(
        "--policy",
        action="append",
        help=f"policies to run (repeat); default {', '.join(DEFAULT_POLICIES)}",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1,000 jobs")
    parser.add_argument("--profile", help="cProfile the first policy's run into this file")
    args = parser.parse_args()
    jobs = 1_000 if args.quick else args.jobs
    policies = [parse_policy(p) for p in (args.policy or DEFAULT_POLICIES)]
    calibration = cpu_calibration_ms()
    print(
        f"simulator benchmark on {platform.node()} ({os.cpu_count()} cpus, load average "
        f"{os.getloadavg()[0]:.1f}): {jobs:,} jobs, 64 hosts x 8 GPUs, load 0.9, seed 1; "
        f"CPU calibration {calibration:.0f} ms",
        flush=True,
    )
    results = run(jobs, policies, args.profile)
    after = cpu_calibration_ms()
    base = next((r for r in results["runs"] if r["baseline"]), None)
    for r in results["runs"]:
        if base is not None and r is not base:
            ratio = r["jct_s"]["mean"] / base["jct_s"]["mean"]
            r["mean_jct_vs_baseline"] = ratio
            print(f"mean JCT {r['policy']} / {BASELINE_BACKFILL}: {ratio:.2f}")
    today = next((r for r in results["runs"] if r["policy"] == TODAY), None)
    for r in results["runs"]:
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
    slowest = max(r["wall_s"] for r in results["runs"])
    verdict = "PASS" if slowest < GOAL_S or jobs < 10_000 else "FAIL"
    print(
        f"slowest run {slowest:.1f} s (goal < {GOAL_S:.0f} s for 10,000 jobs: {verdict}); "
        f"CPU calibration {calibration:.0f} ms before, {after:.0f} ms after"
    )
    OUT.parent.mkdir(exist_ok=True)
    results.update(
        {"jobs": jobs, "calibration_ms_before": calibration, "calibration_ms_after": after}
    )
    OUT.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
