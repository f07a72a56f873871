"""Resource manager benchmark: entitlement computation and admission decisions.

Run from the repository root::

    .venv/bin/python -m bench.bench_resmgr [--repeats N] [--quick]

* **Entitlement**: one computation for a tree of 1,000 pools (20 parents x 49 leaves plus the
  parents, random reservations, limits, shares and STATIC/ELASTIC policies) x 4 kinds, with random
  demand in every leaf. Goal: <= 10 ms. For comparison the same tree is computed with the
  iterative redistribution Peloton uses (give every child share/total of what remains, repeat
  until nothing changes), in the same run.
* **Work conservation**: fair and usable entitlements (:mod:`peloton.resmgr.conservation`) for
  the same tree with three queued gangs per leaf, the big ones outgrowing many leaves' shares,
  against one plain computation.
* **Admission decisions**: gangs per second through :func:`peloton.resmgr.admission.admit` for a
  queue of 20,000 gangs of 1-64 GPUs in one pool (priority order, reserve-ahead, reasons for every
  gang that waits). Goal: >= 20,000 gangs/s.
* **Cycle**: a full resource-manager cycle over a real SQLite database (re-read changed jobs,
  entitlement, admission, pending reasons written, admitted tasks moved PENDING -> READY) for 200
  jobs in 10 pools: gangs admitted per second including the database writes.

Each figure is the median of ``--repeats`` runs (default 5); results also go to
``.bench/bench_resmgr.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from peloton.core.pools import ROOT, KindConfig, Policy, PoolConfig, QueuePolicy
from peloton.core.resources import KINDS, Resources
from peloton.jobmgr.manager import JobManager
from peloton.resmgr.admission import Room, Waiting, admit, order
from peloton.resmgr.conservation import conserve
from peloton.resmgr.entitlement import Calculator
from peloton.resmgr.manager import ResourceManager
from peloton.resmgr.pool import PoolTree
from peloton.storage import migrate
from peloton.storage.db import Database, make_engine
from peloton.storage.pools import SqlPoolStore
from peloton.v1 import common_pb2, job_pb2

OUT = Path(".bench/bench_resmgr.json")
CAPACITY = Resources(cpu=80_000, mem_mb=640e6, disk_mb=10e9, gpu=10_000)


def random_tree(rng: random.Random, parents: int = 20, leaves: int = 49) -> PoolTree:
    pools = []
    for i in range(parents):
        kinds = {}
        child_kinds: list[dict[str, KindConfig]] = [{} for _ in range(leaves)]
        for k in KINDS:
            unit = CAPACITY.get(k) / (parents * leaves * 2)
            child_res = [round(rng.uniform(0, unit), 3) for _ in range(leaves)]
            limit = sum(child_res) * rng.uniform(2, 6)
            kinds[k] = KindConfig(sum(child_res), limit, rng.choice([1, 2, 3]))
            for j in range(leaves):
                child_kinds[j][k] = KindConfig(
                    child_res[j],
                    limit if rng.random() < 0.5 else math.inf,
                    rng.choice([1, 2, 4]),
                    Policy.STATIC if rng.random() < 0.1 else Policy.ELASTIC,
                )
        pools.append(PoolConfig(f"/p{i}", kinds=kinds))
        pools += [PoolConfig(f"/p{i}/l{j}", kinds=child_kinds[j]) for j in range(leaves)]
    return PoolTree(pools)


def random_demand(rng: random.Random, tree: PoolTree) -> dict[str, Resources]:
    leaves = tree.leaves()
    return {
        leaf: Resources(*(rng.uniform(0, 3 * CAPACITY.get(k) / len(leaves)) for k in KINDS))
        for leaf in leaves
    }


def iterative_split(tree: PoolTree, capacity: Resources, demand: dict[str, Resources]) -> None:
    """Peloton's phase 2 as it is written: hand every child share/total of what remains, repeat
    while anything changes (the baseline)."""
    for k in KINDS:
        want = {p: demand.get(p, Resources()).get(k) for p in tree.leaves()}
        for path, _ in reversed(list(tree.walk())):
            kids = tree.children(path)
            if kids:
                want[path] = sum(want[c] for c in kids)
        ent = {ROOT: capacity.get(k)}
        for path, _ in tree.walk():
            kids = tree.children(path)
            if not kids:
                continue
            got = {c: min(want[c], tree.get(c).kind(k).reservation) for c in kids}
            left = ent[path] - sum(got.values())
            while left > 1e-9:
                hungry = [c for c in kids if want[c] - got[c] > 1e-9]
                if not hungry:
                    break
                total = sum(tree.get(c).kind(k).share for c in hungry)
                given = 0.0
                for c in hungry:
                    give = min(left * tree.get(c).kind(k).share / total, want[c] - got[c])
                    got[c] += give
                    given += give
                left -= given
                if given < 1e-9:
                    break
            ent.update(got)


def timed(fn: Callable[[], object], runs: int) -> float:
    """The median wall time of ``runs`` calls, in seconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_entitlement(repeats: int) -> dict[str, float]:
    rng = random.Random(1)
    tree = random_tree(rng)
    demand = random_demand(rng, tree)
    calc = Calculator(tree)
    ours = [timed(lambda: calc.compute(CAPACITY, demand), 20) for _ in range(repeats)]
    build = [timed(lambda: Calculator(tree), 5) for _ in range(repeats)]
    theirs = [timed(lambda: iterative_split(tree, CAPACITY, demand), 3) for _ in range(repeats)]
    return {
        "pools": len(tree),
        "compute_ms": statistics.median(ours) * 1e3,
        "calculator_build_ms": statistics.median(build) * 1e3,
        "iterative_baseline_ms": statistics.median(theirs) * 1e3,
    }


def bench_conservation(repeats: int) -> dict[str, float]:
    """Fair and usable entitlements for the same tree, every leaf queueing three gangs that
    together make its demand: the big ones outgrow many leaves' shares, so gangs are left out,
    entitlements recomputed and second chances tried."""
    rng = random.Random(3)
    tree = random_tree(rng)
    demand = random_demand(rng, tree)
    queues = {
        leaf: [
            Waiting(f"{leaf}-{i}", 0, True, float(i), i, 1, amount.scale(part))
            for i, part in enumerate((0.6, 0.3, 0.1))
        ]
        for leaf, amount in demand.items()
    }
    zero = Resources()
    rooms = {leaf: Room.of(tree, leaf, zero, zero, zero) for leaf in queues}
    calc = Calculator(tree)
    free = CAPACITY.scale(0.3)
    runs = [
        timed(lambda: conserve(calc, CAPACITY, demand, queues, rooms, free), 5)
        for _ in range(repeats)
    ]
    one = [timed(lambda: calc.compute(CAPACITY, demand), 20) for _ in range(repeats)]
    result = conserve(calc, CAPACITY, demand, queues, rooms, free)
    return {
        "gangs": sum(len(q) for q in queues.values()),
        "left_out": sum(len(g) for g in result.left_out.values()),
        "conserve_ms": statistics.median(runs) * 1e3,
        "one_compute_ms": statistics.median(one) * 1e3,
    }


def bench_admission(repeats: int, gangs: int) -> dict[str, float]:
    rng = random.Random(2)
    queue = [
        Waiting(
            key=f"j{i}",
            priority=rng.randrange(5),
            preemptible=rng.random() < 0.8,
            submitted_at=float(i),
            seq=i,
            size=1,
            total=Resources(cpu=4, mem_mb=16384, gpu=rng.choice([1, 1, 2, 4, 8, 16, 64])),
        )
        for i in range(gangs)
    ]
    ordered = order(queue, QueuePolicy.PRIORITY_FIFO)
    room = Room(
        pool="/bench",
        entitlement=CAPACITY.scale(0.5),
        allocation=CAPACITY.scale(0.1),
        reservation=CAPACITY.scale(0.2),
        np_allocation=CAPACITY.scale(0.05),
        limit=CAPACITY,
    )
    free = CAPACITY.scale(0.3)
    runs = [timed(lambda: admit(ordered, room, free, CAPACITY), 3) for _ in range(repeats)]
    sort_runs = [timed(lambda: order(queue, QueuePolicy.PRIORITY_FIFO), 3) for _ in range(repeats)]
    decision = admit(ordered, room, free, CAPACITY)
    return {
        "gangs": gangs,
        "admitted": len(decision.admitted),
        "decisions_per_s": gangs / statistics.median(runs),
        "with_ordering_per_s": gangs / (statistics.median(runs) + statistics.median(sort_runs)),
    }


def bench_cycle(repeats: int, jobs: int = 200) -> dict[str, float]:
    rates = []
    for r in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/bench.db"
            engine = make_engine(url)
            migrate.upgrade(engine)
            engine.dispose()
            db = Database.from_url(url)
            try:
                jm = JobManager(db)
                rm = ResourceManager(SqlPoolStore(db), jm)
                jm.set_scheduler(rm)
                rm.load()
                for p in range(10):
                    rm.create_pool(PoolConfig(f"/p{p}", kinds={"gpu": KindConfig(8, 1e9, 1)}))
                rng = random.Random(r)
                for i in range(jobs):
                    spec = job_pb2.JobSpec(
                        name=f"j{i}",
                        pool=f"/p{i % 10}",
                        instances=rng.choice([1, 2, 4, 8]),
                        task=job_pb2.TaskSpec(
                            command="x", resources=common_pb2.Resources(cpu=1, mem_mb=64, gpu=1)
                        ),
                    )
                    spec.preemption.preemptible = True
                    jm.create_job(spec)
                rm.set_capacity(Resources(cpu=1e6, mem_mb=1e9, disk_mb=1e9, gpu=1e6))
                start = time.perf_counter()
                rm.run_cycle()
                elapsed = time.perf_counter() - start
                admitted = len(rm.take_admitted(10 * jobs))
                rates.append(admitted / elapsed)
            finally:
                db.dispose()
    return {"jobs": jobs, "gangs_admitted_per_s": statistics.median(rates)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer, smaller runs")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    gangs = 2_000 if args.quick else 20_000

    print(f"resource manager benchmark on {platform.node()} ({platform.processor() or 'cpu'}), "
          f"medians of {repeats} runs")  # fmt: skip
    ent = bench_entitlement(repeats)
    print(
        f"entitlement, {ent['pools']} pools x 4 kinds: {ent['compute_ms']:.2f} ms "
        f"(goal <= 10 ms); iterative baseline {ent['iterative_baseline_ms']:.1f} ms "
        f"(x{ent['iterative_baseline_ms'] / ent['compute_ms']:.1f} slower); "
        f"building the calculator after a pool change {ent['calculator_build_ms']:.2f} ms"
    )
    con = bench_conservation(repeats)
    print(
        f"work conservation, {con['gangs']} queued gangs in the same tree: fair and usable "
        f"entitlements {con['conserve_ms']:.1f} ms ({con['left_out']} gangs left out; "
        f"x{con['conserve_ms'] / con['one_compute_ms']:.1f} one computation)"
    )
    adm = bench_admission(repeats, gangs)
    print(
        f"admission, {adm['gangs']} queued gangs: {adm['decisions_per_s']:,.0f} decisions/s "
        f"(goal >= 20,000), {adm['with_ordering_per_s']:,.0f}/s including the queue sort; "
        f"{adm['admitted']} admitted"
    )
    cyc = bench_cycle(repeats if not args.quick else 1)
    print(
        f"full cycle on SQLite, {cyc['jobs']} jobs: {cyc['gangs_admitted_per_s']:,.0f} gangs "
        "admitted/s including the database writes"
    )
    OUT.parent.mkdir(exist_ok=True)
    results = {"entitlement": ent, "conservation": con, "admission": adm, "cycle": cyc}
    OUT.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
