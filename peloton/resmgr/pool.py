"""Resource pools: the rules a pool tree must keep (a pool's own config: peloton.core.pools).

A pool tree is rooted at ``/``, whose capacity is the cluster's. Every other pool has, per resource
kind, a *reservation* (guaranteed), a *limit* (never more) and a *share* (weight for what is left
over), and a policy: ELASTIC pools lend what they don't use; a STATIC pool's reservation is its own
whatever its demand. Jobs run only in leaf pools.

Pure logic, no I/O: :class:`PoolTree` checks a change against every rule before anything is
written, and raises :class:`~peloton.errors.InvalidArgument` naming the field, or
:class:`~peloton.errors.FailedPrecondition` / :class:`~peloton.errors.NotFound`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping

from peloton.core.pools import ROOT, UNLIMITED, PoolConfig, parent_of, validate_config
from peloton.core.resources import EPSILON, KINDS, format_amount
from peloton.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound


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
