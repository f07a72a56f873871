"""The placement engine: all or nothing, best-fit GPU packing, few hosts and racks, GPU models."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.core.gang import Gang, Placement
from peloton.core.offers import HostOffers
from peloton.core.resources import EXECUTOR_RESOURCES, Resources
from peloton.placement import engine, firstfit
from peloton.v1 import common_pb2, job_pb2

AT = datetime(2026, 1, 1, tzinfo=UTC)


def host(name: str, gpu: float, *, cpu: float = 64, rack: str = "r1", model: str = "A100",
         ports: int = 100) -> HostOffers:  # fmt: skip
    attrs = {"rack": rack}
    if model:
        attrs["gpu_model"] = model
    return HostOffers(
        hostname=name,
        agent_id=name,  # placement names hosts by agent id
        free=Resources(cpu=cpu, mem_mb=256_000, disk_mb=1_000_000, gpu=gpu),
        ports=((31000, 31000 + ports - 1),) if ports else (),
        attributes=attrs,
    )


def gang(tasks: int, gpu: float = 1, *, cpu: float = 1, job: str = "job",
         constraints: list[job_pb2.Constraint] | None = None, ports: int = 0,
         placement: str = "") -> Gang:  # fmt: skip
    spec = job_pb2.JobSpec(
        name=job,
        instances=tasks,
        placement=placement,
        task=job_pb2.TaskSpec(
            command="train",
            resources=common_pb2.Resources(cpu=cpu, mem_mb=1024, gpu=gpu),
            constraints=constraints or [],
            ports=[f"p{i}" for i in range(ports)],
        ),
    )
    return Gang.of_job(job, spec, tuple(range(tasks)), AT)


def hosts_of(p: Placement) -> Counter[str]:
    assert p.hosts is not None, p.reason
    return Counter(p.hosts)


def test_best_fit_keeps_a_whole_8_gpu_host_whole() -> None:
    hosts = [host("whole", 8), host("three-left", 3), host("two-left", 2)]
    assert hosts_of(engine.place(gang(2), hosts)) == {"two-left": 2}
    # First fit, the baseline, breaks the whole host open.
    assert hosts_of(firstfit.place(gang(2), hosts)) == {"whole": 2}
    # Five 1-GPU gangs fill the partly used hosts before touching the whole one.
    placed = engine.place_round([gang(1, job=f"j{i}") for i in range(5)], hosts)
    assert Counter(h for p in placed for h in (p.hosts or ())) == {"two-left": 2, "three-left": 3}


def test_a_gang_goes_on_as_few_hosts_as_possible() -> None:
    hosts = [host("a", 4), host("b", 8), host("c", 4)]
    assert hosts_of(engine.place(gang(8), hosts)) == {"b": 8}
    assert len(hosts_of(engine.place(gang(12), hosts))) == 2


def test_one_rack_when_one_rack_can_hold_it() -> None:
    hosts = [
        host("r1-a", 4, rack="r1"),
        host("r2-a", 4, rack="r2"),
        host("r1-b", 4, rack="r1"),
        host("r2-b", 2, rack="r2"),
    ]
    # Both racks hold 6 on two hosts; r2 leaves no GPU idle on the hosts it uses.
    assert hosts_of(engine.place(gang(6), hosts)) == {"r2-a": 4, "r2-b": 2}
    assert set(hosts_of(engine.place(gang(8), hosts))) == {"r1-a", "r1-b"}
    # No rack holds 10: the two roomiest racks together.
    assert sum(hosts_of(engine.place(gang(10), hosts)).values()) == 10


def test_ranks_are_contiguous_per_host() -> None:
    p = engine.place(gang(10), [host("a", 8), host("b", 8)])
    assert p.hosts is not None
    assert list(p.hosts) == sorted(p.hosts, key=p.hosts.index)  # grouped by host


def test_a_gpu_gang_runs_on_one_gpu_model() -> None:
    hosts = [host("a100", 4, model="A100"), host("h100", 4, model="H100")]
    p = engine.place(gang(6), hosts)
    assert p.hosts is None
    assert p.reason == "needs 6 GPUs on one GPU model; the A100 hosts have 4 free"
    assert len(set(hosts_of(engine.place(gang(4), hosts)))) == 1
    only_h100 = [job_pb2.Constraint(attribute="gpu_model", op="in", values=["H100"])]
    assert hosts_of(engine.place(gang(2, constraints=only_h100), hosts)) == {"h100": 2}


def test_cpu_tasks_keep_off_gpu_hosts_unless_nothing_else_fits() -> None:
    hosts = [host("gpu-box", 8, cpu=64), host("cpu-box", 0, cpu=8, model="")]
    assert hosts_of(engine.place(gang(2, gpu=0, cpu=2), hosts)) == {"cpu-box": 2}
    assert "gpu-box" in hosts_of(engine.place(gang(6, gpu=0, cpu=2), hosts))


def test_ports_and_the_executor_share_limit_a_host() -> None:
    p = engine.place(gang(2, ports=2), [host("a", 8, ports=3), host("b", 8, ports=3)])
    assert hosts_of(p) == {"a": 1, "b": 1}
    cpu_bound = host("c", 8, cpu=2 + EXECUTOR_RESOURCES.cpu)
    assert hosts_of(engine.place(gang(2, cpu=1), [cpu_bound])) == {"c": 2}
    assert engine.place(gang(3, cpu=1), [cpu_bound]).hosts is None


def test_two_gangs_racing_for_the_same_hosts_never_both_half_place() -> None:
    hosts = [host("a", 4), host("b", 4)]
    first, second = engine.place_round([gang(6, job="x"), gang(6, job="y")], hosts)
    assert first.hosts is not None and len(first.hosts) == 6
    assert second.hosts is None  # not 2 of 6: nothing
    assert second.reason == "needs 6 GPUs on one GPU model; the A100 hosts have 2 free"


def test_reasons_name_what_binds() -> None:
    assert "no host offers" in engine.place(gang(1), []).reason
    need_h100 = [job_pb2.Constraint(attribute="gpu_model", op="eq", values=["H100"])]
    assert "matches the task constraints" in engine.place(gang(1, constraints=need_h100),
                                                          [host("a", 8)]).reason  # fmt: skip
    assert engine.place(gang(1, gpu=2), [host("a", 1)]).reason == (
        "task needs 2 GPUs; the largest host has 1 free"
    )


# ---------------------------------------------------------------------------- properties


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[HostOffers], list[Gang]]:
    hosts = [
        host(
            f"h{i}",
            draw(st.integers(0, 8)),
            cpu=draw(st.integers(1, 32)),
            rack=draw(st.sampled_from(["r1", "r2", "r3"])),
            model=draw(st.sampled_from(["A100", "H100", ""])),
            ports=draw(st.integers(0, 6)),
        )
        for i in range(draw(st.integers(0, 12)))
    ]
    gangs = [
        gang(
            draw(st.integers(1, 12)),
            gpu=draw(st.sampled_from([0, 1, 2, 4])),
            cpu=draw(st.sampled_from([0.5, 1, 4])),
            ports=draw(st.integers(0, 2)),
            job=f"g{j}",
            placement=draw(st.sampled_from(["", "pack", "spread"])),
        )
        for j in range(draw(st.integers(1, 6)))
    ]
    return hosts, gangs


@settings(max_examples=150, deadline=None, derandomize=True)
@given(clusters())
def test_a_round_never_overcommits_and_places_whole_gangs(
    case: tuple[list[HostOffers], list[Gang]],
) -> None:
    hosts, gangs = case
    placements = engine.place_round(gangs, hosts)
    by_name = {h.hostname: h for h in hosts}
    used = {h.hostname: Resources() for h in hosts}
    ports = Counter[str]()
    for g, p in zip(gangs, placements, strict=True):
        if p.hosts is None:
            assert p.reason
            continue
        assert len(p.hosts) == g.size  # whole gang
        counts = Counter(p.hosts)
        for name, n in counts.items():
            used[name] = used[name] + g.per_task.scale(n) + EXECUTOR_RESOURCES
            ports[name] += n * len(g.spec.task.ports)
        if g.per_task.gpu > 0:  # one GPU model per gang
            assert len({by_name[h].attributes.get("gpu_model") for h in counts}) == 1
    for name, amount in used.items():
        assert amount.fits_in(by_name[name].free), (name, amount, by_name[name].free)
        assert ports[name] <= sum(e - b + 1 for b, e in by_name[name].ports)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(clusters())
def test_whenever_first_fit_places_a_lone_gang_the_engine_does_too(
    case: tuple[list[HostOffers], list[Gang]],
) -> None:
    hosts, gangs = case
    one_model = [h for h in hosts if h.attributes.get("gpu_model") == "A100"]
    for g in gangs:
        # CPU gangs anywhere; GPU gangs where first fit cannot mix GPU models either.
        pool = hosts if g.per_task.gpu == 0 else one_model
        ours, baseline = engine.place(g, pool), firstfit.place(g, pool)
        if baseline.hosts is not None:
            assert ours.hosts is not None
            # CPU gangs trade host count for keeping off GPU hosts; spread ones use more hosts.
            if g.per_task.gpu > 0 and g.spec.placement != "spread":
                assert len(set(ours.hosts)) <= len(set(baseline.hosts))
