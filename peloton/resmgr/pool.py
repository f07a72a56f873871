"""Resource pools: their configuration and the rules a pool tree must keep.

A pool tree is rooted at ``/``, whose capacity is the cluster's. Every other pool has, per resource
kind, a *reservation* (guaranteed), a *limit* (never more) and a *share* (weight for what is left
over), and a policy: ELASTIC pools lend what they don't use; a STATIC pool's reservation is its own
whatever its demand. Jobs run only in leaf pools.

Pure logic, no I/O: :class:`PoolTree` checks a change against every rule before anything is
written, and raises :class:`~peloton.errors.InvalidArgument` naming the field, or
:class:`~peloton.errors.FailedPrecondition` / :class:`~peloton.errors.NotFound`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from peloton.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from peloton.jobmgr.spec import check_pool_path
from peloton.resources import EPSILON, KINDS

ROOT = "/"
DEFAULT_POOL = "/default"
MAX_OWNER = 128
UNLIMITED = math.inf


class Policy(enum.StrEnum):
    """How a pool's reservation of one kind is treated."""

    ELASTIC = "ELASTIC"  # entitled to min(demand, reservation); lends the rest
    STATIC = "STATIC"  # always entitled to its full reservation; lends nothing


class QueuePolicy(enum.StrEnum):
    """The order of a leaf pool's queue."""

    PRIORITY_FIFO = "PRIORITY_FIFO"  # higher priority first, then oldest first
    FIFO = "FIFO"  # oldest first, priority ignored


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


class PoolTree:
    """An immutable-by-convention map of pool path to config, with the tree's rules.

    The root is implicit: its capacity is the cluster's and it has no config of its own.
    """

    def __init__(self, pools: Iterable[PoolConfig] = ()) -> None:
        self._pools: dict[str, PoolConfig] = {p.path: p for p in pools}
        self._children: dict[str, list[str]] = {ROOT: []}
        for path in sorted(self._pools, key=_depth_key):
            self._children.setdefault(path, [])
            self._children.setdefault(parent_of(path), []).append(path)

    # ---------------------------------------------------------------- reading

    def __contains__(self, path: object) -> bool:
        return path == ROOT or path in self._pools

    def __len__(self) -> int:
        return len(self._pools)

    def get(self, path: str) -> PoolConfig:
        try:
            return self._pools[path]
        except KeyError:
            raise NotFound(f"pool {path} not found") from None

    def children(self, path: str) -> list[str]:
        return list(self._children.get(path, ()))

    def is_leaf(self, path: str) -> bool:
        return path != ROOT and path in self._pools and not self._children.get(path)

    def leaves(self) -> list[str]:
        return [p for p in self._pools if not self._children.get(p)]

    def paths(self) -> list[str]:
        """Every configured pool, parents before children, siblings by name."""
        return sorted(self._pools, key=_depth_key)

    def walk(self, path: str = ROOT) -> Iterator[tuple[str, int]]:
        """Depth-first (path, depth) from ``path``, children in name order."""
        stack = [(path, 0)]
        while stack:
            node, depth = stack.pop()
            yield node, depth
            stack.extend((c, depth + 1) for c in sorted(self._children.get(node, ()), reverse=True))

    def limit(self, path: str, kind: str) -> float:
        """The effective limit of a pool: its own, capped by every ancestor's."""
        limit = UNLIMITED
        node = path
        while node != ROOT:
            limit = min(limit, self._pools[node].kind(kind).limit)
            node = parent_of(node)
        return limit

    # ---------------------------------------------------------------- changes

    def with_created(self, config: PoolConfig, jobs_in: Mapping[str, int]) -> PoolTree:
        """The tree with a new pool, checked; ``jobs_in`` counts unfinished jobs per pool."""
        validate_config(config)
        if config.path in self._pools:
            raise AlreadyExists(f"pool {config.path} already exists")
        parent = config.parent
        if parent not in self:
            raise NotFound(f"parent pool {parent} of {config.path} does not exist")
        if parent != ROOT and jobs_in.get(parent, 0) > 0:
            raise FailedPrecondition(
                f"pool {parent} has {jobs_in[parent]} unfinished jobs; jobs run only in leaf "
                f"pools, so it cannot get a child until they end"
            )
        tree = PoolTree([*self._pools.values(), config])
        tree._check_around(config.path)
        return tree

    def with_updated(self, config: PoolConfig) -> PoolTree:
        validate_config(config)
        if config.path not in self._pools:
            raise NotFound(f"pool {config.path} not found")
        tree = PoolTree([*(p for p in self._pools.values() if p.path != config.path), config])
        tree._check_around(config.path)
        return tree

    def without(self, path: str, jobs_in: Mapping[str, int]) -> PoolTree:
        if path == ROOT:
            raise FailedPrecondition("the root pool / cannot be deleted")
        self.get(path)
        if self._children.get(path):
            raise FailedPrecondition(
                f"pool {path} has child pools ({', '.join(sorted(self._children[path]))}); "
                "delete them first"
            )
        if jobs_in.get(path, 0) > 0:
            raise FailedPrecondition(f"pool {path} has {jobs_in[path]} unfinished jobs")
        return PoolTree(p for p in self._pools.values() if p.path != path)

    def _check_around(self, path: str) -> None:
        """Check the rules that involve ``path``: against its parent, siblings and children."""
        config = self._pools[path]
        parent = config.parent
        for kind in KINDS:
            mine = config.kind(kind)
            where = f"resources.{kind}"
            if parent != ROOT:
                pc = self._pools[parent].kind(kind)
                # An unset (infinite) limit inherits the parent's.
                if not math.isinf(mine.limit) and mine.limit > pc.limit + EPSILON:
                    raise InvalidArgument(
                        f"{where}.limit",
                        f"{format_amount(mine.limit)} is more than the parent {parent}'s limit "
                        f"{format_amount(pc.limit)}",
                    )
                total = sum(self._pools[c].kind(kind).reservation for c in self._children[parent])
                if total > pc.reservation + EPSILON:
                    raise InvalidArgument(
                        f"{where}.reservation",
                        f"children of {parent} would reserve {format_amount(total)}, more than its "
                        f"reservation {format_amount(pc.reservation)}",
                    )
            kids = self._children.get(path, [])
            for child in kids:
                child_limit = self._pools[child].kind(kind).limit
                if not math.isinf(child_limit) and child_limit > mine.limit + EPSILON:
                    raise InvalidArgument(
                        f"{where}.limit",
                        f"{format_amount(mine.limit)} is less than the limit of child {child}",
                    )
            kid_total = sum(self._pools[c].kind(kind).reservation for c in kids)
            if kid_total > mine.reservation + EPSILON:
                raise InvalidArgument(
                    f"{where}.reservation",
                    f"{format_amount(mine.reservation)} is less than its children reserve "
                    f"({format_amount(kid_total)})",
                )


def _depth_key(path: str) -> tuple[int, str]:
    return path.count("/"), path


def format_amount(value: float) -> str:
    """An amount as people read it: 8, 0.5, unlimited."""
    if math.isinf(value):
        return "unlimited"
    return f"{value:g}"
