"""The placement engine on fragmented snapshots (a cluster mid-trace: thousands of distinct host
states): its indexed path, which reads the snapshot's arrays, places every gang exactly as the
class-by-class definition does, with the same reasons."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.core.gang import Gang, Placement
from peloton.core.offers import HostOffers
from peloton.core.resources import Resources
from peloton.placement import engine
from peloton.v1 import common_pb2, job_pb2

AT = datetime(2026, 1, 1, tzinfo=UTC)


def gang(tasks: int, *, gpu: float, cpu: float, mem: float = 1024, job: str = "job",
         ports: int = 0, placement: str = "",
         constraints: list[job_pb2.Constraint] | None = None) -> Gang:  # fmt: skip
    spec = job_pb2.JobSpec(
        name=job,
        instances=tasks,
        placement=placement,
        task=job_pb2.TaskSpec(
            command="train",
            resources=common_pb2.Resources(cpu=cpu, mem_mb=mem, gpu=gpu),
            constraints=constraints or [],
            ports=[f"p{i}" for i in range(ports)],
        ),
    )
    return Gang.of_job(job, spec, tuple(range(tasks)), AT)


def host(i: int, free: Resources, ports: int, rack: str, model: str) -> HostOffers:
    attrs = {"rack": rack}
    if model:
        attrs["gpu_model"] = model
    return HostOffers(
        hostname=f"h{i}",
        agent_id=f"a{i}",
        free=free,
        ports=((31000, 31000 + ports - 1),) if ports else (),
        attributes=attrs,
    )


def both_ways(hosts: list[HostOffers], steps: list[Gang | list[str]]) -> list[Placement]:
    """Each step (a gang to place, or agent ids to drop) on two snapshots of ``hosts``: one
    through the indexed path, one class by class; the placements must be the same, and what
    the indexed snapshot keeps up to date must be what it would compute afresh."""
    indexed, plain = engine.Snapshot(hosts), engine.Snapshot(hosts)
    out = []
    shapes: list[Gang] = []
    with mock.patch.object(engine, "_INDEXED_FROM", 0):
        for i, step in enumerate(steps):
            if isinstance(step, list):
                indexed.drop(step)
                plain.drop(step)
            else:
                ours, reference = engine.place_on(step, indexed), engine._place_plain(step, plain)
                assert ours == reference, step.spec
                out.append(ours)
                shapes.append(step)
            if i % 4 == 3 or i == len(steps) - 1:  # between, shapes catch up in bulk
                for g in shapes:
                    kept_up_to_date(indexed, g)
    return out


def kept_up_to_date(snapshot: engine.Snapshot, g: Gang) -> None:
    """The capacities and levels of ``g``'s task shape equal those made from scratch."""
    fit = snapshot._fit(g)
    table = snapshot._table
    assert table is not None
    assert table.n == len(snapshot._by_seq)
    fresh = table.caps(np.arange(table.n), g.per_task, g.ports_per_task, fit.match)
    assert fit.cap[: table.n].tolist() == fresh.tolist()
    assert fit.cap[table.n :].sum() == 0
    if fit.levels is None:
        return
    kept, made = fit.levels, engine._Levels(snapshot, fresh)
    width = len(made.keys[0])
    for g_keys, g_made in zip(kept.keys, made.keys, strict=True):
        assert g_keys[:width] == g_made and not any(g_keys[width:])
    assert (kept.grid[:, :, :width] == made.grid).all() and not kept.grid[:, :, width:].any()
    assert kept.room == made.room and kept.first == made.first and kept.total == made.total
    if kept.tight:  # made once a gang spanned racks, then kept up to date
        made.orders(0)
    assert kept.tight == made.tight and kept.roomy == made.roomy and kept.at == made.at
    n = table.n
    assert (kept.level[:n] == made.level).all()
    held = made.level > 0
    assert (kept.key[:n][held] == made.key[held]).all()
    assert (kept.hosts[:n][held] == made.hosts[held]).all()


RACKS = st.sampled_from(["r0", "r1", "r2", "r3", "r4", "r5"])
CONSTRAINTS = st.sampled_from(
    [
        [],
        [],
        [],
        [job_pb2.Constraint(attribute="rack", op="in", values=["r0", "r1", "r2"])],
        [job_pb2.Constraint(attribute="rack", op="not_in", values=["r1"])],
        [
            job_pb2.Constraint(
                any_of=[
                    job_pb2.Constraint(attribute="rack", op="eq", values=["r3"]),
                    job_pb2.Constraint(attribute="gpu_model", op="eq", values=["H100"]),
                ]
            )
        ],
        [job_pb2.Constraint(attribute="gpu_model", op="exists")],
    ]
)


@st.composite
def fragmented(draw: st.DrawFn) -> tuple[list[HostOffers], list[Gang | list[str]]]:
    """Hosts in racks with free GPUs, cpus and ports drawn from small sets (so some share a
    class and most do not), and a stream of gangs of every kind, some hosts dropped between."""
    count = draw(st.integers(1, 70))
    hosts = []
    for i in range(count):
        free = Resources(
            cpu=draw(st.sampled_from([0.05, 1, 2.1, 6, 16.1, 33, 64])),
            mem_mb=draw(st.sampled_from([500, 4096, 64_000, 256_000])),
            disk_mb=draw(st.sampled_from([0, 1000, 100_000])),
            gpu=draw(st.sampled_from([0, 0, 0.5, 1, 2, 3, 4, 5, 7, 7.3, 8, 8, 8])),
        )
        model = draw(st.sampled_from(["A100", "A100", "A100", "H100", ""]))
        hosts.append(host(i, free, draw(st.sampled_from([0, 1, 3, 100])), draw(RACKS), model))
    steps: list[Gang | list[str]] = []
    for j in range(draw(st.integers(1, 10))):
        if draw(st.integers(0, 5)) == 0:
            steps.append([f"a{k}" for k in draw(st.lists(st.integers(0, count - 1), max_size=4))])
        steps.append(
            gang(
                draw(st.sampled_from([1, 1, 2, 3, 4, 5, 8, 12, 16, 24, 40, 64])),
                gpu=draw(st.sampled_from([0, 0.1, 0.5, 1, 1, 1, 2, 4, 8])),
                cpu=draw(st.sampled_from([0, 0.5, 1, 4, 16])),
                mem=draw(st.sampled_from([0, 1024, 16_000])),
                ports=draw(st.sampled_from([0, 0, 1, 2])),
                placement=draw(st.sampled_from(["", "", "pack", "spread"])),
                constraints=draw(CONSTRAINTS),
                job=f"g{j}",
            )
        )
    return hosts, steps


@settings(max_examples=400, deadline=None, derandomize=True)
@given(fragmented())
def test_the_indexed_path_places_every_gang_as_class_by_class(
    case: tuple[list[HostOffers], list[Gang | list[str]]],
) -> None:
    both_ways(*case)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.floats(-2, 200, allow_nan=False),
            st.floats(-100, 1e6, allow_nan=False),
            st.floats(-100, 1e6, allow_nan=False),
            st.sampled_from([-1.0, 0.0, 0.1, 0.5, 1.0, 2.5, 3.0, 7.0, 8.0]),
            st.integers(0, 50),
        ),
        min_size=1,
        max_size=20,
    ),
    st.tuples(
        st.sampled_from([0.0, 1e-12, 0.1, 0.5, 1.0, 4.0, 16.0]),
        st.sampled_from([0.0, 1.0, 1024.0, 16_000.0]),
        st.sampled_from([0.0, 10.0]),
        st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 8.0]),
    ),
    st.integers(0, 3),
)
def test_the_arrays_hold_what_each_class_holds(
    frees: list[tuple[float, float, float, float, int]],
    task: tuple[float, float, float, float],
    ports: int,
) -> None:
    """The capacity the indexed path computes for every class at once is the class's own."""
    hosts = [
        host(i, Resources(cpu, mem, disk, gpu), nports, "r0", "A100")
        for i, (cpu, mem, disk, gpu, nports) in enumerate(frees)
    ]
    snapshot = engine.Snapshot(hosts)
    table = snapshot._index()
    per = Resources(*task)
    match = np.ones(len(snapshot._attr_sets), bool)
    caps = table.caps(np.arange(table.n), per, ports, match).tolist()
    assert caps == [c.capacity(per, ports) for c in snapshot._by_seq]


def mid_trace(count: int, seed: int) -> list[HostOffers]:
    """A busy cluster: 0-8 free GPUs per host and cpus, memory and ports what running task
    groups leave (as bench_placement's mid-trace scenario), 40 hosts per rack, two models."""
    rng = random.Random(seed)
    hosts = []
    for i in range(count):
        gpus = rng.choices(range(9), weights=[10, 6, 6, 6, 8, 6, 6, 6, 30])[0]
        cpu = 96 - sum(rng.choice([2, 4, 6, 8, 10]) for _ in range(8 - gpus)) - rng.choice([0, 4])
        free = Resources(
            cpu=cpu - 0.1 * rng.randint(0, 3),
            mem_mb=768_000 - 16_000 * rng.randint(0, 30),
            disk_mb=4_000_000,
            gpu=gpus,
        )
        model = "H100" if i % 400 >= 360 else "A100"
        hosts.append(host(i, free, 1000 - rng.randint(0, 30), f"r{i // 40}", model))
    return hosts


def test_a_mid_trace_cluster_places_every_gang_as_class_by_class() -> None:
    """Thousands of classes over 50 racks: racks tried tightest first, the roomiest combined,
    CPU gangs kept off GPU hosts, constraints, spread, and gangs that do not fit."""
    rng = random.Random(1)
    steps: list[Gang | list[str]] = []
    for j in range(240):
        if j % 40 == 39:
            steps.append([f"a{rng.randrange(2000)}" for _ in range(20)])
        gpu = rng.choice([0, 1, 1, 1, 2, 4, 8])
        steps.append(
            gang(
                rng.choice([1, 2, 4, 8, 16, 32, 64, 96] if gpu <= 1 else [1, 2, 4, 8, 16, 40]),
                gpu=gpu,
                cpu=rng.choice([1, 4, 12]),
                mem=16_000,
                ports=rng.choice([0, 1]),
                placement="spread" if j % 17 == 0 else "",
                constraints=[job_pb2.Constraint(attribute="rack", op="in", values=["r3", "r4"])]
                if j % 13 == 0
                else [],
                job=f"m{j}",
            )
        )
    placed = both_ways(mid_trace(2000, 5), steps)
    assert sum(p.hosts is not None for p in placed) > 200
    assert any(p.hosts is None for p in placed)


def test_gangs_that_leave_new_amounts_of_free_gpus_place_as_class_by_class() -> None:
    """A gang of half GPUs leaves hosts with 7.5 free, an amount no host had: the order of
    every class (by free GPUs) moves, and the shapes placed before see it."""
    hosts = [
        host(i, Resources(64, 256_000, 100_000, 8 if i % 3 else 4), 100, f"r{i % 4}", "A100")
        for i in range(90)
    ]
    steps: list[Gang | list[str]] = [
        gang(3, gpu=1, cpu=1, job="a"),
        gang(20, gpu=1, cpu=1, job="b"),
        gang(1, gpu=0.5, cpu=1, job="c"),
        gang(12, gpu=1, cpu=1, job="d"),
        gang(40, gpu=2, cpu=1, job="e"),
        ["a5", "a6", "a7"],
        gang(30, gpu=1, cpu=1, job="f"),
    ]
    placed = both_ways(hosts, steps)
    assert all(p.hosts is not None for p in placed)
