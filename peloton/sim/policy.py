"""The policies a simulation runs under: the resource manager's pool queue policies
(:class:`~peloton.core.pools.QueuePolicy`, taken from the enum, so a policy added there is
simulated at once) and the simulator's own baseline (:data:`BASELINE_BACKFILL`, see
:mod:`peloton.sim.simulator`). Light to import: the CLI lists them in its help."""

from __future__ import annotations

from peloton.core.pools import QueuePolicy

BASELINE_BACKFILL = "baseline-backfill"


def policies() -> list[str]:
    """Every policy a run may use: each pool queue policy, then the baseline."""
    return [p.value for p in QueuePolicy] + [BASELINE_BACKFILL]


def parse_policy(name: str) -> str:
    """A policy name in any case (ValueError naming the choices)."""
    for p in policies():
        if name.strip().lower() == p.lower():
            return p
    raise ValueError(f"unknown policy {name!r}; use one of {', '.join(policies())}")
