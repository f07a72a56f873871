"""Placement benchmark: the placement engine against a first-fit, task-by-task baseline.

Run from the repository root::

    .venv/bin/python -m bench.bench_placement [--repeats N] [--quick]

* **Throughput**: task placements per second on 10,000 hosts with 8 GPUs each (250 racks of 40),
  for rounds of gangs of 1-64 one-GPU tasks placed one after the other on one snapshot; and the
  latency per gang (p50/p99) by gang size. The baseline places the same gangs with first fit on the
  same snapshot, the engine's and the baseline's snapshots shrinking alike. Goal: >= 10,000
  tasks/s.
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
from peloton.core.offers import HostOffers
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


def one_round(
    make: Callable[[Sequence[HostOffers]], FirstFitRound | EngineRound],
    gangs: list[Gang],
    hosts: list[HostOffers],
) -> tuple[float, dict[int, list[float]]]:
    """Tasks placed per second over a round, and each gang's placement time by its size."""
    state = make(hosts)
    times: dict[int, list[float]] = {}
    placed, total = 0, 0.0
    for g in gangs:
        start = time.perf_counter()
        p = state.place(g)
        took = time.perf_counter() - start
        total += took
        times.setdefault(g.size, []).append(took)
        placed += g.size if p.hosts is not None else 0
    return placed / total, times


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run: smaller and once")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    hosts = cluster(2_000 if args.quick else 10_000, 40)
    rng = random.Random(3)
    gangs = [make_gang(f"g{i}", rng.choice([1, 2, 4, 8, 16, 32, 64]), 1) for i in range(400)]

    result: dict[str, object] = {}
    print(f"placement on {len(hosts)} hosts x 8 GPUs; medians of {repeats} runs")
    rates = {}
    for name, make in (("engine", EngineRound), ("first_fit", FirstFitRound)):
        runs = [one_round(make, gangs, hosts) for _ in range(repeats)]
        rates[name] = statistics.median(rate for rate, _ in runs)
        times: dict[int, list[float]] = {}
        for _, per_size in runs:
            for size, values in per_size.items():
                times.setdefault(size, []).extend(values)
        lat = {
            size: (statistics.median(v) * 1e3, sorted(v)[int(0.99 * (len(v) - 1))] * 1e3)
            for size, v in sorted(times.items())
        }
        result[name] = {"tasks_per_s": rates[name], "latency_ms_p50_p99": lat}
        print(f"  {name:9s} {rates[name]:10,.0f} tasks/s; per gang size p50/p99 ms: "
              + ", ".join(f"{s}: {a:.2f}/{b:.2f}" for s, (a, b) in lat.items()))  # fmt: skip
    print(f"  engine / first fit: x{rates['engine'] / rates['first_fit']:.1f} "
          "(goal >= 10,000 tasks/s)")  # fmt: skip

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
