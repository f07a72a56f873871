"""PNG plots of runs side by side (matplotlib, imported only here and only when called).

:func:`write_plots` writes into a directory:

- ``jct_cdf.png``: the CDF of job completion times, one line per run (log time axis);
- ``wait_cdf.png``: the same for queueing delays (jobs that waited 0 s are at the left edge);
- ``utilization.png``: GPU utilization over time, one line per run (time-weighted means over
  :data:`BINS` equal slices of the longest run);
- ``queue.png``: jobs waiting over time, one line per run (the same slices).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from peloton.sim.policy import BASELINE_BACKFILL
from peloton.sim.report import SIZE_CLASSES, size_class
from peloton.sim.simulator import RunResult, Sample

BINS = 200


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotsUnavailable(
            "plots need matplotlib, which is not installed: pip install 'matplotlib>=3.8,<4'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def binned(samples: Sequence[Sample], end: float, bins: int = BINS) -> dict[str, list[float]]:
    """Time-weighted means of busy GPUs and waiting jobs over ``bins`` equal slices of
    [first sample, ``end``] (each sample holds until the next)."""
    if not samples:
        return {"t_s": [], "busy_gpus": [], "waiting": []}
    start = samples[0].t
    width = max(end - start, 1e-9) / bins
    busy = [0.0] * bins
    waiting = [0.0] * bins
    ends = [s.t for s in samples[1:]] + [end]
    for s, b in zip(samples, ends, strict=True):
        a, b = s.t, min(b, end)
        while a < b:
            i = min(bins - 1, int((a - start) / width))
            if i < bins - 1 and start + (i + 1) * width <= a:
                i += 1  # a sits on a slice's edge
            edge = b if i == bins - 1 else min(b, start + (i + 1) * width)
            busy[i] += s.busy_gpus * (edge - a)
            waiting[i] += s.waiting * (edge - a)
            a = edge
    return {
        "t_s": [start + (i + 0.5) * width for i in range(bins)],
        "busy_gpus": [v / width for v in busy],
        "waiting": [v / width for v in waiting],
    }


def _label(result: RunResult) -> str:
    return f"{result.policy} (baseline)" if result.policy == BASELINE_BACKFILL else result.policy


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    ordered = sorted(values)
    n = len(ordered)
    return ordered, [(i + 1) / n for i in range(n)]


def write_plots(results: Sequence[RunResult], directory: str | Path) -> list[Path]:
    """Write the plots of ``results`` into ``directory`` (created); returns the files."""
    plt = _pyplot()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    for name, attr, title in (
        ("jct_cdf.png", "jct", "Job completion time"),
        ("wait_cdf.png", "wait", "Queueing delay (first start - arrival)"),
    ):
        fig, ax = plt.subplots(figsize=(8, 5))
        for r in results:
            values = [max(1.0, v) for o in r.outcomes if (v := getattr(o, attr)) is not None]
            if values:
                xs, ys = _cdf(values)
                ax.step(xs, ys, where="post", label=_label(r))
        ax.set_xscale("log")
        ax.set_xlabel("seconds (log)")
        ax.set_ylabel("fraction of jobs")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    end = max((r.end for r in results), default=0.0)
    series = [(r, binned(r.samples, end)) for r in results]
    for name, key, ylabel, title, scale in (
        ("utilization.png", "busy_gpus", "GPU utilization", "GPU utilization over time", True),
        ("queue.png", "waiting", "jobs waiting", "Queue length over time", False),
    ):
        fig, ax = plt.subplots(figsize=(10, 4.5))
        for r, s in series:
            ys = s[key]
            if scale:
                ys = [v / (r.total_gpus or 1.0) for v in ys]
            ax.plot([t / 3600.0 for t in s["t_s"]], ys, label=_label(r), linewidth=1)
        ax.set_xlabel("hours since the first arrival")
        ax.set_ylabel(ylabel)
        if scale:
            ax.set_ylim(0, 1.05)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    # Mean JCT per gang size class, a bar group per class.
    fig, ax = plt.subplots(figsize=(8, 4.5))
    classes = [c for c, _, _ in SIZE_CLASSES]
    width = 0.8 / max(1, len(results))
    for k, r in enumerate(results):
        means = []
        for c in classes:
            jcts = [o.jct for o in r.outcomes if o.jct is not None and size_class(o.job.gpus) == c]
            means.append(sum(jcts) / len(jcts) / 3600.0 if jcts else math.nan)
        ax.bar([i + k * width for i in range(len(classes))], means, width, label=_label(r))
    ax.set_xticks([i + width * (len(results) - 1) / 2 for i in range(len(classes))])
    ax.set_xticklabels([f"{c} GPU{'' if c == '1' else 's'}" for c in classes])
    ax.set_ylabel("mean JCT (hours)")
    ax.set_title("Mean job completion time by gang size")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "jct_by_size.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written
