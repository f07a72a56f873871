"""Placement as admission asks it: would the placement engine find hosts for a gang now, and
where would a reserved gang run when it starts?

The placement-aware pools (BACKFILL, LAS) admit a gang only if it does, so that no admitted gang
holds its pool's capacity while no set of hosts can take it (a gang of one GPU model, or of whole
hosts, on a cluster whose free GPUs are elsewhere or scattered). The hosts are the host
manager's, with what peloton's tasks leave free on each, whether offered now or not.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

from peloton.core.gang import Gang
from peloton.core.offers import HostOffers
from peloton.placement import engine


class FreeHosts(Protocol):
    def free_hosts(self, ended: Collection[str] = ()) -> list[HostOffers]:
        """Every host that takes placements, with what is free on it; ``ended``: job ids
        whose tasks count as ended (what they hold is free)."""
        ...


class HostsCheck:
    """:class:`peloton.core.gang.PlacementCheck` on the cluster's hosts."""

    def __init__(self, hosts: FreeHosts) -> None:
        self._hosts = hosts

    def round(self, placed_first: Sequence[Gang]) -> Callable[[Gang], str | None]:
        snapshot = _taken(self._hosts.free_hosts(), placed_first)

        def fits(gang: Gang) -> str | None:
            placement = engine.place_on(gang, snapshot)
            return None if placement.hosts is not None else placement.reason

        return fits

    def where(self, gang: Gang, ended: Collection[str], placed_first: Sequence[Gang]) -> str | None:
        hosts = self._hosts.free_hosts(ended)
        placement = engine.place_on(gang, _taken(hosts, placed_first))
        if placement.hosts is None:
            return None
        return spot(placement.hosts, {h.agent_id: h.attributes.get("rack", "") for h in hosts})


def _taken(hosts: Sequence[HostOffers], placed_first: Sequence[Gang]) -> engine.Snapshot:
    snapshot = engine.Snapshot(hosts)
    for gang in placed_first:
        engine.place_on(gang, snapshot)
    return snapshot


def spot(agent_ids: Sequence[str], racks: Mapping[str, str]) -> str:
    """``on 2 hosts in rack r1`` for a placement's agent ids by rank (racks: by agent id; hosts
    without a rack attribute are left out of the racks named)."""
    hosts = list(dict.fromkeys(agent_ids))
    named = sorted({racks.get(a, "") for a in hosts} - {""})
    where = f"on {len(hosts)} host{'' if len(hosts) == 1 else 's'}"
    if named:
        where += f" in rack{'' if len(named) == 1 else 's'} {', '.join(named)}"
    return where
