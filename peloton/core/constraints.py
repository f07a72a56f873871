"""Constraints on host attributes, as jobs state them and placement checks them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from peloton.v1 import job_pb2


def matches(constraints: Sequence[job_pb2.Constraint], attributes: Mapping[str, str]) -> bool:
    """Whether a host's attributes satisfy every constraint (AND); an ``any_of`` item holds when
    any of its branches does (OR). Leaf ops: in, not_in, eq, exists."""
    for c in constraints:
        if c.any_of:
            ok = any(matches((branch,), attributes) for branch in c.any_of)
        else:
            ok = _holds(c, attributes.get(c.attribute))
        if not ok:
            return False
    return True


def _holds(leaf: job_pb2.Constraint, value: str | None) -> bool:
    if leaf.op == "exists":
        return value is not None
    if leaf.op in ("in", "eq"):
        return value is not None and value in leaf.values
    if leaf.op == "not_in":
        return value is None or value not in leaf.values
    return False
