"""The offer pool: Mesos offers kept per agent, and leases that claim an agent for one placement.

Hosts are agents, keyed by agent id: Mesos registers several agents under one hostname (their
ids differ), and each is a host with offers of its own. The hostname is shown, never a key.

A lease claims every offer a host has at that moment, so a host is never promised to two
placements: while it is leased it is out of every snapshot, and its offers can only be used
through the lease. A lease ends one of three ways: ``take_for_launch`` (the offers are consumed
by an ACCEPT), ``release`` (placement gave up; the offers are free again) or expiry (the claim
was not used in time; the offers are free again). A rescinded offer leaves its lease, and a lease
that lost an offer can no longer launch.

Pure logic: no I/O; the caller passes the time. Thread-safe: one lock around every operation.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from peloton.core.offers import HostOffers, Lease, LeaseError, Offer, PortRange, total_of
from peloton.core.resources import Resources

# Mesos scalar resource names -> Resources kinds.
_SCALARS = {"cpus": "cpu", "mem": "mem_mb", "disk": "disk_mb", "gpus": "gpu"}


def parse_offer(raw: Mapping[str, Any], now: float) -> Offer:
    """An Offer from a v1 OFFERS entry (JSON as a dict). Raises ValueError naming the field."""
    try:
        scalars: dict[str, float] = {}
        ports: list[PortRange] = []
        entries: list[Mapping[str, Any]] = []
        allocation = raw.get("allocation_info")
        for res in raw.get("resources", []):
            if not usable(res):
                continue
            if allocation and "allocation_info" not in res:
                res = {**res, "allocation_info": allocation}  # a MULTI_ROLE launch needs it
            name, kind = res["name"], res.get("type", "SCALAR")
            if name in _SCALARS and kind == "SCALAR":
                key = _SCALARS[name]
                scalars[key] = scalars.get(key, 0.0) + float(res["scalar"]["value"])
                entries.append(res)
            elif name == "ports" and kind == "RANGES":
                ports.extend(
                    (int(r["begin"]), int(r["end"])) for r in res["ranges"].get("range", [])
                )
                entries.append(res)
        return Offer(
            offer_id=raw["id"]["value"],
            agent_id=raw["agent_id"]["value"],
            hostname=raw["hostname"],
            resources=Resources.of(scalars),
            ports=tuple(sorted(ports)),
            attributes=_attributes(raw.get("attributes", [])),
            agent_address=_agent_address(raw.get("url"), raw["hostname"]),
            entries=tuple(entries),
            received_at=now,
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed offer: missing or bad field {exc}") from exc


def usable(resource: Mapping[str, Any]) -> bool:
    """Whether peloton's tasks may take from an offered resource: not a persistent volume or a
    mount/path disk, not revocable, not shared (those are claimed by name, which tasks don't)."""
    return not (
        resource.get("disk") or resource.get("revocable") is not None or resource.get("shared")
    )


def _attributes(raw: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for attr in raw:
        kind = attr.get("type", "TEXT")
        if kind == "TEXT":
            out[attr["name"]] = str(attr["text"]["value"])
        elif kind == "SCALAR":
            value = float(attr["scalar"]["value"])
            out[attr["name"]] = str(int(value)) if value.is_integer() else str(value)
        elif kind == "SET":
            out[attr["name"]] = ",".join(attr["set"].get("item", []))
        elif kind == "RANGES":
            ranges = attr["ranges"].get("range", [])
            out[attr["name"]] = ",".join(f"{r['begin']}-{r['end']}" for r in ranges)
    return out


def _agent_address(url: Mapping[str, Any] | None, hostname: str) -> str:
    if not url:
        return f"{hostname}:5051"
    address = url.get("address", {})
    host = address.get("ip") or address.get("hostname") or hostname
    return f"{host}:{int(address.get('port', 5051))}"


@dataclass
class _Host:
    agent_id: str
    offers: dict[str, Offer] = field(default_factory=dict)
    lease: Lease | None = None
    # The lease lost an offer to a rescind: it can only be released or expire.
    spoiled: bool = False


class OfferPool:
    """Offers by agent, with leases. Times are seconds on the caller's clock."""

    def __init__(self, lease_seconds: float = 60.0) -> None:
        self._lease_seconds = lease_seconds
        self._lock = threading.Lock()
        self._hosts: dict[str, _Host] = {}  # agent id -> its offers and lease
        self._host_of_offer: dict[str, str] = {}  # offer id -> agent id
        self._leases: dict[str, str] = {}  # lease id -> agent id
        self._ids = itertools.count(1)

    # ------------------------------------------------------------------ offers in and out

    def add(self, offers: Iterable[Offer]) -> None:
        with self._lock:
            for offer in offers:
                host = self._hosts.get(offer.agent_id)
                if host is None:
                    host = self._hosts[offer.agent_id] = _Host(offer.agent_id)
                host.offers[offer.offer_id] = offer
                self._host_of_offer[offer.offer_id] = offer.agent_id

    def rescind(self, offer_id: str) -> bool:
        """Forget a rescinded offer; True if it was held. A lease holding it is spoiled."""
        with self._lock:
            agent_id = self._host_of_offer.pop(offer_id, None)
            if agent_id is None:
                return False
            host = self._hosts[agent_id]
            host.offers.pop(offer_id, None)
            if host.lease is not None and offer_id in host.lease.offer_ids:
                host.spoiled = True
            return True

    def remove_agent(self, agent_id: str) -> list[str]:
        """Forget a lost agent's offers (and spoil its lease); returns the offer ids. The master
        rescinds them itself: there is nothing to decline."""
        with self._lock:
            host = self._hosts.get(agent_id)
            if host is None:
                return []
            ids = list(host.offers)
            for offer_id in ids:
                self._host_of_offer.pop(offer_id, None)
            host.offers.clear()
            if host.lease is not None:
                host.spoiled = True
            else:
                del self._hosts[agent_id]
            return ids

    def take_unleased(self, older_than: float | None = None, now: float = 0.0) -> list[Offer]:
        """Remove and return unleased offers (to decline them): all of them, or those received
        more than ``older_than`` seconds before ``now``."""
        out: list[Offer] = []
        with self._lock:
            for agent_id, host in list(self._hosts.items()):
                if host.lease is not None:
                    continue
                for offer_id, offer in list(host.offers.items()):
                    if older_than is None or now - offer.received_at > older_than:
                        out.append(host.offers.pop(offer_id))
                        del self._host_of_offer[offer_id]
                if not host.offers:
                    del self._hosts[agent_id]
        return out

    # ------------------------------------------------------------------ reading

    def snapshot(self, exclude: Iterable[str] = ()) -> list[HostOffers]:
        """Unleased agents with offers, minus the agent ids in ``exclude`` (e.g. draining
        hosts), by hostname then agent id."""
        skip = set(exclude)
        with self._lock:
            out = [
                HostOffers(
                    hostname=next(iter(host.offers.values())).hostname,
                    agent_id=agent_id,
                    free=total_of(host.offers.values()),
                    ports=tuple(sorted(r for o in host.offers.values() for r in o.ports)),
                    attributes=next(iter(host.offers.values())).attributes,
                )
                for agent_id, host in self._hosts.items()
                if host.lease is None and host.offers and agent_id not in skip
            ]
        return sorted(out, key=lambda h: (h.hostname, h.agent_id))

    def held(self) -> int:
        """How many offers are held."""
        with self._lock:
            return len(self._host_of_offer)

    def leased_hosts(self) -> set[str]:
        """Agent ids of the leased hosts."""
        with self._lock:
            return {agent_id for agent_id, h in self._hosts.items() if h.lease is not None}

    # ------------------------------------------------------------------ leases

    def lease(self, agent_id: str, now: float) -> Lease | None:
        """Claim every offer of the agent; None if it has none or is already leased."""
        with self._lock:
            host = self._hosts.get(agent_id)
            if host is None or host.lease is not None or not host.offers:
                return None
            offers = tuple(host.offers.values())
            lease = Lease(
                lease_id=f"lease-{next(self._ids)}",
                hostname=offers[0].hostname,
                agent_id=agent_id,
                offers=offers,
                expires_at=now + self._lease_seconds,
            )
            host.lease, host.spoiled = lease, False
            self._leases[lease.lease_id] = agent_id
            return lease

    def take_for_launch(self, leases: Sequence[Lease], now: float) -> None:
        """Consume the offers of every lease in ``leases`` for one launch, all or none.

        Raises LeaseError (and consumes nothing) if any lease is unknown, expired or spoiled.
        A lease named more than once (several gangs' task groups on its host) is taken once.
        """
        leases = list({lease.lease_id: lease for lease in leases}.values())
        with self._lock:
            for lease in leases:
                problem = self._check(lease, now)
                if problem:
                    raise LeaseError(f"lease on {lease.hostname} ({lease.agent_id}) {problem}")
            for lease in leases:
                host = self._hosts[lease.agent_id]
                for offer_id in lease.offer_ids:
                    host.offers.pop(offer_id, None)
                    self._host_of_offer.pop(offer_id, None)
                self._end(lease)

    def _check(self, lease: Lease, now: float) -> str:
        agent_id = self._leases.get(lease.lease_id)
        if agent_id is None:
            return "was released or has expired"
        host = self._hosts[agent_id]
        if host.spoiled:
            return "lost an offer (rescinded, or the agent went away)"
        if now >= lease.expires_at:
            return "has expired"
        return ""

    def release(self, lease: Lease) -> None:
        """Give a lease up: its host's offers are free for other placements again."""
        with self._lock:
            if lease.lease_id in self._leases:
                self._end(lease)

    def expire(self, now: float) -> list[Lease]:
        """End every lease past its expiry; returns them."""
        with self._lock:
            out = []
            for agent_id in list(self._leases.values()):
                lease = self._hosts[agent_id].lease
                if lease is not None and now >= lease.expires_at:
                    out.append(lease)
                    self._end(lease)
            return out

    def _end(self, lease: Lease) -> None:
        agent_id = self._leases.pop(lease.lease_id)
        host = self._hosts[agent_id]
        host.lease, host.spoiled = None, False
        if not host.offers:
            del self._hosts[agent_id]
