"""The minicluster's in-memory objects: agents, executors, tasks, frameworks, offers, subscribers.

Agents own their executors and tasks (and each task's status update stream, as a Mesos agent's
status update manager does): they survive a master restart. Frameworks, offers and filters are the
master's and are lost with it.
"""

from __future__ import annotations

import queue
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peloton.minicluster.resources import ResourceSet
from peloton.minicluster.spec import AgentSpec
from peloton.minicluster.timers import Timer

TERMINAL_STATES = frozenset(
    {
        "TASK_FINISHED",
        "TASK_FAILED",
        "TASK_KILLED",
        "TASK_ERROR",
        "TASK_LOST",
        "TASK_DROPPED",
        "TASK_GONE",
        "TASK_GONE_BY_OPERATOR",
    }
)


class Subscriber:
    """One SUBSCRIBE connection: events put here are written to it by its HTTP handler thread.

    ``None`` in the queue means: end the stream.
    """

    def __init__(self, stream_id: str) -> None:
        self.stream_id = stream_id
        self.queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.closed = False

    def send(self, record: bytes) -> None:
        if not self.closed:
            self.queue.put(record)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put(None)


@dataclass
class Filter:
    """A DECLINE/ACCEPT refuse filter: don't re-offer these resources of one agent until then."""

    resources: ResourceSet
    until: float


@dataclass(eq=False)
class Framework:
    """A subscribed (or disconnected, within failover) framework."""

    id: str
    info: dict[str, Any]
    subscriber: Subscriber | None = None
    suppressed: set[str] = field(default_factory=set)
    filters: dict[str, Filter] = field(default_factory=dict)  # by agent id
    offers: set[str] = field(default_factory=set)
    failover_timer: Timer | None = None
    # Known only from the tasks agents reported after a master restart; no info until it
    # resubscribes.
    recovered: bool = False

    @property
    def connected(self) -> bool:
        return self.subscriber is not None and not self.subscriber.closed

    @property
    def name(self) -> str:
        return str(self.info.get("name", ""))

    @property
    def capabilities(self) -> frozenset[str]:
        caps = self.info.get("capabilities") or []
        return frozenset(c.get("type", "") for c in caps if isinstance(c, dict))

    @property
    def roles(self) -> tuple[str, ...]:
        if "MULTI_ROLE" in self.capabilities:
            return tuple(self.info.get("roles") or ()) or ("*",)
        return (str(self.info.get("role") or "*"),)

    @property
    def refinement(self) -> bool:
        """Whether it sees reservations refined (``reservations``) rather than ``role``."""
        return "RESERVATION_REFINEMENT" in self.capabilities

    @property
    def user(self) -> str:
        value = self.info.get("user", "")
        return value if isinstance(value, str) else ""

    @property
    def partition_aware(self) -> bool:
        return "PARTITION_AWARE" in self.capabilities

    @property
    def failover_timeout(self) -> float:
        value = self.info.get("failover_timeout", 0.0)
        return float(value) if isinstance(value, int | float) else 0.0

    def send(self, record: bytes) -> None:
        if self.subscriber is not None:
            self.subscriber.send(record)


@dataclass(eq=False)
class Offer:
    id: str
    framework_id: str
    agent_id: str
    resources: ResourceSet
    role: str = "*"  # the role it is allocated to (what its resources' allocation_info names)


@dataclass(eq=False)
class Executor:
    """An executor on an agent: the DEFAULT executor of a task group, or a command task's own."""

    executor_id: str
    framework_id: str
    resources: ResourceSet
    run_id: str
    directory: Path | None
    group: bool
    tasks: dict[str, Task] = field(default_factory=dict)
    # Set when one of its tasks failed or was killed: the others are being killed because of it.
    killing_cause: str = ""
    # The user its tasks run as (FrameworkInfo.user, or a command task's CommandInfo.user).
    user: str = ""
    # Why the agent could not start it (no such user...): its tasks are dropped.
    launch_error: str = ""
    # Who its processes run as when the agent switches users (it runs as root): uid, gid,
    # supplementary groups. None: as the agent itself.
    run_as: tuple[int, int, tuple[int, ...]] | None = None
    # Its ExecutorInfo (a task group's DEFAULT executor); {} for a command task's.
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class Task:
    """A launched task, owned by its agent."""

    task_id: str
    framework_id: str
    agent_id: str
    executor: Executor
    info: dict[str, Any]
    resources: ResourceSet
    gpus: tuple[int, ...] = ()
    state: str = "TASK_STAGING"
    status: dict[str, Any] = field(default_factory=dict)  # latest status, as sent
    killing: bool = False
    kill_cause: str = ""  # why it is being killed when its group takes it down
    # Its agent was killed: the process is gone and nothing more is reported.
    abandoned: bool = False
    # It ran past its TaskInfo.max_completion_time and is being killed for it.
    expired: bool = False
    kill_timer: Timer | None = None
    handle: Any = None  # the runner's (a Popen, a simulated timer)
    pid: int | None = None
    sandbox: Path | None = None
    # Who its processes run as (uid, gid, groups): its executor's ``run_as``, or for a task of a
    # group with a CommandInfo.user of its own, that user's (a nested container's user). None:
    # as the agent itself.
    run_as: tuple[int, int, tuple[int, ...]] | None = None
    # The status update stream: updates not yet acknowledged; the head has been sent.
    updates: deque[dict[str, Any]] = field(default_factory=deque)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(eq=False)
class Agent:
    """A Mesos agent: resources, attributes, executors and tasks, and its HTTP address."""

    id: str
    spec: AgentSpec
    total: ResourceSet
    attributes: list[dict[str, Any]]
    ip: str
    port: int
    path: str  # the libprocess id in offer urls, "/slave(1)"
    directory: Path | None
    used: ResourceSet = field(default_factory=ResourceSet)
    offered: ResourceSet = field(default_factory=ResourceSet)
    free: ResourceSet = field(default_factory=ResourceSet)  # total - used - offered, kept current
    gpus_free: list[int] = field(default_factory=list)
    executors: dict[tuple[str, str], Executor] = field(default_factory=dict)
    tasks: dict[tuple[str, str], Task] = field(default_factory=dict)
    # The parts of its offers' JSON that don't change (hostname, url, attributes), pre-encoded.
    offer_json: str = ""

    @property
    def hostname(self) -> str:
        return self.spec.hostname

    def refresh(self) -> None:
        """Recompute ``free`` after ``used`` or ``offered`` changed."""
        if self.used.is_empty() and self.offered.is_empty():
            self.free = self.total
        else:
            self.free = self.total - self.used - self.offered

    def url(self) -> dict[str, Any]:
        return {
            "scheme": "http",
            "address": {"hostname": self.hostname, "ip": self.ip, "port": self.port},
            "path": self.path,
        }
