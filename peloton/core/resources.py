"""Resource vectors: amounts of cpu, mem_mb, disk_mb and gpu, with the arithmetic pools,
admission and placement share.

One type for a task's request, a gang's total, a host's free capacity and a pool's entitlement, so
every component compares the same four kinds the same way. Values are floats (cpu may be
fractional); comparisons allow a tiny epsilon so sums of fractions don't flip a fit.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from peloton.v1 import common_pb2

KINDS: tuple[str, ...] = ("cpu", "mem_mb", "disk_mb", "gpu")
EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Resources:
    """An immutable amount of each resource kind."""

    cpu: float = 0.0
    mem_mb: float = 0.0
    disk_mb: float = 0.0
    gpu: float = 0.0

    @classmethod
    def of(cls, values: Mapping[str, float]) -> Resources:
        """From a mapping of kind to amount; unknown kinds are an error, missing ones 0."""
        unknown = set(values) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown resource kinds: {', '.join(sorted(unknown))}")
        return cls(**{k: float(v) for k, v in values.items()})

    @classmethod
    def from_proto(cls, msg: common_pb2.Resources) -> Resources:
        return cls(msg.cpu, msg.mem_mb, msg.disk_mb, msg.gpu)

    def to_proto(self) -> common_pb2.Resources:
        return common_pb2.Resources(
            cpu=self.cpu, mem_mb=self.mem_mb, disk_mb=self.disk_mb, gpu=self.gpu
        )

    def get(self, kind: str) -> float:
        return float(getattr(self, kind))

    def items(self) -> Iterator[tuple[str, float]]:
        for kind in KINDS:
            yield kind, self.get(kind)

    def as_dict(self) -> dict[str, float]:
        return dict(self.items())

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu + other.cpu,
            self.mem_mb + other.mem_mb,
            self.disk_mb + other.disk_mb,
            self.gpu + other.gpu,
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu - other.cpu,
            self.mem_mb - other.mem_mb,
            self.disk_mb - other.disk_mb,
            self.gpu - other.gpu,
        )

    def scale(self, factor: float) -> Resources:
        return Resources(
            self.cpu * factor, self.mem_mb * factor, self.disk_mb * factor, self.gpu * factor
        )

    def fits_in(self, other: Resources) -> bool:
        """True if every kind of ``self`` is at most the same kind of ``other``. A kind ``self``
        does not use fits whatever ``other`` has of it, overdrawn included (a pool above its
        entitlement in GPUs may still run work that needs none)."""
        # Spelled out: admission and placement call this for every gang and host they weigh.
        e = EPSILON
        return (
            (self.cpu <= e or self.cpu <= other.cpu + e)
            and (self.mem_mb <= e or self.mem_mb <= other.mem_mb + e)
            and (self.disk_mb <= e or self.disk_mb <= other.disk_mb + e)
            and (self.gpu <= e or self.gpu <= other.gpu + e)
        )

    def clamp_min_zero(self) -> Resources:
        return Resources(*(max(0.0, v) for _, v in self.items()))

    def shortfall(self, available: Resources) -> list[tuple[str, float, float]]:
        """The kinds where ``self`` exceeds ``available``: (kind, needed, available)."""
        return [
            (k, self.get(k), available.get(k))
            for k in KINDS
            if self.get(k) > EPSILON and self.get(k) > available.get(k) + EPSILON
        ]

    def is_zero(self) -> bool:
        return all(abs(v) <= EPSILON for _, v in self.items())


ZERO = Resources()

# What the Mesos default executor of one task group declares besides its tasks (real masters
# require cpus, mem and disk on it); charged once per host a gang uses.
EXECUTOR_RESOURCES = Resources(cpu=0.1, mem_mb=32.0, disk_mb=32.0)


def format_amount(value: float) -> str:
    """An amount as people read it: 8, 0.5, unlimited."""
    if math.isinf(value):
        return "unlimited"
    return f"{value:g}"


def describe(amount: Resources) -> str:
    """A resource amount for people: ``gpu 4, cpu 16, mem_mb 65536`` (zero kinds left out)."""
    parts = [f"{k} {format_amount(v)}" for k, v in amount.items() if v > EPSILON]
    parts.sort(key=lambda p: not p.startswith("gpu"))
    return ", ".join(parts) or "nothing"
