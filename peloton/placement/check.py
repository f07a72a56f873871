"""Placement as admission asks it: would the placement engine find hosts for a gang now?

The placement-aware pools (BACKFILL, LAS) admit a gang only if it does, so that no admitted gang
holds its pool's capacity while no set of hosts can take it (a gang of one GPU model, or of whole
hosts, on a cluster whose free GPUs are elsewhere or scattered). The hosts are the host
manager's, with what peloton's tasks leave free on each, whether offered now or not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from peloton.core.gang import Gang
from peloton.core.offers import HostOffers
from peloton.placement import engine


class FreeHosts(Protocol):
    def free_hosts(self) -> list[HostOffers]:
        """Every host that takes placements, with what is free on it."""
        ...


class HostsCheck:
    """:class:`peloton.core.gang.PlacementCheck` on the cluster's hosts."""

    def __init__(self, hosts: FreeHosts) -> None:
        self._hosts = hosts

    def round(self, placed_first: Sequence[Gang]) -> Callable[[Gang], str | None]:
        snapshot = engine.Snapshot(self._hosts.free_hosts())
        for gang in placed_first:
            engine.place_on(gang, snapshot)

        def fits(gang: Gang) -> str | None:
            placement = engine.place_on(gang, snapshot)
            return None if placement.hosts is not None else placement.reason

        return fits
