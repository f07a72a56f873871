"""``placement: spread``: a task per host where possible, over many racks, roomiest hosts first,
evenly when hosts are fewer than tasks; whole gangs, constraints, one GPU model, CPU tier."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from test_placement_engine import gang, host, hosts_of

from peloton.placement import engine
from peloton.v1 import job_pb2

NINE = [host(f"r{r}-{i}", 8, rack=f"r{r}") for r in range(3) for i in range(3)]


def test_one_task_per_host_over_every_rack() -> None:
    placed = hosts_of(engine.place(gang(4, placement="spread"), NINE))
    assert set(placed.values()) == {1}
    assert {name[:2] for name in placed} == {"r0", "r1", "r2"}
    # Pack, the default, puts the same gang on one host.
    assert len(hosts_of(engine.place(gang(4), NINE))) == 1
    assert len(hosts_of(engine.place(gang(4, placement="pack"), NINE))) == 1


def test_the_roomiest_hosts_first() -> None:
    hosts = [host("small", 2), host("big", 8), host("mid", 5)]
    assert hosts_of(engine.place(gang(2, placement="spread"), hosts)) == {"big": 1, "mid": 1}


def test_more_racks_beat_more_room() -> None:
    hosts = [host("a", 8, rack="r1"), host("b", 8, rack="r1"), host("c", 1, rack="r2")]
    assert hosts_of(engine.place(gang(2, placement="spread"), hosts)) == {"a": 1, "c": 1}


def test_evenly_when_hosts_are_fewer_than_tasks() -> None:
    hosts = [host("a", 8), host("b", 8), host("c", 8)]
    placed = hosts_of(engine.place(gang(7, placement="spread"), hosts))
    assert sorted(placed.values()) == [2, 2, 3]  # at most ceil(7 / 3) per host
    # A host with little room takes what it can; the others share the rest evenly.
    hosts = [host("a", 8), host("small", 1), host("c", 8)]
    assert hosts_of(engine.place(gang(9, placement="spread"), hosts)) == {
        "a": 4,
        "small": 1,
        "c": 4,
    }


def test_still_all_or_nothing() -> None:
    p = engine.place(gang(19, placement="spread"), [host("a", 8), host("b", 2), host("c", 8)])
    assert p.hosts is None and p.reason


def test_constraints_one_gpu_model_and_the_cpu_tier_hold() -> None:
    hosts = [host("a1", 8, model="A100"), host("a2", 8, model="A100"), host("h1", 8, model="H100")]
    # One model: two A100 hosts beat three hosts of mixed models.
    assert hosts_of(engine.place(gang(3, placement="spread"), hosts)) == {"a1": 2, "a2": 1}
    only_h100 = [job_pb2.Constraint(attribute="gpu_model", op="eq", values=["H100"])]
    placed = engine.place(gang(2, constraints=only_h100, placement="spread"), hosts)
    assert hosts_of(placed) == {"h1": 2}
    # CPU tasks keep off GPU hosts while the CPU hosts hold them.
    hosts = [host("gpu", 8), host("cpu1", 0, model=""), host("cpu2", 0, model="")]
    assert hosts_of(engine.place(gang(4, gpu=0, placement="spread"), hosts)) == {
        "cpu1": 2,
        "cpu2": 2,
    }


def test_ranks_are_contiguous_per_host() -> None:
    p = engine.place(gang(20, placement="spread"), NINE)
    assert p.hosts is not None
    assert list(p.hosts) == sorted(p.hosts, key=p.hosts.index)


# ---------------------------------------------------------------------------- properties

# GPUs bind (cpu, memory and ports are ample), so a host holds free GPUs // per-task GPUs.
GPU_HOSTS = st.lists(
    st.tuples(st.integers(0, 8), st.sampled_from(["r1", "r2", "r3", "r4"])), max_size=12
)


def lowest_level(caps: list[int], n: int) -> int:
    """The fewest tasks per host at which hosts of these capacities hold ``n``."""
    return next(level for level in range(1, n + 1) if sum(min(c, level) for c in caps) >= n)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(GPU_HOSTS, st.integers(1, 24), st.sampled_from([1, 2, 4]))
def test_spread_is_as_even_and_as_wide_as_the_hosts_allow(
    layout: list[tuple[int, str]], n: int, gpu: int
) -> None:
    hosts = [host(f"h{i}", free, rack=rack) for i, (free, rack) in enumerate(layout)]
    caps = {h.hostname: int(h.free.gpu) // gpu for h in hosts}
    usable = [h for h in hosts if caps[h.hostname] > 0]
    p = engine.place(gang(n, gpu=gpu, placement="spread"), hosts)
    if sum(caps.values()) < n:
        assert p.hosts is None
        return
    placed = hosts_of(p)
    assert sum(placed.values()) == n
    assert all(k <= caps[name] for name, k in placed.items())  # never overcommits
    assert max(placed.values()) == lowest_level(list(caps.values()), n)
    even = math.ceil(n / len(usable))
    if all(caps[h.hostname] >= even for h in usable):
        assert max(placed.values()) <= even
    if n <= len(usable):  # distinct hosts, over as many racks as there are
        assert len(placed) == n
        rack = {h.hostname: h.attributes["rack"] for h in hosts}
        assert len({rack[name] for name in placed}) == min(
            n, len({rack[h.hostname] for h in usable})
        )


@settings(max_examples=100, deadline=None, derandomize=True)
@given(GPU_HOSTS, st.integers(1, 24))
def test_spread_places_exactly_when_pack_does(layout: list[tuple[int, str]], n: int) -> None:
    hosts = [host(f"h{i}", free, rack=rack) for i, (free, rack) in enumerate(layout)]
    spread = engine.place(gang(n, placement="spread"), hosts)
    pack = engine.place(gang(n), hosts)
    assert (spread.hosts is None) == (pack.hosts is None)
    assert spread.reason == pack.reason
    if spread.hosts is not None:
        assert Counter(spread.hosts).total() == n
