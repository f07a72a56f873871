"""Figures of a run: job completion and waiting times, utilization, fragmentation, shares.

:func:`summarize` turns a :class:`~peloton.sim.simulator.RunResult` into plain data (what
``--json`` writes and the table shows):

- **JCT** (job completion time): completion - arrival, of the jobs that completed; **wait**
  (queueing delay): first start - arrival. Mean, p50, p95, p99 and max (percentiles linearly
  interpolated), overall and per gang size class by the job's GPUs (:data:`SIZE_CLASSES`: 1,
  2-4, 5-8, 9-16, 17+), and the worst wait of gangs of 16 GPUs or more;
- **makespan**: the first arrival to the last completion;
- **GPU utilization**: busy GPUs integrated over time / (GPUs x makespan);
- **GPU fragmentation**: :func:`peloton.placement.engine.gpu_fragmentation` (the share of free
  GPUs stranded on hosts with fewer free than the largest per-task GPU request waiting),
  time-averaged over the time some GPU work waited;
- **preemptions**: gangs preempted, and the GPU-hours they had run and lost;
- **placement delay**: admitted to placed, per placement (mean, p95, max): time a gang held its
  pool's allocation while placement found no hosts for it (0 for the baseline);
- **pools**: per pool, time-averaged GPU allocation and entitlement (the resource manager's pool
  statuses after each instant) and the shares of the cluster's GPUs they make.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from peloton.sim.policy import BASELINE_BACKFILL
from peloton.sim.simulator import RunResult

SIZE_CLASSES: tuple[tuple[str, int, float], ...] = (
    ("1", 1, 1),
    ("2-4", 2, 4),
    ("5-8", 5, 8),
    ("9-16", 9, 16),
    ("17+", 17, math.inf),
)
BIG_GANG_GPUS = 16
# Points of each time series written to JSON at most.
SERIES_POINTS = 500


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of sorted ``values``, linearly interpolated."""
    if not values:
        return math.nan
    pos = (len(values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def distribution(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, mean, p50, p95, p99, max of ``values`` (None where there are none)."""
    ordered = sorted(values)
    if not ordered:
        return {"n": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}
    return {
        "n": len(ordered),
        "mean": sum(ordered) / len(ordered),
        "p50": percentile(ordered, 50),
        "p95": percentile(ordered, 95),
        "p99": percentile(ordered, 99),
        "max": ordered[-1],
    }


def size_class(gpus: int) -> str:
    for name, low, high in SIZE_CLASSES:
        if low <= gpus <= high:
            return name
    return "0"  # jobs without GPUs


def summarize(result: RunResult) -> dict[str, Any]:
    """The run's figures as JSON-ready data."""
    done = [o for o in result.outcomes if o.completed is not None]
    failed = [o for o in result.outcomes if o.failed]
    span = result.end - result.start
    by_size: dict[str, dict[str, Any]] = {}
    for name, _, _ in (("0", 0, 0), *SIZE_CLASSES):
        members = [o for o in result.outcomes if size_class(o.job.gpus) == name]
        if not members and name == "0":
            continue
        by_size[name] = {
            "jobs": len(members),
            "jct_s": distribution([o.jct for o in members if o.jct is not None]),
            "wait_s": distribution([o.wait for o in members if o.wait is not None]),
        }
    big_waits = [
        o.wait if o.wait is not None else result.end - o.job.arrival_s
        for o in result.outcomes
        if o.job.gpus >= BIG_GANG_GPUS and not o.failed
    ]
    failures: dict[str, int] = {}
    for o in failed:
        kind = o.failed.split(":", 1)[0]
        failures[kind] = failures.get(kind, 0) + 1
    delays = sorted(result.placement_delays)
    gpus = result.total_gpus
    return {
        "policy": result.policy,
        "baseline": result.policy == BASELINE_BACKFILL,
        "cluster": result.cluster,
        "gpus": gpus,
        "jobs": len(result.outcomes),
        "completed": len(done),
        "failed": len(failed),
        "failures": failures,
        "unfinished": len(result.outcomes) - len(done) - len(failed),
        "jct_s": distribution([o.jct for o in done if o.jct is not None]),
        "wait_s": distribution([o.wait for o in result.outcomes if o.wait is not None]),
        "by_size": by_size,
        "worst_wait_16plus_gpus_s": max(big_waits) if big_waits else None,
        "makespan_s": span,
        "gpu_utilization": result.busy_gpu_seconds / (gpus * span) if gpus and span > 0 else 0.0,
        "gpu_fragmentation": (
            result.fragmentation_seconds / result.waiting_seconds
            if result.waiting_seconds > 0
            else 0.0
        ),
        "preemptions": result.preemptions,
        "preempted_jobs": sum(1 for o in result.outcomes if o.preemptions),
        "lost_gpu_hours": result.lost_gpu_seconds / 3600.0,
        "placement_delay_s": {
            "n": len(delays),
            "mean": sum(delays) / len(delays) if delays else None,
            "p95": percentile(delays, 95) if delays else None,
            "max": delays[-1] if delays else None,
        },
        "pools": [
            {
                "pool": p.pool,
                "gpu_allocation": p.allocation,
                "gpu_entitlement": p.entitlement,
                "gpu_reservation": p.reservation,
                "share_received": p.allocation / gpus if gpus else 0.0,
                "share_entitled": (
                    None if p.entitlement is None else (p.entitlement / gpus if gpus else 0.0)
                ),
            }
            for p in result.pools
        ],
        "cycles": result.cycles,
        "instants": result.instants,
        "wall_s": result.wall_seconds,
        "series": series(result),
    }


def series(result: RunResult, points: int = SERIES_POINTS) -> dict[str, list[float]]:
    """Utilization and queue length over time, at most ``points`` samples (evenly picked)."""
    samples = result.samples
    step = max(1, math.ceil(len(samples) / points))
    picked = samples[::step]
    if samples and picked[-1] is not samples[-1]:
        picked.append(samples[-1])
    gpus = result.total_gpus or 1.0
    return {
        "t_s": [s.t for s in picked],
        "gpu_utilization": [s.busy_gpus / gpus for s in picked],
        "waiting_jobs": [float(s.waiting) for s in picked],
        "running_jobs": [float(s.running) for s in picked],
    }


# ---------------------------------------------------------------------------- the table


def duration(seconds: float | None) -> str:
    """``45 s``, ``12.5 min``, ``3.2 h``, ``2.1 d``; ``-`` for none."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def table_rows(summaries: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the side-by-side table: a row per figure, a column per run."""
    columns = ["", *(_label(s) for s in summaries)]
    rows: list[list[str]] = []

    def row(label: str, values: Sequence[str]) -> None:
        rows.append([label, *values])

    row("jobs completed", [f"{s['completed']} / {s['jobs']}" for s in summaries])
    if any(s["failed"] or s["unfinished"] for s in summaries):
        row(
            "failed / unfinished",
            [f"{s['failed']} / {s['unfinished']}" for s in summaries],
        )
    for key, name in (("jct_s", "JCT"), ("wait_s", "wait")):
        for stat in ("mean", "p50", "p95", "p99"):
            row(f"{name} {stat}", [duration(s[key][stat]) for s in summaries])
    for cls, _, _ in SIZE_CLASSES:
        gpus = "GPU" if cls == "1" else "GPUs"
        row(
            f"JCT mean / p95, {cls} {gpus}",
            [_pair(s["by_size"].get(cls, {}).get("jct_s")) for s in summaries],
        )
    for cls, _, _ in SIZE_CLASSES:
        gpus = "GPU" if cls == "1" else "GPUs"
        row(
            f"wait mean / p95, {cls} {gpus}",
            [_pair(s["by_size"].get(cls, {}).get("wait_s")) for s in summaries],
        )
    row(
        f"worst wait, {BIG_GANG_GPUS}+ GPUs",
        [duration(s["worst_wait_16plus_gpus_s"]) for s in summaries],
    )
    row("makespan", [duration(s["makespan_s"]) for s in summaries])
    row("GPU utilization", [_pct(s["gpu_utilization"]) for s in summaries])
    row("GPU fragmentation", [_pct(s["gpu_fragmentation"]) for s in summaries])
    row(
        "preemptions (GPU-h lost)",
        [f"{s['preemptions']} ({s['lost_gpu_hours']:.0f})" for s in summaries],
    )
    row(
        "admitted -> placed mean / max",
        [
            "-"
            if s["baseline"]
            else f"{duration(s['placement_delay_s']['mean'])} / "
            f"{duration(s['placement_delay_s']['max'])}"
            for s in summaries
        ],
    )
    pools = list(dict.fromkeys(p["pool"] for s in summaries for p in s["pools"]))
    for pool in pools:
        values = []
        for s in summaries:
            found = next((p for p in s["pools"] if p["pool"] == pool), None)
            if found is None:
                values.append("-")
            elif found["share_entitled"] is None:
                values.append(f"{_pct(found['share_received'])} (no entitlement)")
            else:
                values.append(f"{_pct(found['share_received'])} of {_pct(found['share_entitled'])}")
        row(f"GPU share {pool} (got of entitled)", values)
    row("wall time (cycles)", [f"{s['wall_s']:.1f} s ({s['cycles']})" for s in summaries])
    return columns, rows


def _pair(dist: dict[str, Any] | None) -> str:
    if not dist or not dist.get("n"):
        return "-"
    return f"{duration(dist['mean'])} / {duration(dist['p95'])}"


def _label(summary: dict[str, Any]) -> str:
    policy = str(summary["policy"])
    return f"{policy} (baseline)" if summary["baseline"] else policy
