"""Placement benchmark: the placement engine against a first-fit, task-by-task baseline.

Run from the repository root::

    .venv/bin/python -m bench.bench_placement [--repeats N] [--quick]

* **Throughput**: task placements per second on 10,000 hosts with 8 GPUs each (250 racks of 40),
  for rounds of gangs of 1-64 one-GPU tasks placed one after the other on one snapshot; and the
  latency per gang (p50/p99) by gang size. The baseline places the same gangs with first fit on the
  same snapshot, the engine's and the baseline's snapshots shrinking alike. Goal: >= 10,000
  tasks/s.
* **Mid-trace**: the same on 10,000 hosts x 8 GPUs (250 racks of 40) as a cluster is mid-trace,
  not fresh: each host runs a seeded draw of task groups (GPU tasks of 1-8 GPUs with 2-10 cpus and
  8-48 GB per GPU, CPU-only tasks, each group its executor's share and its ports), so hosts have
  0-8 free GPUs and thousands of distinct free-resource states (the engine's host classes; per-host
  grouping gains little there). 400 gangs (three in four of 1-64 one-GPU tasks, the rest of 1-16
  tasks of 2, 4 or 8 GPUs; ``--quick``: 80 on 2,000 hosts, so that all fit there too) are placed
  one after the other on one snapshot, engine and first fit alike. Goal: the engine's p99 per
  gang <= 1 ms.
* **Quality**: a seeded synthetic GPU trace (Poisson arrivals; 1-, 2-, 4- and 8-GPU single tasks
  and gangs of 2-32 tasks; exponential durations) replayed on 64 hosts x 8 GPUs in two racks with
  strict FIFO. Reported: the GPU allocation ratio at the moments the head gang cannot be placed
  (higher = less fragmentation), and the mean queueing delay. The engine must beat the baseline.

Medians of ``--repeats`` runs (default 3); results also go to ``.bench/bench_placement.json``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from peloton.core.gang import Gang, Placement
from peloton.core.offers import HostOffers, port_count
from peloton.core.resources import EXECUTOR_RESOURCES, Resources
from peloton.placement import engine, firstfit
from peloton.v1 import common_pb2, job_pb2

OUT = Path(".bench/bench_placement.json")
AT = datetime(2026, 1, 1, tzinfo=UTC)
HOST = Resources(cpu=96, mem_mb=768_000, disk_mb=4_000_000, gpu=8)


def make_gang(job: str, tasks: int, gpu: float) -> Gang:
    spec = job_pb2.JobSpec(
        name=job,
        instances=tasks,
        task=job_pb2.TaskSpec(
            command="train", resources=common_pb2.Resources(cpu=4, mem_mb=16_000, gpu=gpu)
        ),
    )
    return Gang.of_job(job, spec, tuple(range(tasks)), AT)


def mid_trace(hosts: int, per_rack: int, seed: int = 11) -> list[HostOffers]:
    """A cluster mid-trace: each host's free resources are what a seeded draw of running task
    groups leaves of :data:`HOST` (GPUs, cpus, memory, disk and ports; each group its executor's
    share), so hosts differ the way they do on a busy cluster."""
    rng = random.Random(seed)
    out = []
    for i in range(hosts):
        # Free GPUs: a busy cluster has many full hosts, some idle ones, the rest in between.
        busy = rng.choices(range(9), weights=[10, 6, 6, 6, 8, 6, 6, 6, 30])[0]
        used, gpus, ports = Resources(), 0, 0
        while gpus < busy:
            g = rng.choice([k for k in (1, 2, 4, 8) if k <= busy - gpus])
            tasks = rng.choice([k for k in (1, 2, 4, 8) if k <= g and g % k == 0])
            cpu, mem = rng.choice([2, 4, 6, 8, 10]), rng.choice([8, 16, 24, 32, 48]) * 1000
            used += Resources(cpu=cpu * g, mem_mb=mem * g, disk_mb=20_000 * tasks, gpu=g)
            used += EXECUTOR_RESOURCES
            gpus, ports = gpus + g, ports + tasks * rng.choice([1, 2, 3])
        for _ in range(rng.choice([0, 0, 0, 1, 2, 3])):  # CPU-only tasks (data loaders)
            cpu, mem = rng.choice([1, 2, 4, 8]), rng.choice([2, 4, 8, 16]) * 1000
            if used.cpu + cpu + 1 < HOST.cpu and used.mem_mb + mem < HOST.mem_mb:
                used += Resources(cpu=cpu, mem_mb=mem, disk_mb=5_000) + EXECUTOR_RESOURCES
                ports += 1
        out.append(
            HostOffers(
                hostname=f"h{i:05d}",
                agent_id=f"a{i}",
                free=HOST - used,
                ports=((31000 + ports, 31999),),
                attributes={"rack": f"r{i // per_rack}", "gpu_model": "A100"},
            )
        )
    return out


def mid_trace_gangs(count: int, seed: int = 5) -> list[Gang]:
    """The throughput mix (1-64 one-GPU tasks) with one gang in four of 2-, 4- or 8-GPU tasks."""
    rng = random.Random(seed)
    gangs = []
    for i in range(count):
        if rng.random() < 0.75:
            tasks, gpu = rng.choice([1, 2, 4, 8, 16, 32, 64]), 1
        else:
            tasks, gpu = rng.choice([1, 2, 4, 8, 16]), rng.choice([2, 4, 8])
        gangs.append(make_gang(f"m{i}", tasks, gpu))
    return gangs


def cluster(hosts: int, per_rack: int) -> list[HostOffers]:
    return [
        HostOffers(
            hostname=f"h{i:05d}",
            agent_id=f"a{i}",
            free=HOST,
            ports=((31000, 31999),),
            attributes={"rack": f"r{i // per_rack}", "gpu_model": "A100"},
        )
        for i in range(hosts)
    ]


class FirstFitRound:
    """The baseline on a shrinking snapshot, like :class:`engine.Snapshot`."""

    def __init__(self, hosts: Sequence[HostOffers]) -> None:
        # Placements name hosts by agent id (several agents may share a hostname).
        self.free = {h.agent_id: h for h in hosts}

    def place(self, g: Gang) -> Placement:
        p = firstfit.place(g, list(self.free.values()))
        if p.hosts is not None:
            for name in set(p.hosts):
                h = self.free[name]
                used = g.per_task.scale(p.hosts.count(name)) + EXECUTOR_RESOURCES
                self.free[name] = replace(h, free=h.free - used)
        return p


class EngineRound:
    def __init__(self, hosts: Sequence[HostOffers]) -> None:
        self.snapshot = engine.Snapshot(hosts)

    def place(self, g: Gang) -> Placement:
        return engine.place_on(g, self.snapshot)


@dataclass(frozen=True)
class Round:
    rate: float  # tasks placed per second of placement calls
    times: dict[int, list[float]]  # each gang's placement call by gang size
    snapshot_s: float  # taking the round's snapshot (the engine groups hosts into classes)
    gangs_placed: int


def one_round(
    make: Callable[[Sequence[HostOffers]], FirstFitRound | EngineRound],
    gangs: list[Gang],
    hosts: list[HostOffers],
) -> Round:
    """Tasks placed per second over a round, and each gang's placement time by its size."""
    start = time.perf_counter()
    state = make(hosts)
    snapshot_s = time.perf_counter() - start
    times: dict[int, list[float]] = {}
    placed, total, whole = 0, 0.0, 0
    for g in gangs:
        start = time.perf_counter()
        p = state.place(g)
        took = time.perf_counter() - start
        total += took
        times.setdefault(g.size, []).append(took)
        placed += g.size if p.hosts is not None else 0
        whole += p.hosts is not None
    return Round(placed / total, times, snapshot_s, whole)


@dataclass(frozen=True)
class Arrival:
    at: float
    gang: Gang
    duration: float


def trace(seed: int, jobs: int) -> list[Arrival]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(jobs):
        t += rng.expovariate(1 / 6.0)
        if rng.random() < 0.6:
            tasks, gpu = 1, rng.choice([1, 2, 4, 8])
        else:
            tasks, gpu = rng.choice([2, 4, 8, 16, 32]), rng.choice([1, 2, 4, 8])
        out.append(Arrival(t, make_gang(f"j{i}", tasks, gpu), rng.expovariate(1 / 300.0)))
    return out


def replay(place: Callable[[Gang, Sequence[HostOffers]], Placement], arrivals: list[Arrival],
           hosts: list[HostOffers]) -> dict[str, float]:  # fmt: skip
    """Strict FIFO over the trace; returns the allocation ratio when the head is blocked and the
    mean queueing delay."""
    free = {h.agent_id: h for h in hosts}  # placements name agents
    total_gpu = sum(h.free.gpu for h in hosts)
    ends: list[tuple[float, int, list[tuple[str, Resources]]]] = []
    queue: list[Arrival] = []
    waits: list[float] = []
    blocked_ratios: list[float] = []
    pending = list(arrivals)
    now, seq = 0.0, 0
    while pending or queue or ends:
        next_arrival = pending[0].at if pending else float("inf")
        next_end = ends[0][0] if ends else float("inf")
        now = min(next_arrival, next_end)
        while ends and ends[0][0] <= now:
            for name, used in heapq.heappop(ends)[2]:
                h = free[name]
                free[name] = replace(h, free=h.free + used)
        while pending and pending[0].at <= now:
            queue.append(pending.pop(0))
        while queue:
            head = queue[0]
            p = place(head.gang, list(free.values()))
            if p.hosts is None:
                used_gpu = total_gpu - sum(h.free.gpu for h in free.values())
                blocked_ratios.append(used_gpu / total_gpu)
                break
            queue.pop(0)
            waits.append(now - head.at)
            taken = []
            for name in set(p.hosts):
                used = head.gang.per_task.scale(p.hosts.count(name)) + EXECUTOR_RESOURCES
                h = free[name]
                free[name] = replace(h, free=h.free - used)
                taken.append((name, used))
            seq += 1
            heapq.heappush(ends, (now + head.duration, seq, taken))
        if not pending and not ends and queue:
            break  # the head can never fit
    return {
        "alloc_ratio_when_blocked": statistics.mean(blocked_ratios) if blocked_ratios else 1.0,
        "mean_queue_delay_s": statistics.mean(waits) if waits else 0.0,
        "blocked_moments": len(blocked_ratios),
    }


def percentile(values: list[float], q: float) -> float:
    return sorted(values)[int(q * (len(values) - 1))]


def compare(gangs: list[Gang], hosts: list[HostOffers], repeats: int) -> dict[str, object]:
    """The engine and first fit placing ``gangs`` one after the other, each on its own copy of
    the same snapshot: tasks/s (median of ``repeats`` rounds) and each gang's placement call, p50
    and p99 over every round, by gang size and over all gangs."""
    result: dict[str, object] = {}
    rates, p99s = {}, {}
    for name, make in (("engine", EngineRound), ("first_fit", FirstFitRound)):
        runs = [one_round(make, gangs, hosts) for _ in range(repeats)]
        rates[name] = statistics.median(r.rate for r in runs)
        times: dict[int, list[float]] = {}
        for r in runs:
            for size, values in r.times.items():
                times.setdefault(size, []).extend(values)
        every = [t for values in times.values() for t in values]
        snapshot_ms = statistics.median(r.snapshot_s for r in runs) * 1e3
        p99s[name] = percentile(every, 0.99) * 1e3
        lat = {
            size: (statistics.median(v) * 1e3, percentile(v, 0.99) * 1e3)
            for size, v in sorted(times.items())
        }
        result[name] = {
            "tasks_per_s": rates[name],
            "latency_ms_p50_p99": lat,
            "all_gangs_ms_p50_p99": (statistics.median(every) * 1e3, p99s[name]),
            "all_gangs_ms_max": max(every) * 1e3,
            "snapshot_ms": snapshot_ms,
            "gangs_placed": runs[0].gangs_placed,
        }
        print(f"  {name:9s} {rates[name]:10,.0f} tasks/s; per gang p50/p99 ms: all "
              f"{statistics.median(every) * 1e3:.2f}/{p99s[name]:.2f} "
              f"(max {max(every) * 1e3:.2f}); by gang size "
              + ", ".join(f"{s}: {a:.2f}/{b:.2f}" for s, (a, b) in lat.items())
              + f"; snapshot {snapshot_ms:.0f} ms; {runs[0].gangs_placed} of {len(gangs)} "
              "gangs placed")  # fmt: skip
    result["engine_over_first_fit"] = rates["engine"] / rates["first_fit"]
    result["p99_first_fit_over_engine"] = p99s["first_fit"] / p99s["engine"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run: smaller and once")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    size = 2_000 if args.quick else 10_000
    hosts = cluster(size, 40)
    rng = random.Random(3)
    gangs = [make_gang(f"g{i}", rng.choice([1, 2, 4, 8, 16, 32, 64]), 1) for i in range(400)]

    result: dict[str, object] = {}
    print(f"placement on {len(hosts)} hosts x 8 GPUs; medians of {repeats} runs")
    fresh = compare(gangs, hosts, repeats)
    result.update(fresh)
    print(f"  engine / first fit: x{fresh['engine_over_first_fit']:.1f} "
          "(goal >= 10,000 tasks/s)")  # fmt: skip

    busy = mid_trace(size, 40)
    states = len({(h.free, port_count(h.ports)) for h in busy})
    classes = len(engine.Snapshot(busy).classes())
    free_gpus = sum(h.free.gpu for h in busy)
    print(f"mid-trace: {len(busy)} hosts, {free_gpus:,.0f} of {8 * len(busy):,} GPUs free, "
          f"{states:,} distinct free-resource states, {classes:,} engine host classes")  # fmt: skip
    # As many gangs for the cluster's size (--quick: 80 on 2,000 hosts), so they all fit.
    mid = result["mid_trace"] = compare(mid_trace_gangs(len(busy) // 25), busy, repeats)
    mid.update(states=states, classes=classes)
    engine_p99 = mid["engine"]["all_gangs_ms_p50_p99"][1]  # type: ignore[index]
    print(f"  engine / first fit: x{mid['engine_over_first_fit']:.1f} tasks/s, first fit's p99 / "
          f"engine's x{mid['p99_first_fit_over_engine']:.1f}; engine p99 {engine_p99:.2f} ms "
          "(goal <= 1 ms)")  # fmt: skip

    small = cluster(64, 32)
    arrivals = trace(7, 150 if args.quick else 600)
    quality = {}
    for name, place in (("engine", engine.place), ("first_fit", firstfit.place)):
        quality[name] = replay(place, arrivals, small)
        q = quality[name]
        print(f"  trace, {name:9s}: GPU allocation when the head gang is blocked "
              f"{q['alloc_ratio_when_blocked']:.1%}, mean queueing delay "
              f"{q['mean_queue_delay_s']:.0f} s")  # fmt: skip
    result["quality"] = quality
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
