"""Pool configuration: what a user says about a resource pool, and the checks one pool's config
passes on its own (the pool tree, :mod:`peloton.resmgr.pool`, checks the rest)."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from peloton.core.access import Grant, check_principal_name
from peloton.core.resources import EPSILON, KINDS, format_amount
from peloton.core.spec import check_pool_path
from peloton.errors import InvalidArgument

ROOT = "/"
DEFAULT_POOL = "/default"
MAX_OWNER = 128
MAX_GRANTS = 256
UNLIMITED = math.inf


class Policy(enum.StrEnum):
    """How a pool's reservation of one kind is treated."""

    ELASTIC = "ELASTIC"  # entitled to min(demand, reservation); lends the rest
    STATIC = "STATIC"  # always entitled to its full reservation; lends nothing


class QueuePolicy(enum.StrEnum):
    """The order of a leaf pool's queue."""

    PRIORITY_FIFO = "PRIORITY_FIFO"  # higher priority first, then oldest first
    FIFO = "FIFO"  # oldest first, priority ignored
    # Placement-aware, with a reservation for the first blocked gang (EASY backfill).
    BACKFILL = "BACKFILL"
    # Placement-aware, least attained service first (discretized, with a starvation guard).
    LAS = "LAS"


@dataclass(frozen=True)
class KindConfig:
    """A pool's settings for one resource kind. Unset kinds: nothing reserved, no limit."""

    reservation: float = 0.0
    limit: float = UNLIMITED  # unset: the parent's limit (unlimited at the top)
    share: float = 1.0
    policy: Policy = Policy.ELASTIC


@dataclass(frozen=True)
class PoolConfig:
    """What a user says about a pool (the YAML of ``peloton pool create``)."""

    path: str
    owner: str = ""
    kinds: Mapping[str, KindConfig] = field(default_factory=dict)
    queue_policy: QueuePolicy = QueuePolicy.PRIORITY_FIFO
    # Who may do what on this pool and below it, beside its ancestors' grants (core.access).
    grants: tuple[Grant, ...] = ()

    def kind(self, kind: str) -> KindConfig:
        return self.kinds.get(kind, KindConfig())

    @property
    def parent(self) -> str:
        return parent_of(self.path)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1] or ROOT


def parent_of(path: str) -> str:
    if path == ROOT:
        raise ValueError("the root pool has no parent")
    head = path.rsplit("/", 1)[0]
    return head or ROOT


def validate_config(config: PoolConfig) -> None:
    """The checks one pool's config must pass on its own (the tree checks the rest)."""
    check_pool_path(config.path, "path")
    if config.path == ROOT:
        raise InvalidArgument("path", "the root pool / is the cluster; it cannot be configured")
    if len(config.owner) > MAX_OWNER:
        raise InvalidArgument("owner", f"is longer than {MAX_OWNER} characters")
    if len(config.grants) > MAX_GRANTS:
        raise InvalidArgument("grants", f"at most {MAX_GRANTS} grants")
    for i, grant in enumerate(config.grants):
        check_principal_name(grant.principal.name, f"grants[{i}].{grant.principal.kind}")
    for kind, kc in config.kinds.items():
        where = f"resources.{kind}"
        if kind not in KINDS:
            raise InvalidArgument(where, f"unknown resource kind; use one of {', '.join(KINDS)}")
        for name in ("reservation", "limit", "share"):
            value = getattr(kc, name)
            if math.isnan(value) or value < 0:
                raise InvalidArgument(f"{where}.{name}", f"must be a number >= 0, not {value}")
        if math.isinf(kc.reservation):
            raise InvalidArgument(f"{where}.reservation", "must be finite")
        if kc.share <= 0 or math.isinf(kc.share):
            raise InvalidArgument(f"{where}.share", f"must be a finite number > 0, not {kc.share}")
        if kc.reservation > kc.limit + EPSILON:
            raise InvalidArgument(
                f"{where}.reservation",
                f"{format_amount(kc.reservation)} is more than the limit {format_amount(kc.limit)}",
            )
