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

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from peloton.core.capacity import Lost, LostHost, recently_lost
from peloton.core.hosts import HostRecord, HostState, HostStore, HostView
from peloton.core.records import parse_attempt_id
from peloton.core.resources import ZERO, Resources
from peloton.core.states import TASK_ACTIVE
from peloton.errors import FailedPrecondition, NotFound


@dataclass
class _Usage:
    by_attempt: dict[str, tuple[str, Resources]] = field(default_factory=dict)  # -> agent id
    by_host: dict[str, Resources] = field(default_factory=dict)


class HostRegistry:
    """Known hosts by agent id, with peloton's usage per running attempt. Thread-safe.

    Users name a host by agent id or by hostname; a hostname that several agents share is
    refused as ambiguous (Mesos registers several agents under one name)."""

    def __init__(self, store: HostStore, clock: Callable[[], datetime]) -> None:
        self._store = store
        self._clock = clock
        self._lock = threading.Lock()
        self._hosts: dict[str, HostRecord] = {h.agent_id: h for h in store.load_hosts()}
        self._usage = _Usage()
        self._total: Resources | None = None  # of the hosts not DOWN; None: to be summed
        self._superseded: list[str] = []  # agent ids whose records are to be deleted

    @classmethod
    def as_stored(cls, store: HostStore, clock: Callable[[], datetime]) -> HostRegistry:
        """The hosts, and what peloton's tasks hold on them, as the database has them now: the
        view of a daemon that does not hear from Mesos (a follower; its own registry is what
        the database held when it started)."""
        registry = cls(store, clock)
        for attempt, agent_id, resources in store.held(TASK_ACTIVE):
            registry.use(attempt, agent_id, resources)
        return registry

    # ------------------------------------------------------------------ what Mesos tells

    def observe(
        self,
        hostname: str,
        agent_id: str,
        offered: Resources,
        attributes: Mapping[str, str],
        address: str,
    ) -> HostRecord | None:
        """An offer (or the sum of an agent's held offers) was seen. Returns the host's new
        record if it changed (a new agent, a larger total, a new address), for the caller to
        :meth:`save` (in batches: offers come by the thousand); None if nothing changed. A new
        agent supersedes the DOWN records of its hostname and address (the same agent restarted
        under a new id)."""
        with self._lock:
            old = self._hosts.get(agent_id)
            if old is None:
                new = HostRecord(
                    hostname,
                    agent_id,
                    HostState.UP,
                    offered,
                    dict(attributes),
                    address,
                    self._clock(),
                )
                self._supersede(new)
            else:
                state = HostState.UP if old.state == HostState.DOWN else old.state
                new = replace(
                    old,
                    hostname=hostname,
                    state=state,
                    total=_max(old.total, offered),
                    attributes=dict(attributes),
                    address=address,
                )
                if new == old:
                    return None
                new = replace(new, updated_at=self._clock())
            self._hosts[agent_id] = new
            self._total = None
        return new

    def _supersede(self, new: HostRecord) -> None:
        for agent_id, h in list(self._hosts.items()):
            if h.state == HostState.DOWN and (h.hostname, h.address) == (
                new.hostname,
                new.address,
            ):
                del self._hosts[agent_id]
                self._superseded.append(agent_id)

    def save(self, records: Sequence[HostRecord]) -> None:
        """Persist records :meth:`observe` returned (and forget superseded ones)."""
        with self._lock:
            gone, self._superseded = self._superseded, []
        if records or gone:
            self._store.save_hosts(records, remove=gone)

    def agent_lost(self, agent_id: str) -> HostRecord | None:
        """Mark the host of a lost agent DOWN (it leaves the cluster's capacity)."""
        with self._lock:
            host = self._hosts.get(agent_id)
            if host is None or host.state == HostState.DOWN:
                return None
            new = replace(host, state=HostState.DOWN, updated_at=self._clock())
            self._hosts[agent_id] = new
            self._total = None
        self._store.save_hosts([new])
        return new

    # ------------------------------------------------------------------ peloton's usage

    def use(self, attempt_id: str, agent_id: str, resources: Resources) -> None:
        with self._lock:
            if attempt_id in self._usage.by_attempt:
                return
            self._usage.by_attempt[attempt_id] = (agent_id, resources)
            self._usage.by_host[agent_id] = self._used(agent_id) + resources

    def unuse(self, attempt_id: str) -> None:
        with self._lock:
            entry = self._usage.by_attempt.pop(attempt_id, None)
            if entry is not None:
                agent_id, resources = entry
                self._usage.by_host[agent_id] = (self._used(agent_id) - resources).clamp_min_zero()

    def host_of(self, attempt_id: str) -> str:
        """The agent id an attempt's usage is counted on ("" if none)."""
        with self._lock:
            entry = self._usage.by_attempt.get(attempt_id)
            return entry[0] if entry else ""

    def held(self, jobs: Collection[str]) -> dict[str, Resources]:
        """What the running attempts of ``jobs`` hold, by agent id."""
        by_host: dict[str, Resources] = {}
        with self._lock:
            for attempt, (agent_id, resources) in self._usage.by_attempt.items():
                parsed = parse_attempt_id(attempt)
                if parsed is not None and parsed[0] in jobs:
                    by_host[agent_id] = by_host.get(agent_id, ZERO) + resources
        return by_host

    def _used(self, agent_id: str) -> Resources:
        return self._usage.by_host.get(agent_id, ZERO)

    # ------------------------------------------------------------------ users

    def _find(self, name: str) -> HostRecord:
        """The host an agent id or a hostname names (NotFound; FailedPrecondition if the
        hostname is shared by several agents)."""
        host = self._hosts.get(name)
        if host is not None:
            return host
        named = sorted(
            (h for h in self._hosts.values() if h.hostname == name), key=lambda h: h.agent_id
        )
        if not named:
            raise NotFound(f"host {name} not found")
        if len(named) > 1:
            ids = ", ".join(h.agent_id for h in named)
            raise FailedPrecondition(
                f"hostname {name} names {len(named)} agents ({ids}): give its agent id"
            )
        return named[0]

    def get(self, name: str) -> HostView:
        """The host of an agent id or (unshared) hostname."""
        with self._lock:
            host = self._find(name)
            return HostView(host, self._used(host.agent_id))

    def list(self) -> list[HostView]:
        """Every host, by hostname then agent id."""
        with self._lock:
            hosts = sorted(self._hosts.values(), key=lambda h: (h.hostname, h.agent_id))
            return [HostView(h, self._used(h.agent_id)) for h in hosts]

    def set_draining(self, name: str, draining: bool) -> HostView:
        """Drain (no new placements) or undrain a host. A DOWN host can't be drained."""
        with self._lock:
            host = self._find(name)
            if host.state == HostState.DOWN:
                raise FailedPrecondition(f"host {name} is DOWN")
            state = HostState.DRAINING if draining else HostState.UP
            new = host if host.state == state else replace(host, state=state)
            if new is not host:
                new = replace(new, updated_at=self._clock())
                self._hosts[host.agent_id] = new
                self._total = None
            view = HostView(new, self._used(host.agent_id))
        if new is not host:
            self._store.save_hosts([new])
        return view

    def draining(self) -> set[str]:
        """Agent ids of the hosts that must get no new placements."""
        with self._lock:
            return {a for a, h in self._hosts.items() if h.state != HostState.UP}

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

    def recently_lost(self, grace_seconds: float) -> tuple[LostHost, ...]:
        """The DOWN hosts lost less than ``grace_seconds`` ago that are not back under a new
        agent id: they still count toward the capacity that decides what can never fit."""
        with self._lock:
            down = [
                Lost(h.hostname, h.total, h.updated_at)
                for h in self._hosts.values()
                if h.state == HostState.DOWN
            ]
            if not down:  # the usual case, asked after every step of the host manager
                return ()
            present = [h.hostname for h in self._hosts.values() if h.state != HostState.DOWN]
        return recently_lost(down, present, self._clock(), grace_seconds)

    def capacity(self) -> dict[str, Resources]:
        """total, used and free of the hosts that are not DOWN."""
        # The host manager asks after every step of its worker: no views, no sorting.
        with self._lock:
            hosts = [
                (h.total, self._used(agent_id))
                for agent_id, h in self._hosts.items()
                if h.state != HostState.DOWN
            ]
        total = used = ZERO
        for host_total, host_used in hosts:
            total, used = total + host_total, used + host_used
        return {"total": total, "used": used, "free": (total - used).clamp_min_zero()}


def _max(a: Resources, b: Resources) -> Resources:
    return Resources(*(max(x, y) for (_, x), (_, y) in zip(a.items(), b.items(), strict=True)))
