"""Entitlement: hierarchical weighted max-min sharing, checked by example and by property."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.core.pools import ROOT, KindConfig, Policy, PoolConfig
from peloton.core.resources import Resources
from peloton.resmgr.entitlement import Calculator, water_fill
from peloton.resmgr.pool import PoolTree

TOL = 1e-6


def gpu_pool(path: str, reservation: float = 0, limit: float = math.inf, share: float = 1,
             policy: Policy = Policy.ELASTIC) -> PoolConfig:  # fmt: skip
    return PoolConfig(path, kinds={"gpu": KindConfig(reservation, limit, share, policy)})


def gpus(tree: PoolTree, capacity: float, demand: dict[str, float]) -> dict[str, float]:
    ents = Calculator(tree).compute(
        Resources(gpu=capacity), {p: Resources(gpu=d) for p, d in demand.items()}
    )
    return {p: round(r.gpu, 6) for p, r in ents.entitlement.items()}


def test_reservation_first_then_share_of_the_rest() -> None:
    tree = PoolTree([gpu_pool("/a", 8, share=2), gpu_pool("/b", 4, share=1)])
    ent = gpus(tree, 32, {"/a": 100, "/b": 100})
    # 12 reserved, 20 left split 2:1.
    assert ent == {ROOT: 32, "/a": round(8 + 20 * 2 / 3, 6), "/b": round(4 + 20 / 3, 6)}


def test_idle_reservation_is_lent_and_capped_demand_redistributed() -> None:
    tree = PoolTree([gpu_pool("/a", 16), gpu_pool("/b", 0), gpu_pool("/c", 0, limit=4)])
    ent = gpus(tree, 32, {"/a": 2, "/b": 100, "/c": 100})
    assert ent == {ROOT: 32, "/a": 2, "/b": 26, "/c": 4}


def test_static_reservation_is_kept_whatever_the_demand() -> None:
    tree = PoolTree([gpu_pool("/a", 8, policy=Policy.STATIC), gpu_pool("/b")])
    ent = gpus(tree, 16, {"/b": 100})
    assert ent == {ROOT: 16, "/a": 8, "/b": 8}


def test_leftover_is_lent_by_share_up_to_limits() -> None:
    tree = PoolTree([gpu_pool("/a", limit=4), gpu_pool("/b", share=3)])
    ent = gpus(tree, 16, {"/a": 1, "/b": 1})
    # Demands met (1 each), 14 left: by share 3.5 / 10.5, but /a stops at its limit 4.
    assert ent == {ROOT: 16, "/a": 4, "/b": 12}


def test_hierarchy_splits_a_parent_entitlement_among_its_children() -> None:
    tree = PoolTree(
        [
            gpu_pool("/research", 8),
            gpu_pool("/research/vision", 6),
            gpu_pool("/research/nlp", 2),
            gpu_pool("/prod", 8),
        ]
    )
    ent = gpus(tree, 16, {"/research/vision": 10, "/research/nlp": 10, "/prod": 0})
    assert ent["/prod"] == 0
    assert ent["/research"] == 16
    assert ent["/research/vision"] + ent["/research/nlp"] == pytest.approx(16)
    assert ent["/research/vision"] == pytest.approx(6 + 4)


def test_over_reserved_top_level_is_scaled_to_the_cluster() -> None:
    tree = PoolTree([gpu_pool("/a", 16), gpu_pool("/b", 16)])
    ent = gpus(tree, 8, {"/a": 100, "/b": 100})
    assert ent == {ROOT: 8, "/a": 4, "/b": 4}


def test_water_fill() -> None:
    assert water_fill(10, [2, 100, 100], [1, 1, 2]) == pytest.approx([2, 8 / 3, 16 / 3])
    assert water_fill(10, [1, 1], [1, 1]) == [1, 1]
    assert water_fill(0, [5], [1]) == [0]


# ---------------------------------------------------------------------------- properties


@st.composite
def trees(draw: st.DrawFn) -> tuple[PoolTree, float, dict[str, float]]:
    """A random two-level GPU pool tree that passes validation, a capacity and leaf demands."""
    capacity = draw(st.integers(0, 64))
    pools: list[PoolConfig] = []
    parents = draw(st.integers(1, 4))
    for i in range(parents):
        limit = draw(st.sampled_from([math.inf, 8, 16, 48]))
        kids = draw(st.integers(0, 3))
        child_res = [draw(st.integers(0, 4)) for _ in range(kids)]
        reservation = min(limit, sum(child_res) + draw(st.integers(0, 4)))
        child_res = [min(r, reservation) for r in child_res]
        while sum(child_res) > reservation:
            child_res[child_res.index(max(child_res))] -= 1
        policy = draw(st.sampled_from([Policy.ELASTIC, Policy.STATIC]))
        share = draw(st.sampled_from([1, 2, 3]))
        pools.append(gpu_pool(f"/p{i}", reservation, limit, share, policy))
        for j, r in enumerate(child_res):
            climit = draw(st.sampled_from([math.inf, 4, 8]))
            climit = max(climit, r) if math.isinf(limit) else max(min(climit, limit), r)
            pools.append(gpu_pool(f"/p{i}/c{j}", r, climit, draw(st.sampled_from([1, 2]))))
    tree = PoolTree(pools)
    demand = {leaf: float(draw(st.integers(0, 40))) for leaf in tree.leaves()}
    return tree, float(capacity), demand


@settings(max_examples=300, deadline=None)
@given(trees())
def test_conservation_limits_and_guarantees(case: tuple[PoolTree, float, dict[str, float]]) -> None:
    tree, capacity, demand = case
    ents = Calculator(tree).compute(
        Resources(gpu=capacity), {p: Resources(gpu=d) for p, d in demand.items()}
    )
    ent = {p: r.gpu for p, r in ents.entitlement.items()}
    rolled = {p: r.gpu for p, r in ents.demand.items()}
    assert ent[ROOT] == capacity
    for path, _ in tree.walk():
        kids = tree.children(path)
        assert ent[path] >= -TOL
        if kids:
            # Conservation: children never get more than their parent.
            assert sum(ent[c] for c in kids) <= ent[path] + TOL
        if path == ROOT:
            continue
        assert ent[path] <= tree.limit(path, "gpu") + TOL
    reserved_top = sum(tree.get(p).kind("gpu").reservation for p in tree.children(ROOT))
    for path in tree.children(ROOT):
        kc = tree.get(path).kind("gpu")
        floor = kc.reservation if kc.policy is Policy.STATIC else min(rolled[path], kc.reservation)
        if reserved_top <= capacity:
            # Guaranteed minimum, whenever the cluster can honour every reservation.
            assert ent[path] >= floor - TOL


@settings(max_examples=300, deadline=None)
@given(trees())
def test_no_idle_capacity_while_allowed_demand_waits(
    case: tuple[PoolTree, float, dict[str, float]],
) -> None:
    tree, capacity, demand = case
    ents = Calculator(tree).compute(
        Resources(gpu=capacity), {p: Resources(gpu=d) for p, d in demand.items()}
    )
    ent = {p: r.gpu for p, r in ents.entitlement.items()}
    rolled = {p: r.gpu for p, r in ents.demand.items()}
    for path, _ in tree.walk():
        kids = tree.children(path)
        if not kids:
            continue
        unmet = [c for c in kids if ent[c] < rolled[c] - TOL]
        if unmet:
            # Work conservation: a child still short means the parent gave away everything.
            assert sum(ent[c] for c in kids) == pytest.approx(ent[path], abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 30), min_size=2, max_size=5),
    st.integers(1, 60),
    st.integers(0, 4),
)
def test_more_share_never_means_less(demands: list[int], capacity: int, who: int) -> None:
    who %= len(demands)
    pools = [gpu_pool(f"/p{i}") for i in range(len(demands))]
    demand = {f"/p{i}": float(d) for i, d in enumerate(demands)}
    before = gpus(PoolTree(pools), capacity, demand)
    pools[who] = gpu_pool(f"/p{who}", share=3)
    after = gpus(PoolTree(pools), capacity, demand)
    assert after[f"/p{who}"] >= before[f"/p{who}"] - TOL


def test_a_thousand_pools_compute_quickly_enough_to_run_every_change() -> None:
    # Behaviour at scale (the figure is measured by `make bench`): every pool gets an answer.
    pools = [PoolConfig(f"/t{i}") for i in range(20)]
    pools += [PoolConfig(f"/t{i}/l{j}") for i in range(20) for j in range(49)]
    tree = PoolTree(pools)
    demand = {leaf: Resources(cpu=4, gpu=1, mem_mb=1024, disk_mb=10) for leaf in tree.leaves()}
    ents = Calculator(tree).compute(Resources(cpu=4000, gpu=500, mem_mb=1e6, disk_mb=1e5), demand)
    assert len(ents.entitlement) == 1001
    assert sum(ents.entitlement[p].gpu for p in tree.children(ROOT)) == pytest.approx(500)
