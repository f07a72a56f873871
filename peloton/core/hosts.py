"""Host records: what peloton knows of an agent (its resources, attributes, drain state), and
the store that persists them (implemented by :mod:`peloton.storage.hosts`)."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from peloton.core.resources import Resources
from peloton.core.states import TaskState


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

    def save_hosts(self, hosts: Sequence[HostRecord], remove: Sequence[str] = ()) -> None:
        """Insert or replace these host records, and delete those of the agent ids in
        ``remove`` (one transaction)."""
        ...

    def load_framework_id(self, name: str) -> str: ...

    def save_framework_id(self, name: str, framework_id: str) -> None: ...

    def active_attempts(self, states: Iterable[TaskState]) -> list[str]:
        """Mesos task ids of the current attempts of every task in ``states``."""
        ...

    def held(self, states: Iterable[TaskState]) -> list[tuple[str, str, Resources]]:
        """(Mesos task id, agent id, resources) of the current attempts in ``states`` that
        were launched on an agent: what peloton's tasks hold on each host, as stored."""
        ...

    def current_attempts(
        self, tasks: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[int, TaskState, str]]:
        """(attempt, state, host) of the current attempt of each (job id, instance id) given
        that exists."""
        ...
