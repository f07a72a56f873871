"""First-fit placement: all or nothing, constraints, executor overhead, ports, reasons."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.core.constraints import matches
from peloton.core.gang import Gang
from peloton.core.offers import HostOffers
from peloton.core.resources import EXECUTOR_RESOURCES, Resources
from peloton.placement.firstfit import place
from peloton.v1 import common_pb2, job_pb2


def gang(n: int, *, cpu: float = 1, gpu: float = 1, ports: int = 0) -> Gang:
    spec = job_pb2.JobSpec(
        name="train",
        instances=n,
        task=job_pb2.TaskSpec(
            command="true",
            resources=common_pb2.Resources(cpu=cpu, mem_mb=256, disk_mb=10, gpu=gpu),
            ports=[f"p{i}" for i in range(ports)],
        ),
    )
    return Gang.of_job("job", spec, tuple(range(n)), datetime(2026, 1, 1, tzinfo=UTC))


def host(name: str, cpu: float = 8, gpu: float = 4, **attrs: str) -> HostOffers:
    return HostOffers(
        hostname=name,
        agent_id=name,  # placement names hosts by agent id
        free=Resources(cpu=cpu, mem_mb=32768, disk_mb=100000, gpu=gpu),
        ports=((31000, 31009),),
        attributes=attrs,
    )


def test_fills_the_first_host_then_the_next() -> None:
    p = place(gang(6), [host("a"), host("b")])
    assert p.hosts == ("a", "a", "a", "a", "b", "b")


def test_all_or_nothing_with_a_reason() -> None:
    p = place(gang(9), [host("a"), host("b")])
    assert p.hosts is None
    assert "only 8 of 9 tasks" in p.reason and "gpu 1" in p.reason


def test_the_executor_is_charged_once_per_host() -> None:
    # 2 cpus free: one 1.95-cpu task + the executor's 0.1 don't fit, a 1.9-cpu one does.
    assert place(gang(1, cpu=1.95, gpu=0), [host("a", cpu=2)]).hosts is None
    assert place(gang(1, cpu=1.9, gpu=0), [host("a", cpu=2)]).hosts == ("a",)
    assert EXECUTOR_RESOURCES.disk_mb > 0


def test_constraints_filter_hosts() -> None:
    g = gang(2)
    g.spec.task.constraints.add(attribute="gpu_model", op="in", values=["H100"])
    hosts = [host("a", gpu_model="A100"), host("b", gpu_model="H100")]
    assert place(g, hosts).hosts == ("b", "b")
    assert "matches the task constraints" in place(g, hosts[:1]).reason


def test_ports_are_counted() -> None:
    assert place(gang(3, gpu=0, ports=4), [host("a"), host("b")]).hosts == ("a", "a", "b")


def test_no_offers_says_so() -> None:
    assert "no host offers" in place(gang(1), []).reason


@given(
    st.integers(1, 12),
    st.lists(st.tuples(st.integers(0, 8), st.integers(0, 4)), max_size=5),
)
def test_a_placement_never_overcommits_a_host(n: int, frees: list[tuple[int, int]]) -> None:
    hosts = [host(f"h{i}", cpu=c, gpu=g) for i, (c, g) in enumerate(frees)]
    g = gang(n)
    p = place(g, hosts)
    if p.hosts is None:
        assert p.reason
        return
    assert len(p.hosts) == n
    for h in hosts:
        k = p.hosts.count(h.hostname)
        if k:
            need = g.per_task.scale(k) + EXECUTOR_RESOURCES
            assert need.fits_in(h.free)


# ---------------------------------------------------------------------------- any_of (OR)


def leaf(attribute: str, op: str, *values: str) -> job_pb2.Constraint:
    return job_pb2.Constraint(attribute=attribute, op=op, values=values)


def any_of(*branches: job_pb2.Constraint) -> job_pb2.Constraint:
    return job_pb2.Constraint(any_of=branches)


def test_any_of_holds_when_one_branch_does_and_the_list_stays_and() -> None:
    model = leaf("gpu_model", "in", "A100", "H100")
    rack_or_zone = any_of(leaf("rack", "eq", "r1"), leaf("zone", "exists"))
    assert matches([model, rack_or_zone], {"gpu_model": "A100", "rack": "r1"})
    assert matches([model, rack_or_zone], {"gpu_model": "H100", "rack": "r2", "zone": "z"})
    assert not matches([model, rack_or_zone], {"gpu_model": "A100", "rack": "r2"})
    assert not matches([model, rack_or_zone], {"gpu_model": "V100", "rack": "r1"})
    assert not matches([any_of(leaf("ssd", "exists"))], {})


def test_an_any_of_constraint_filters_hosts() -> None:
    g = gang(2)
    g.spec.task.constraints.append(any_of(leaf("rack", "eq", "r2"), leaf("rack", "eq", "r3")))
    hosts = [host("a", rack="r1"), host("b", rack="r3")]
    assert place(g, hosts).hosts == ("b", "b")


ATTRIBUTES = st.dictionaries(
    st.sampled_from(["rack", "zone", "gpu_model"]), st.sampled_from(["a", "b", "c"]), max_size=3
)
LEAVES = st.builds(
    leaf,
    st.sampled_from(["rack", "zone", "gpu_model"]),
    st.sampled_from(["in", "not_in", "eq", "exists"]),
    *[st.sampled_from(["a", "b"])] * 2,
).map(lambda c: c if c.op != "exists" else leaf(c.attribute, "exists"))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(LEAVES, max_size=4),
    st.lists(st.lists(LEAVES, min_size=1, max_size=4), max_size=3),
    ATTRIBUTES,
)
def test_any_of_is_the_or_of_its_branches(
    plain: list[job_pb2.Constraint],
    ors: list[list[job_pb2.Constraint]],
    attributes: dict[str, str],
) -> None:
    constraints = plain + [any_of(*branches) for branches in ors]
    expected = matches(plain, attributes) and all(
        any(matches([b], attributes) for b in branches) for branches in ors
    )
    assert matches(constraints, attributes) == expected
