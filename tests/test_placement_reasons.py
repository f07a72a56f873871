"""Why a gang waits: pending reasons that name what binds, ``never_fits`` on the cluster's totals,
and GPU fragmentation."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from test_placement_engine import clusters, gang, host

from peloton.core.constraints import matches
from peloton.core.gang import Gang
from peloton.core.offers import HostOffers
from peloton.core.resources import EXECUTOR_RESOURCES, Resources
from peloton.placement import engine
from peloton.v1 import job_pb2


def reason(g: Gang, hosts: list[HostOffers]) -> str:
    p = engine.place(g, hosts)
    assert p.hosts is None
    return p.reason


# ---------------------------------------------------------------------------- pending reasons


def test_host_bound_names_the_hosts_needed_and_had() -> None:
    hosts = [host("a", 8), host("b", 4), host("c", 3)]
    assert reason(gang(3, gpu=8), hosts) == (
        "needs 3 hosts with 8 free A100 GPUs; 1 host has them (the rest have at most 4)"
    )


def test_host_bound_over_gpu_models_names_the_best_model() -> None:
    hosts = [host("a", 8, model="A100"), host("h1", 8, model="H100"), host("h2", 8, model="H100")]
    assert reason(gang(3, gpu=8), hosts) == (
        "needs 3 hosts with 8 free GPUs of one model; 2 H100 hosts have them"
    )


def test_rack_bound_names_the_rack_constraint() -> None:
    in_r1 = [job_pb2.Constraint(attribute="rack", op="eq", values=["r1"])]
    hosts = [host("a", 8), host("b", 8), host("c", 4)]
    hosts += [host(f"r2-{i}", 8, rack="r2") for i in range(5)]
    assert reason(gang(4, gpu=8, constraints=in_r1), hosts) == (
        "needs 4 hosts with 8 free A100 GPUs; 2 hosts have them (the rest have at most 4); "
        "rack eq r1 rules out 5 more hosts with room"
    )


def test_room_bound_names_what_the_hosts_hold() -> None:
    # 15 free GPUs, but in 5s: three hosts hold only six 2-GPU tasks.
    hosts = [host("a", 5), host("b", 5), host("c", 5)]
    assert reason(gang(7, gpu=2), hosts) == (
        "needs 7 tasks of gpu 2, cpu 1, mem_mb 1024 on one GPU model; "
        "the hosts with free A100 GPUs hold 6 (largest host 2)"
    )
    # A task per host, but too few hosts.
    assert (
        reason(gang(4, gpu=2), [host("a", 3), host("b", 3)])
        == "needs 4 hosts with 2 free A100 GPUs; 2 hosts have them"
    )


def test_a_cpu_bound_host_is_not_blamed_on_gpus() -> None:
    hosts = [host("a", 8, cpu=64), host("b", 8, cpu=2)]
    assert reason(gang(2, gpu=8, cpu=8), hosts) == (
        "needs 2 hosts with room for a task (gpu 8, cpu 8, mem_mb 1024); 1 host has it"
    )


def test_cpus_that_bind_are_named_not_the_gpus_hosts_have_plenty_of() -> None:
    # Two 8-cpu, 4-GPU hosts and a gang of four 4-cpu one-GPU tasks: GPUs are plenty, the
    # cpus hold one task per host (two would need 8 plus the executor's 0.1).
    hosts = [host("a", 4, cpu=8), host("b", 4, cpu=8)]
    assert reason(gang(4, gpu=1, cpu=4), hosts) == (
        "needs 4 tasks of gpu 1, cpu 4, mem_mb 1024; the hosts with room hold 2 (1 each): "
        "cpus binds: a task needs 4 cpus plus 0.1 for the executor; a host has 8 free"
    )
    assert engine.never_fits(gang(4, gpu=1, cpu=4), hosts) == (
        "needs 4 tasks of gpu 1, cpu 4, mem_mb 1024; the hosts with room hold 2 (1 each): "
        "cpus binds: a task needs 4 cpus plus 0.1 for the executor; a host has 8"
    )


def test_a_task_too_big_in_several_kinds_names_each() -> None:
    assert reason(gang(1, gpu=16, cpu=128), [host("a", 8, cpu=64, ports=0)]) == (
        "task needs 128 cpus; the largest host has 64 free; and task needs 16 GPUs; the largest "
        "host has 8 free; and task needs 1 port (0 named, 1 for PELOTON_PEERS); the largest "
        "host has 0 free"
    )


def test_ports_that_bind_are_named() -> None:
    hosts = [host("a", 8, ports=3), host("b", 8, ports=3)]
    assert reason(gang(3, gpu=1, ports=2), hosts) == (
        "needs 3 tasks of gpu 1, cpu 1, mem_mb 1024; the hosts with room hold 2 (1 each): "
        "ports binds: a task needs 3 ports; a host has 3 free"
    )


# Words of a reason that name a resource kind as what binds (not the request's own listing).
_NAMED = {"cpus": "cpu", "GPU": "gpu", "memory": "mem_mb", "disk": "disk_mb"}


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_the_resource_a_reason_names_is_one_that_binds(
    case: tuple[list[HostOffers], list[Gang]],
) -> None:
    """Whatever resource a pending reason names binds: asking for less of it would let more
    tasks on a host that has room for some (it is what runs out first there), or, where no host
    has room for one task, no host has enough of it."""
    hosts, gangs = case
    classes = engine.Snapshot(hosts).classes()
    for g in gangs:
        placed = engine.place(g, hosts)
        if placed.hosts is not None:
            continue
        said = placed.reason.split(" rules out")[0]  # not the constraints' part
        named = {kind for word, kind in _NAMED.items() if word in said}
        per, nports = g.per_task, g.ports_per_task
        matching = [c for c in classes if matches(g.spec.task.constraints, c.attributes)]
        roomy = [c for c in matching if c.capacity(per, nports) > 0]
        binders = {b for c in roomy for b in c.binders(per, nports)}
        for kind in named:
            if roomy:
                assert kind in binders, (placed.reason, kind, binders)
            else:
                need = per.get(kind) + EXECUTOR_RESOURCES.get(kind)
                assert all(need > c.free.get(kind) for c in matching), (placed.reason, kind)


def test_too_big_names_the_kind_and_the_executor_share() -> None:
    assert reason(gang(1, gpu=16), [host("a", 8)]) == (
        "task needs 16 GPUs; the largest host has 8 free"
    )
    assert reason(gang(1, gpu=1, cpu=64), [host("a", 8, cpu=64)]) == (
        "task needs 64 cpus plus 0.1 for the executor; the largest host has 64 free"
    )
    assert reason(gang(1, ports=3), [host("a", 8, ports=2)]) == (
        "task needs 4 ports (3 named, 1 for PELOTON_PEERS); the largest host has 2 free"
    )


def test_any_of_constraints_are_named_as_written() -> None:
    either = job_pb2.Constraint(
        any_of=[
            job_pb2.Constraint(attribute="rack", op="in", values=["r3", "r4"]),
            job_pb2.Constraint(attribute="ssd", op="exists"),
        ]
    )
    hosts = [host("a", 8, rack="r1"), host("b", 2, rack="r3")]
    assert reason(gang(2, gpu=2, constraints=[either]), hosts) == (
        "needs 2 hosts with 2 free A100 GPUs; 1 host has them; "
        "any_of(rack in [r3, r4] or ssd exists) rules out 1 more host with room"
    )


# ---------------------------------------------------------------------------- never_fits


def test_never_fits_an_oversized_task() -> None:
    assert engine.never_fits(gang(2, gpu=16), [host("a", 8), host("b", 8)]) == (
        "task needs 16 GPUs; the largest host has 8"
    )


def test_never_fits_unmatched_constraints() -> None:
    need_h100 = [job_pb2.Constraint(attribute="gpu_model", op="eq", values=["H100"])]
    assert engine.never_fits(gang(1, constraints=need_h100), [host("a", 8), host("b", 8)]) == (
        "none of 2 hosts matches the task constraints"
    )


def test_never_fits_a_gpu_model_group_too_small() -> None:
    hosts = [host(f"a{i}", 8, model="A100") for i in range(4)]
    hosts += [host(f"h{i}", 8, model="H100") for i in range(2)]
    assert engine.never_fits(gang(40), hosts) == (
        "needs 40 GPUs on one GPU model; the A100 hosts have 32"
    )
    assert engine.never_fits(gang(32), hosts) is None


def test_never_fits_an_empty_cluster() -> None:
    assert engine.never_fits(gang(1), []) == "the cluster has no hosts"


def test_not_now_is_not_never() -> None:
    busy = [host("a", 2), host("b", 2)]
    totals = [host("a", 8), host("b", 8)]
    assert engine.place(gang(8), busy).hosts is None
    assert engine.never_fits(gang(8), totals) is None


@settings(max_examples=150, deadline=None, derandomize=True)
@given(clusters())
def test_never_fits_is_none_exactly_when_the_empty_cluster_takes_the_gang(
    case: tuple[list[HostOffers], list[Gang]],
) -> None:
    hosts, gangs = case
    for g in gangs:
        why = engine.never_fits(g, hosts)
        placed = engine.place(g, hosts)
        assert (why is None) == (placed.hosts is not None)
        if why is not None:
            assert why and "free" not in why  # phrased for totals, not for free offers


@settings(max_examples=150, deadline=None, derandomize=True)
@given(clusters(), st.data())
def test_a_gang_that_fits_some_free_offers_never_never_fits_the_totals(
    case: tuple[list[HostOffers], list[Gang]], data: st.DataObject
) -> None:
    totals, gangs = case
    # What is free now: a share of each host's totals, per kind.
    share = st.floats(0, 1)
    free = [
        replace(h, free=Resources(*(v * data.draw(share) for _, v in h.free.items())))
        for h in totals
    ]
    for g in gangs:
        if engine.place(g, free).hosts is not None:
            assert engine.never_fits(g, totals) is None


# ---------------------------------------------------------------------------- fragmentation


def test_gpu_fragmentation() -> None:
    hosts = [host("a", 8), host("b", 3), host("c", 1), host("d", 0)]
    assert engine.gpu_fragmentation(hosts, 4) == 4 / 12  # b's 3 and c's 1 can't hold 4
    assert engine.gpu_fragmentation(hosts, 1) == 0.0
    assert engine.gpu_fragmentation(hosts, 0) == 0.0  # nothing waits for GPUs
    assert engine.gpu_fragmentation(hosts, 16) == 1.0
    assert engine.gpu_fragmentation([host("d", 0)], 4) == 0.0  # no free GPUs at all
    assert engine.gpu_fragmentation([], 4) == 0.0
