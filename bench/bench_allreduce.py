"""Allreduce benchmark: the peloton collective runtime against torch.distributed gloo.

Run from the repository root::

    .venv/bin/python -m bench.bench_allreduce [--ranks 2,4] [--min-size 4K] [--max-size 256M]
                                              [--repeats 3] [--variants tcp,shm,gloo] [--quick]

For every rank count N it starts N real processes on this machine that allreduce (sum) float32
buffers of 4 KiB, 16 KiB, ... 256 MiB in place over loopback, three ways in the same run:

* ``tcp``: peloton with ``PELOTON_LOCAL_SIZE=1`` on every rank, as if each were on its own host,
  so the ranks form the TCP ring;
* ``shm``: peloton with ``PELOTON_LOCAL_SIZE=N``, all ranks on one host (the shared-memory path);
* ``gloo``: ``torch.distributed`` with the gloo backend (``tcp://127.0.0.1``, one torch thread).

Each process times every operation after a warm-up (and after checking one result); a run's
latency for a size is the median operation time of its slowest rank. Figures are the median over
``--repeats`` runs, the three ways interleaved run by run because the machine is noisy. From the
latency t of S bytes: ``algbw = S / t`` and ``busbw = algbw * 2(N-1)/N`` (what each rank sends,
so it is comparable across N). A single-thread libc memcpy of each size is measured too, the
bound the shared-memory path is compared with. The results also go to
``.bench/bench_allreduce.json``; the goals of issue 6 are checked at the end.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / ".bench" / "bench_allreduce.json"
VARIANTS = ("tcp", "shm", "gloo")
KIB = 1 << 10
MIB = 1 << 20
# Goals of issue 6 on this 2-core machine.
GOAL_BUSBW_RATIO = 2.0  # peloton busbw >= 2x gloo's from 1 MiB up
GOAL_BUSBW_FROM = 1 * MIB
GOAL_LATENCY_RATIO = 0.25  # peloton latency <= 1/4 of gloo's at 4 KiB
GOAL_LATENCY_SIZE = 4 * KIB


# ---------------------------------------------------------------------------- sizes and reps


def parse_size(text: str) -> int:
    """``4K``, ``1M``, ``256M``, ``1G`` or a byte count."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": KIB, "M": MIB, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if scale != 1 else text
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4K, 1M, 256M)") from None
    if value < 4 or value % 4:
        raise argparse.ArgumentTypeError(f"size {text}: must be a positive multiple of 4 bytes")
    return value


def sizes_between(low: int, high: int, factor: int = 4) -> list[int]:
    """``low``, ``low*factor``, ... up to ``high``."""
    out = []
    size = low
    while size <= high:
        out.append(size)
        size *= factor
    return out


def reps_for(size: int, reps_bytes: int, min_reps: int, max_reps: int) -> int:
    """Timed operations for a size: about ``reps_bytes`` in all, within the bounds."""
    return max(min_reps, min(max_reps, reps_bytes // size))


def human(size: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", MIB), ("K", KIB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def busbw_factor(n: int) -> float:
    return 2 * (n - 1) / n if n > 1 else 1.0


# ---------------------------------------------------------------------------- the ranks


def worker(args: argparse.Namespace) -> None:
    """One rank: time allreduces of every size, write {size: [seconds per op]} to --out."""
    plan: list[tuple[int, int, int]] = json.loads(args.plan)  # (size, warmup, reps)
    if args.worker == "gloo":
        times = _time_gloo(plan, args.rank, args.size, args.port)
    else:
        times = _time_peloton(plan)
    Path(args.out).write_text(json.dumps(times))


def _time_peloton(plan: Sequence[tuple[int, int, int]]) -> dict[str, list[float]]:
    import numpy as np

    import peloton.collective as pc

    pc.init()
    n = pc.size()
    times: dict[str, list[float]] = {}
    for size, warmup, reps in plan:
        x = np.ones(size // 4, dtype=np.float32)
        pc.allreduce_(x, op="sum", name=f"check{size}")
        if not np.all(x == n):
            raise SystemExit(f"peloton: wrong allreduce result at {size} bytes")
        x[:] = 0  # zeros stay zeros: no overflow, no denormals, over any number of reps
        for _ in range(warmup):
            pc.allreduce_(x, op="sum", name=f"bench{size}")
        pc.barrier()
        op = functools.partial(pc.allreduce_, x, op="sum", name=f"bench{size}")
        times[str(size)] = _timed(op, reps)
    pc.shutdown()
    return times


def _time_gloo(
    plan: Sequence[tuple[int, int, int]], rank: int, size: int, port: int
) -> dict[str, list[float]]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    times: dict[str, list[float]] = {}
    for nbytes, warmup, reps in plan:
        x = torch.ones(nbytes // 4, dtype=torch.float32)
        dist.all_reduce(x)
        if not bool((x == size).all()):
            raise SystemExit(f"gloo: wrong allreduce result at {nbytes} bytes")
        x.zero_()
        for _ in range(warmup):
            dist.all_reduce(x)
        dist.barrier()
        times[str(nbytes)] = _timed(functools.partial(dist.all_reduce, x), reps)
    dist.destroy_process_group()
    return times


def _timed(op: Callable[[], object], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        op()
        out.append(time.perf_counter() - t0)
    return out


# ---------------------------------------------------------------------------- the driver


def rank_envs(variant: str, n: int) -> list[dict[str, str]]:
    """PELOTON_* of each rank: one host (``shm``) or one host per rank (``tcp``)."""
    from peloton.collective.run import RankSeat, local_free_ports, rank_env

    peers = [f"127.0.0.1:{p}" for p in local_free_ports(n)]
    if variant == "shm":
        places = [RankSeat(r, "localhost", r, n, 0, 1) for r in range(n)]
    else:
        places = [RankSeat(r, f"host{r}", 0, 1, r, n) for r in range(n)]
    return [rank_env(p, n, peers) for p in places]


def run_group(
    variant: str, n: int, plan: Sequence[tuple[int, int, int]], timeout: float
) -> list[dict[str, list[float]]]:
    """Run the N ranks of one variant; each rank's times."""
    from bench.bench_jobs import _die_with_parent
    from peloton.collective.run import local_free_ports

    base = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    envs = rank_envs(variant, n) if variant != "gloo" else [{} for _ in range(n)]
    port = local_free_ports(1)[0]
    with tempfile.TemporaryDirectory(prefix="bench-allreduce-") as tmp:
        procs = []
        for r in range(n):
            argv = [
                sys.executable, "-m", "bench.bench_allreduce", "--worker", variant,
                "--plan", json.dumps(list(plan)), "--out", f"{tmp}/{r}.json",
                "--rank", str(r), "--size", str(n), "--port", str(port),
            ]  # fmt: skip
            procs.append(
                subprocess.Popen(
                    argv,
                    cwd=REPO,
                    env={**base, **envs[r]},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                    preexec_fn=_die_with_parent,  # the driver has no threads
                )
            )
        try:
            deadline = time.monotonic() + timeout
            for p in procs:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise SystemExit(f"{variant} N={n}: no result within {timeout:g} s") from None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        failed = [(r, p) for r, p in enumerate(procs) if p.returncode != 0]
        if failed:
            r, p = failed[0]
            err = p.stderr.read().strip().splitlines() if p.stderr else []
            why = err[-1] if err else f"exit code {p.returncode}"
            raise SystemExit(f"{variant} N={n}: rank {r} failed: {why}")
        for p in procs:
            if p.stderr:
                p.stderr.close()
        return [json.loads(Path(f"{tmp}/{r}.json").read_text()) for r in range(n)]


def run_latency(per_rank: Sequence[dict[str, list[float]]], size: int) -> float:
    """One run's latency for a size: the median op time of its slowest rank."""
    return max(statistics.median(t[str(size)]) for t in per_rank)


def memcpy_gbps(size: int, samples: int = 15) -> float:
    """Single-thread libc ``memcpy`` bandwidth for ``size`` bytes, in GB/s.

    Each sample times enough copies to take a few ms; the fastest sample counts (a bound, and
    copies of 16-256 KiB on this VM are erratic, up to 20x slower in some samples). The ~1 us of
    a Python call is included, so below 64 KiB this understates memcpy.
    """
    libc = ctypes.CDLL(None)
    memcpy = libc.memcpy
    memcpy.restype = ctypes.c_void_p
    memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    import numpy as np

    # Big, page-aligned buffers (small heap ones copy several times slower on this VM).
    src = np.ones(max(size, 4 * MIB), dtype=np.uint8)
    dst = np.ones_like(src)
    d, s = dst.ctypes.data, src.ctypes.data
    memcpy(d, s, size)
    inner = max(1, 8 * MIB // size)
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            memcpy(d, s, size)
        times.append((time.perf_counter() - t0) / inner)
    return size / min(times) / 1e9


def summarize(latencies: Sequence[float], size: int, n: int) -> dict[str, Any]:
    lat = statistics.median(latencies)
    algbw = size / lat / 1e9
    return {
        "latency_s": lat,
        "runs_s": list(latencies),
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * busbw_factor(n),
    }


def fmt_lat(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def print_table(
    n: int, sizes: Sequence[int], result: dict[str, Any], variants: Sequence[str]
) -> None:
    print(f"\nallreduce float32 sum, N={n} ranks on loopback; latency, algbw and busbw in GB/s")
    head = ["size"]
    for v in variants:
        head += [f"{v} lat", f"{v} algbw", f"{v} busbw"]
        if v != "gloo" and "gloo" in variants:
            head += [f"{v}/gloo busbw", f"{v}/gloo lat"]
    head += ["memcpy GB/s"]
    if "shm" in variants:
        head += ["shm busbw/memcpy"]
    rows = [head]
    for size in sizes:
        s = str(size)
        row = [human(size)]
        for v in variants:
            r = result[v][s]
            row += [fmt_lat(r["latency_s"]), f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}"]
            if v != "gloo" and "gloo" in variants:
                g = result["gloo"][s]
                row += [
                    f"{r['busbw_gbps'] / g['busbw_gbps']:.2f}x",
                    f"{r['latency_s'] / g['latency_s']:.2f}x",
                ]
        row.append(f"{result['memcpy_gbps'][s]:.2f}")
        if "shm" in variants:
            row.append(f"{result['shm'][s]['busbw_gbps'] / result['memcpy_gbps'][s]:.2f}")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))


def goals(report: dict[str, Any], variants: Sequence[str]) -> list[str]:
    """The verdict on each goal of issue 6, one line each."""
    lines: list[str] = []
    if "gloo" not in variants:
        return lines
    for n_text, result in report["results"].items():
        for v in (v for v in variants if v != "gloo"):
            ratios = [
                (int(s), r["busbw_gbps"] / result["gloo"][s]["busbw_gbps"])
                for s, r in result[v].items()
                if int(s) >= GOAL_BUSBW_FROM
            ]
            if ratios:
                worst = min(ratios, key=lambda x: x[1])
                ok = worst[1] >= GOAL_BUSBW_RATIO
                lines.append(
                    f"N={n_text} {v}: busbw >= {GOAL_BUSBW_RATIO:g}x gloo from 1M up: "
                    f"{'PASS' if ok else 'MISS'} (lowest {worst[1]:.2f}x at {human(worst[0])})"
                )
            s = str(GOAL_LATENCY_SIZE)
            if s in result[v]:
                ratio = result[v][s]["latency_s"] / result["gloo"][s]["latency_s"]
                ok = ratio <= GOAL_LATENCY_RATIO
                lines.append(
                    f"N={n_text} {v}: latency <= 1/4 of gloo's at 4K: "
                    f"{'PASS' if ok else 'MISS'} ({ratio:.2f}x)"
                )
    return lines


def drive(args: argparse.Namespace) -> int:
    from bench.bench_jobs import cpu_calibration_ms, log, machine

    sizes = args.sizes or sizes_between(args.min_size, args.max_size)
    plan = [
        (s, 2 if s < 16 * MIB else 1, reps_for(s, args.reps_bytes, args.min_reps, args.max_reps))
        for s in sizes
    ]
    report: dict[str, Any] = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "bench.bench_allreduce", *sys.argv[1:]]),
        "machine": machine(),
        "calibration_ms_before": cpu_calibration_ms(),
        "plan": plan,
        "repeats": args.repeats,
        "results": {},
    }
    with_torch = "gloo" in args.variants
    if with_torch:
        import torch

        report["machine"]["torch"] = torch.__version__
    runs: dict[tuple[int, str], list[list[dict[str, list[float]]]]] = {}
    started = time.perf_counter()
    for rep in range(args.repeats):
        for n in args.ranks:
            for v in args.variants:
                log(f"run {rep + 1}/{args.repeats}: {v} N={n}")
                runs.setdefault((n, v), []).append(run_group(v, n, plan, args.timeout))
    memcpy = {str(s): memcpy_gbps(s) for s in sizes}
    for n in args.ranks:
        result: dict[str, Any] = {"memcpy_gbps": memcpy}
        for v in args.variants:
            result[v] = {
                str(s): summarize([run_latency(r, s) for r in runs[(n, v)]], s, n) for s in sizes
            }
        report["results"][str(n)] = result
    report["calibration_ms_after"] = cpu_calibration_ms()
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    for n in args.ranks:
        print_table(n, sizes, report["results"][str(n)], args.variants)
    verdicts = goals(report, args.variants)
    report["goals"] = verdicts
    print()
    for line in verdicts:
        print(line)
    print(
        f"\nmedian of {args.repeats} runs; CPU calibration {report['calibration_ms_before']:.0f} ms"
        f" before, {report['calibration_ms_after']:.0f} ms after; {report['elapsed_s']:.0f} s"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {args.output}")
    return 0


def _csv(kind: Any) -> Any:
    def parse(text: str) -> list[Any]:
        return [kind(x) for x in text.split(",") if x.strip()]

    return parse


def _variants(text: str) -> list[str]:
    out = _csv(str)(text)
    bad = [v for v in out if v not in VARIANTS]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"variants: choose from {', '.join(VARIANTS)}")
    return list(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_allreduce", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--ranks", type=_csv(int), default=[2, 4], help="rank counts (2,4)")
    parser.add_argument("--min-size", type=parse_size, default=4 * KIB, help="default 4K")
    parser.add_argument("--max-size", type=parse_size, default=256 * MIB, help="default 256M")
    parser.add_argument("--sizes", type=_csv(parse_size), default=None, help="e.g. 4K,1M,64M")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--variants", type=_variants, default=list(VARIANTS), help="tcp,shm,gloo")
    parser.add_argument("--reps-bytes", type=parse_size, default=256 * MIB, help=argparse.SUPPRESS)
    parser.add_argument("--min-reps", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--max-reps", type=int, default=200, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per group of ranks")
    parser.add_argument("--quick", action="store_true", help="smoke test: 4K..1M, one run")
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results ({RESULTS})")
    # The rank side (started by the driver).
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.quick:
        args.max_size = min(args.max_size, 1 * MIB)
        args.repeats = 1
        args.reps_bytes = 16 * MIB
        args.max_reps = 50
    if args.repeats < 1 or any(n < 2 for n in args.ranks) or not args.ranks:
        parser.error("--repeats must be at least 1 and --ranks at least 2 each")
    if args.min_size > args.max_size:
        parser.error("--min-size is larger than --max-size")
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
