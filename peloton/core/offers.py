"""What placement and the host manager exchange: Mesos offers, a host's free offers as placement
sees them, the lease that claims a host for one placement, and the tasks a launch starts.

Pure data: the offer pool (:mod:`peloton.hostmgr.offers`) keeps offers and leases; the launcher
(:mod:`peloton.placement.launcher`) reads snapshots, takes leases and hands back tasks.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from peloton.core.containers import ContainerLaunch
from peloton.core.resources import ZERO, Resources

PortRange = tuple[int, int]


class LeaseError(Exception):
    """A lease cannot be used: it expired, was released, or lost an offer to a rescind."""


@dataclass(frozen=True)
class Offer:
    """One Mesos offer, parsed: what peloton needs of it, plus the raw resources to echo back."""

    offer_id: str
    agent_id: str
    hostname: str
    resources: Resources
    ports: tuple[PortRange, ...]
    attributes: Mapping[str, str]
    # The agent's HTTP address, host:port (from the offer's url): sandbox files are read there.
    agent_address: str
    # The offer's cpus, mem, disk, gpus and ports entries exactly as offered (role,
    # reservations, allocation_info): a launch must name what it takes the same way.
    entries: tuple[Mapping[str, Any], ...]
    received_at: float


def port_count(ranges: Iterable[PortRange]) -> int:
    return sum(end - begin + 1 for begin, end in ranges)


def take_ports(ranges: Sequence[PortRange], n: int, taken: Container[int] = ()) -> list[int]:
    """The ``n`` lowest ports of ``ranges`` but those ``taken`` (by other gangs launched on the
    host with the same offers); ValueError if there are fewer."""
    out: list[int] = []
    for begin, end in ranges:
        for port in range(begin, end + 1):
            if len(out) == n:
                return out
            if port not in taken:
                out.append(port)
    if len(out) < n:
        raise ValueError(f"needs {n} ports, the offers have {len(out)}")
    return out


@dataclass(frozen=True)
class HostOffers:
    """A host's free offered resources, as placement sees them in a snapshot."""

    hostname: str
    agent_id: str
    free: Resources
    ports: tuple[PortRange, ...]
    attributes: Mapping[str, str]


@dataclass(frozen=True)
class Lease:
    """A claim on every offer one host had when it was leased."""

    lease_id: str
    hostname: str
    agent_id: str
    offers: tuple[Offer, ...]
    expires_at: float

    @property
    def offer_ids(self) -> tuple[str, ...]:
        return tuple(o.offer_id for o in self.offers)

    @property
    def resources(self) -> Resources:
        return total_of(self.offers)

    @property
    def ports(self) -> tuple[PortRange, ...]:
        return tuple(sorted(r for o in self.offers for r in o.ports))

    @property
    def agent_address(self) -> str:
        return self.offers[0].agent_address if self.offers else ""


@dataclass(frozen=True)
class LaunchTask:
    """One attempt to launch: its Mesos task id, name, command, environment, resources, ports,
    container and user."""

    task_id: str
    name: str
    command: str
    # Left out of repr: it holds the gang's secret (PELOTON_GANG_SECRET) and the job's own.
    env: Mapping[str, str] = field(repr=False)
    resources: Resources
    ports: tuple[int, ...] = ()
    kill_grace_seconds: int = 30
    # The image, volumes and /dev/shm it runs with; None: on the agent host, in its sandbox.
    container: ContainerLaunch | None = None
    # The Unix user it runs as (CommandInfo.user); empty: the framework's user.
    user: str = ""


def executor_id(tasks: Sequence[LaunchTask]) -> str:
    """The id of the executor running a host's share of a gang: named after its first task
    (unique, as task ids are). Recorded with each attempt, it names the attempt's sandbox."""
    return f"{tasks[0].task_id}-executor"


def total_of(offers: Iterable[Offer]) -> Resources:
    """What the offers hold together."""
    total = ZERO
    for o in offers:
        total = total + o.resources
    return total
