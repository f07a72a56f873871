"""Host records: the agents peloton knows, their resources and attributes, and drain state.

Mesos never states an agent's total: offers show what is free. A host's total is therefore
estimated as the most it ever offered at once, which is exact once it was offered idle (agents
join idle; totals survive restarts in the database) and never shrinks while the agent lives.
Adding peloton's own usage to what is offered would not do: a master re-offers a task's
resources as soon as the task ends, before the framework has been told it ended, so that sum
overcounts.
The registry is the in-memory view; every change a user or a later daemon needs (a new host, a
changed total or address, drain state, a lost agent) is written through a :class:`HostStore`.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol

from peloton.errors import FailedPrecondition, NotFound
from peloton.jobmgr.states import TaskState
from peloton.resources import ZERO, Resources


class HostState(enum.StrEnum):
    UP = "UP"
    # No new placements; running tasks are left alone.
    DRAINING = "DRAINING"
    # The agent was lost (or removed); its record is kept.
    DOWN = "DOWN"


@dataclass(frozen=True)
class HostRecord:
    hostname: str
    agent_id: str
    state: HostState
    total: Resources
    attributes: Mapping[str, str]
    # The agent's HTTP address (host:port), where its sandbox files are read.
    address: str
    updated_at: datetime


@dataclass(frozen=True)
class HostView:
    """A host with what peloton's tasks use on it now."""

    record: HostRecord
    used: Resources

    @property
    def free(self) -> Resources:
        return (self.record.total - self.used).clamp_min_zero()


class HostStore(Protocol):
    """Persistence of hosts and of the framework id (peloton.storage.hosts implements it)."""

    def load_hosts(self) -> list[HostRecord]: ...

    def save_hosts(self, hosts: Sequence[HostRecord]) -> None:
        """Insert or replace these host records (one transaction)."""
        ...

    def load_framework_id(self, name: str) -> str: ...

    def save_framework_id(self, name: str, framework_id: str) -> None: ...

    def active_attempts(self, states: Iterable[TaskState]) -> list[str]:
        """Mesos task ids of the current attempts of every task in ``states``."""
        ...

    def current_attempts(
        self, tasks: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[int, TaskState, str]]:
        """(attempt, state, host) of the current attempt of each (job id, instance id) given
        that exists."""
        ...


@dataclass
class _Usage:
    by_attempt: dict[str, tuple[str, Resources]] = field(default_factory=dict)  # -> hostname
    by_host: dict[str, Resources] = field(default_factory=dict)


class HostRegistry:
    """Known hosts by hostname, with peloton's usage per running attempt. Thread-safe."""

    def __init__(self, store: HostStore, clock: Callable[[], datetime]) -> None:
        self._store = store
        self._clock = clock
        self._lock = threading.Lock()
        self._hosts: dict[str, HostRecord] = {h.hostname: h for h in store.load_hosts()}
        self._usage = _Usage()
        self._total: Resources | None = None  # of the hosts not DOWN; None: to be summed

    # ------------------------------------------------------------------ what Mesos tells

    def observe(
        self,
        hostname: str,
        agent_id: str,
        offered: Resources,
        attributes: Mapping[str, str],
        address: str,
    ) -> HostRecord | None:
        """An offer (or the sum of a host's held offers) was seen. Returns the host's new record
        if it changed (a new host, a larger total, a new agent or address), for the caller to
        :meth:`save` (in batches: offers come by the thousand); None if nothing changed."""
        with self._lock:
            seen = offered
            old = self._hosts.get(hostname)
            if old is None:
                new = HostRecord(
                    hostname, agent_id, HostState.UP, seen, dict(attributes), address, self._clock()
                )
            else:
                fresh_agent = old.agent_id != agent_id
                total = seen if fresh_agent else _max(old.total, seen)
                state = HostState.UP if old.state == HostState.DOWN else old.state
                new = replace(
                    old,
                    agent_id=agent_id,
                    state=state,
                    total=total,
                    attributes=dict(attributes),
                    address=address,
                )
                if new == old:
                    return None
                new = replace(new, updated_at=self._clock())
            self._hosts[hostname] = new
            self._total = None
        return new

    def save(self, records: Sequence[HostRecord]) -> None:
        """Persist records :meth:`observe` returned."""
        if records:
            self._store.save_hosts(records)

    def agent_lost(self, agent_id: str) -> HostRecord | None:
        """Mark the host of a lost agent DOWN (it leaves the cluster's capacity)."""
        with self._lock:
            host = next((h for h in self._hosts.values() if h.agent_id == agent_id), None)
            if host is None or host.state == HostState.DOWN:
                return None
            new = replace(host, state=HostState.DOWN, updated_at=self._clock())
            self._hosts[host.hostname] = new
            self._total = None
        self._store.save_hosts([new])
        return new

    # ------------------------------------------------------------------ peloton's usage

    def use(self, attempt_id: str, hostname: str, resources: Resources) -> None:
        with self._lock:
            if attempt_id in self._usage.by_attempt:
                return
            self._usage.by_attempt[attempt_id] = (hostname, resources)
            self._usage.by_host[hostname] = self._used(hostname) + resources

    def unuse(self, attempt_id: str) -> None:
        with self._lock:
            entry = self._usage.by_attempt.pop(attempt_id, None)
            if entry is not None:
                hostname, resources = entry
                self._usage.by_host[hostname] = (self._used(hostname) - resources).clamp_min_zero()

    def host_of(self, attempt_id: str) -> str:
        with self._lock:
            entry = self._usage.by_attempt.get(attempt_id)
            return entry[0] if entry else ""

    def _used(self, hostname: str) -> Resources:
        return self._usage.by_host.get(hostname, ZERO)

    # ------------------------------------------------------------------ users

    def get(self, hostname: str) -> HostView:
        with self._lock:
            host = self._hosts.get(hostname)
            if host is None:
                raise NotFound(f"host {hostname} not found")
            return HostView(host, self._used(hostname))

    def list(self) -> list[HostView]:
        with self._lock:
            return [HostView(h, self._used(n)) for n, h in sorted(self._hosts.items())]

    def set_draining(self, hostname: str, draining: bool) -> HostView:
        """Drain (no new placements) or undrain a host. A DOWN host can't be drained."""
        with self._lock:
            host = self._hosts.get(hostname)
            if host is None:
                raise NotFound(f"host {hostname} not found")
            if host.state == HostState.DOWN:
                raise FailedPrecondition(f"host {hostname} is DOWN")
            state = HostState.DRAINING if draining else HostState.UP
            new = host if host.state == state else replace(host, state=state)
            if new is not host:
                new = replace(new, updated_at=self._clock())
                self._hosts[hostname] = new
                self._total = None
            view = HostView(new, self._used(hostname))
        if new is not host:
            self._store.save_hosts([new])
        return view

    def draining(self) -> set[str]:
        """Hostnames that must get no new placements."""
        with self._lock:
            return {n for n, h in self._hosts.items() if h.state != HostState.UP}

    def counts(self) -> dict[str, int]:
        with self._lock:
            out: dict[str, int] = {}
            for h in self._hosts.values():
                out[h.state.value] = out.get(h.state.value, 0) + 1
            return out

    def total(self) -> Resources:
        """What the hosts that are not DOWN have in all (summed again only after a change)."""
        with self._lock:
            if self._total is None:
                self._total = sum(
                    (h.total for h in self._hosts.values() if h.state != HostState.DOWN), ZERO
                )
            return self._total

    def capacity(self) -> dict[str, Resources]:
        """total, used and free of the hosts that are not DOWN."""
        # The host manager asks after every step of its worker: no views, no sorting.
        with self._lock:
            hosts = [
                (h.total, self._used(name))
                for name, h in self._hosts.items()
                if h.state != HostState.DOWN
            ]
        total = used = ZERO
        for host_total, host_used in hosts:
            total, used = total + host_total, used + host_used
        return {"total": total, "used": used, "free": (total - used).clamp_min_zero()}


def _max(a: Resources, b: Resources) -> Resources:
    return Resources(*(max(x, y) for (_, x), (_, y) in zip(a.items(), b.items(), strict=True)))
