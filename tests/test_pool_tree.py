"""Pool tree rules: every invalid change is refused with the field and the reason."""

from __future__ import annotations

import math

import pytest

from peloton.core.pools import ROOT, KindConfig, Policy, PoolConfig
from peloton.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from peloton.resmgr.pool import PoolTree

INF = math.inf


def pool(path: str, **kinds: tuple[float, float]) -> PoolConfig:
    """A pool with (reservation, limit) per kind."""
    return PoolConfig(path, kinds={k: KindConfig(r, lim) for k, (r, lim) in kinds.items()})


BASE = PoolTree([pool("/research", gpu=(8, 32)), pool("/research/vision", gpu=(4, 16))])


@pytest.mark.parametrize(
    ("config", "field", "reason"),
    [
        (pool("/a", gpu=(8, 4)), "resources.gpu.reservation", "8 is more than the limit 4"),
        (pool("/a", gpu=(-1, 4)), "resources.gpu.reservation", "must be a number >= 0, not -1"),
        (pool("/a", gpus=(1, 4)), "resources.gpus", "unknown resource kind"),
        (
            PoolConfig("/a", kinds={"gpu": KindConfig(share=0)}),
            "resources.gpu.share",
            "must be a finite number > 0",
        ),
        (
            PoolConfig("/a", kinds={"cpu": KindConfig(reservation=INF)}),
            "resources.cpu.reservation",
            "must be finite",
        ),
        (pool("research"), "path", "must be an absolute path"),
        (pool("/research//x"), "path", "empty or invalid segment"),
        (pool(ROOT), "path", "the root pool / is the cluster"),
        (PoolConfig("/a", owner="x" * 200), "owner", "is longer than 128 characters"),
        (
            pool("/research/nlp", gpu=(5, 8)),
            "resources.gpu.reservation",
            "children of /research would reserve 9, more than its reservation 8",
        ),
        (
            pool("/research/nlp", gpu=(0, 64)),
            "resources.gpu.limit",
            "64 is more than the parent /research's limit 32",
        ),
    ],
)
def test_invalid_pools_are_refused_naming_the_field(
    config: PoolConfig, field: str, reason: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        BASE.with_created(config, {})
    assert info.value.field == field
    assert reason in info.value.reason


def test_tree_shape_rules() -> None:
    with pytest.raises(AlreadyExists):
        BASE.with_created(pool("/research/vision"), {})
    with pytest.raises(NotFound, match="parent pool /prod of /prod/x does not exist"):
        BASE.with_created(pool("/prod/x"), {})
    with pytest.raises(FailedPrecondition, match="jobs run only in leaf pools"):
        BASE.with_created(pool("/research/vision/a"), {"/research/vision": 2})
    tree = BASE.with_created(pool("/research/vision/a"), {})
    assert not tree.is_leaf("/research/vision") and tree.is_leaf("/research/vision/a")


def test_updates_are_checked_against_parent_and_children() -> None:
    with pytest.raises(InvalidArgument, match="less than its children reserve"):
        BASE.with_updated(pool("/research", gpu=(2, 32)))
    with pytest.raises(InvalidArgument, match="less than the limit of child /research/vision"):
        BASE.with_updated(pool("/research", gpu=(8, 10)))
    with pytest.raises(NotFound):
        BASE.with_updated(pool("/nope"))
    tree = BASE.with_updated(pool("/research", gpu=(16, 64)))
    assert tree.get("/research").kind("gpu").limit == 64


def test_delete_rules() -> None:
    with pytest.raises(FailedPrecondition, match="has child pools"):
        BASE.without("/research", {})
    with pytest.raises(FailedPrecondition, match="has 3 unfinished jobs"):
        BASE.without("/research/vision", {"/research/vision": 3})
    with pytest.raises(FailedPrecondition, match="cannot be deleted"):
        BASE.without(ROOT, {})
    with pytest.raises(NotFound):
        BASE.without("/nope", {})
    assert "/research/vision" not in BASE.without("/research/vision", {})


def test_unset_limits_inherit_and_effective_limits_are_capped_by_ancestors() -> None:
    tree = BASE.with_created(PoolConfig("/research/nlp"), {})
    assert tree.get("/research/nlp").kind("gpu").limit == INF
    assert tree.limit("/research/nlp", "gpu") == 32
    assert tree.limit("/research/vision", "gpu") == 16
    assert tree.limit("/research/nlp", "cpu") == INF


def test_walk_lists_parents_before_children_in_name_order() -> None:
    tree = BASE.with_created(pool("/research/audio"), {}).with_created(pool("/a"), {})
    assert [p for p, _ in tree.walk()] == [
        ROOT,
        "/a",
        "/research",
        "/research/audio",
        "/research/vision",
    ]
    static = PoolConfig("/s", kinds={"gpu": KindConfig(4, 8, 1, Policy.STATIC)})
    assert tree.with_created(static, {}).get("/s").kind("gpu").policy is Policy.STATIC
