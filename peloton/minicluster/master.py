"""The minicluster master: the Mesos v1 scheduler API's calls and events over in-memory agents.

Everything here runs under one re-entrant lock (``Master.lock``): HTTP handler threads, the timer
thread and task-process waiters all take it. Events for a framework are encoded here and queued on
its :class:`Subscriber`; the subscriber's HTTP thread writes them.

Faithful to Mesos 1.11 where a framework can tell: status updates carry uuids and are re-sent (by
the agent, with backoff) until acknowledged, one at a time per task; master-made updates
(reconciliation, invalid launches, lost agents) have no uuid; offers hold all of an agent's free
resources that the framework's role may have (unreserved, and statically reserved for that role:
``role``, or ``reservations`` for RESERVATION_REFINEMENT frameworks; ``allocation_info`` for
MULTI_ROLE ones); refuse filters hold back resources that fit inside what was declined; a launch
must name resources as offered (see :mod:`peloton.minicluster.validation`); agents may share a
hostname; an executor whose user is empty or unknown is dropped by its agent.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import logging
import signal
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from peloton.minicluster.model import (
    TERMINAL_STATES,
    Agent,
    Executor,
    Filter,
    Framework,
    Offer,
    Subscriber,
    Task,
)
from peloton.minicluster.recordio import encode, encode_event
from peloton.minicluster.resources import ResourceSet
from peloton.minicluster.spec import AgentSpec, attributes_json, parse_attributes
from peloton.minicluster.timers import Timers
from peloton.minicluster.validation import Invalid, plan_group, plan_launch, task_ids_of

log = logging.getLogger(__name__)

VERSION = "1.11.0"
DEFAULT_REFUSE_SECONDS = 5.0
DEFAULT_KILL_GRACE = 3.0
# The agent's status update re-send backoff (Mesos: 10 s doubling up to 10 min).
MAX_UPDATE_RETRY = 600.0
# Finished tasks kept for views and /master/state, as Mesos keeps completed tasks.
COMPLETED_KEPT = 10_000

KNOWN_CALLS = frozenset(
    {
        "SUBSCRIBE",
        "TEARDOWN",
        "ACCEPT",
        "DECLINE",
        "ACCEPT_INVERSE_OFFERS",
        "DECLINE_INVERSE_OFFERS",
        "REVIVE",
        "KILL",
        "SHUTDOWN",
        "ACKNOWLEDGE",
        "ACKNOWLEDGE_OPERATION_STATUS",
        "RECONCILE",
        "RECONCILE_OPERATIONS",
        "MESSAGE",
        "REQUEST",
        "SUPPRESS",
        "UPDATE_FRAMEWORK",
    }
)


class CallError(Exception):
    """A call refused with an HTTP status and Mesos's kind of message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Runner(Protocol):
    """Runs tasks on agents: real processes or a simulation. Called under the master lock; it
    reports through :meth:`Master.agent_update` and :meth:`Master.task_exited`."""

    def prepare(self, executor: Executor) -> str:
        """Make a new executor's run directory, owned by its user; '' or why it cannot be
        (the agent then fails its tasks)."""
        ...

    def start(self, agent: Agent, task: Task) -> None: ...

    def kill(self, task: Task, grace: float) -> None: ...

    def kill_agent(self, agent: Agent) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class TaskView:
    """A task as the minicluster sees it (``state`` is the Mesos name, e.g. TASK_RUNNING)."""

    task_id: str
    framework_id: str
    agent_id: str
    hostname: str
    executor_id: str
    state: str
    pid: int | None
    sandbox: Path | None
    gpus: tuple[int, ...]
    resources: str


@dataclass(frozen=True)
class FrameworkView:
    """A framework as the master sees it."""

    id: str
    name: str
    connected: bool
    roles: tuple[str, ...]
    suppressed: bool
    capabilities: frozenset[str]
    failover_timeout: float
    offers: int
    tasks: int
    stream_id: str | None


def _id(value: str) -> dict[str, str]:
    return {"value": value}


def _value(obj: Any) -> str | None:
    value = obj.get("value") if isinstance(obj, dict) else None
    return value if isinstance(value, str) and value else None


def _seconds(duration: Any) -> float | None:
    """A DurationInfo ``{"nanoseconds": N}`` in seconds (None if absent or malformed)."""
    nanos = duration.get("nanoseconds") if isinstance(duration, dict) else None
    if not isinstance(nanos, int | float) or isinstance(nanos, bool):
        return None
    return max(0.0, float(nanos) / 1e9)


def _grace(kill_policy: Any) -> float | None:
    return _seconds(kill_policy.get("grace_period")) if isinstance(kill_policy, dict) else None


class Master:
    """The master's state and logic; see the module docstring."""

    def __init__(
        self,
        timers: Timers,
        *,
        heartbeat_interval: float = 15.0,
        allocation_interval: float = 1.0,
        update_retry_interval: float = 10.0,
        hostname: str = "localhost",
        wallclock: Callable[[], float] = time.time,
    ) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.timers = timers
        self.heartbeat_interval = heartbeat_interval
        self.allocation_interval = allocation_interval
        self.update_retry_interval = update_retry_interval
        self.hostname = hostname
        self.port = 0
        self.wallclock = wallclock
        self.runner: Runner | None = None
        self.agents: dict[str, Agent] = {}
        self._json_cache: dict[tuple[ResourceSet, str | None, bool], str] = {}
        self._attribute_cache: dict[str, list[dict[str, Any]]] = {}
        self._attribute_text: dict[str, str] = {}
        self.generation = 0
        self.completed: deque[TaskView] = deque(maxlen=COMPLETED_KEPT)
        self._agent_seq = itertools.count()
        self._agent_prefix = str(uuid.uuid4())
        self._allocation_pending = False
        self._stopped = False
        self._reset()
        self.timers.call_later(allocation_interval, self._periodic_allocation)

    # ------------------------------------------------------------------ master state

    def _reset(self) -> None:
        """A fresh master: what a Mesos master knows after failover (its agents' tasks)."""
        self.id = str(uuid.uuid4())
        self.frameworks: dict[str, Framework] = {}
        self.offers: dict[str, Offer] = {}
        self.removed: set[str] = set()
        self.tasks: dict[tuple[str, str], Task] = {}
        self.unreachable: dict[tuple[str, str], dict[str, Any]] = {}
        self._framework_seq = itertools.count()
        self._offer_seq = itertools.count()
        self._offerable: set[str] = set()
        for agent in self.agents.values():
            agent.offered = ResourceSet()
            self._refresh(agent)
            for key, task in agent.tasks.items():
                self.tasks[key] = task
                if task.framework_id not in self.frameworks:
                    self.frameworks[task.framework_id] = Framework(
                        task.framework_id, {}, recovered=True
                    )

    def restart(self) -> None:
        """Lose the master's state but the agents (the registry): frameworks must resubscribe."""
        with self.lock:
            for fw in self.frameworks.values():
                if fw.failover_timer is not None:
                    fw.failover_timer.cancel()
                if fw.subscriber is not None:
                    fw.subscriber.close()
            self._reset()
            self._notify()

    def stop(self) -> None:
        with self.lock:
            self._stopped = True
            for fw in self.frameworks.values():
                if fw.subscriber is not None:
                    fw.subscriber.close()

    def _notify(self) -> None:
        """Wake whoever waits for a change (``Minicluster.wait_until``)."""
        self.generation += 1
        self.changed.notify_all()

    def _refresh(self, agent: Agent) -> None:
        agent.refresh()
        if agent.free.is_empty():
            self._offerable.discard(agent.id)
        else:
            self._offerable.add(agent.id)

    # ------------------------------------------------------------------ agents

    def add_agent(self, spec: AgentSpec, ip: str, port: int, directory: Path | None) -> Agent:
        """Register an agent (resources and attributes from its spec). Agents may share a
        hostname, as Mesos agents on one machine do: each has its own agent id."""
        with self.lock:
            n = next(self._agent_seq)
            total = spec.total()
            agent = Agent(
                id=f"{self._agent_prefix}-S{n}",
                spec=spec,
                total=total,
                attributes=self._attributes(spec.attributes),
                ip=ip,
                port=port,
                path=f"/slave({n + 1})",
                directory=directory,
                gpus_free=list(range(int(total.scalar("gpus")))),
            )
            agent.offer_json = (
                f'"hostname":{json.dumps(agent.hostname)},'
                f'"url":{json.dumps(agent.url(), separators=(",", ":"))},'
                f'"attributes":{self._attribute_text[spec.attributes]}'
            )
            self.agents[agent.id] = agent
            self._refresh(agent)
            self._request_allocation()
            self._notify()
            return agent

    def _attributes(self, text: str) -> list[dict[str, Any]]:
        """Attribute JSON by flag text, shared by agents of one spec (never mutated)."""
        found = self._attribute_cache.get(text)
        if found is None:
            found = self._attribute_cache[text] = attributes_json(parse_attributes(text))
            self._attribute_text[text] = json.dumps(found, separators=(",", ":"))
        return found

    def find_agent(self, ref: str) -> Agent:
        """The agent of id ``ref``, or the one agent of hostname ``ref``; KeyError if none, or if
        several agents share that hostname (the message lists their ids)."""
        found = self.agents.get(ref)
        if found is not None:
            return found
        named = [a for a in self.agents.values() if a.hostname == ref]
        if not named:
            raise KeyError(f"no agent named {ref}")
        if len(named) > 1:
            ids = ", ".join(a.id for a in named)
            raise KeyError(f"{ref} names {len(named)} agents ({ids}): give an agent id")
        return named[0]

    def remove_agent(self, agent: Agent, why: str) -> None:
        """The agent is gone (killed): its tasks are UNREACHABLE (LOST to frameworks that are not
        partition-aware), its offers rescinded, and every framework gets FAILURE."""
        with self.lock:
            if self.runner is not None:
                self.runner.kill_agent(agent)
            for offer in [o for o in self.offers.values() if o.agent_id == agent.id]:
                self._remove_offer(offer, rescind=True)
            now = self.wallclock()
            for key, task in list(agent.tasks.items()):
                task.abandoned = True
                self.tasks.pop(key, None)
                if task.terminal:
                    self._complete(task)
                    continue
                fw = self.frameworks.get(task.framework_id)
                aware = fw is not None and fw.partition_aware
                task.state = "TASK_UNREACHABLE" if aware else "TASK_LOST"
                self._complete(task)
                status = self._status(
                    task.task_id,
                    task.state,
                    "SOURCE_MASTER",
                    agent_id=agent.id,
                    executor_id=task.executor.executor_id,
                    reason="REASON_AGENT_REMOVED",
                    message=f"Agent {agent.hostname} ({agent.id}) is unreachable: {why}",
                )
                if aware:
                    status["unreachable_time"] = {"nanoseconds": int(now * 1e9)}
                    self.unreachable[key] = status
                if fw is not None:
                    fw.send(encode_event({"type": "UPDATE", "update": {"status": status}}))
            agent.tasks.clear()
            agent.executors.clear()
            del self.agents[agent.id]
            self._offerable.discard(agent.id)
            failure = encode_event({"type": "FAILURE", "failure": {"agent_id": _id(agent.id)}})
            for fw in self.frameworks.values():
                fw.filters.pop(agent.id, None)
                fw.send(failure)
            self._notify()

    # ------------------------------------------------------------------ subscription

    def subscribe(self, call: dict[str, Any]) -> tuple[Subscriber, Framework]:
        """Handle SUBSCRIBE (already validated): a new or failed-over framework and its stream."""
        info = call["subscribe"]["framework_info"]
        fid = _value(call.get("framework_id"))
        with self.lock:
            if self._stopped:
                raise CallError(503, "Master is shutting down")
            sub = Subscriber(str(uuid.uuid4()))
            if fid is not None and fid in self.removed:
                sub.send(_error_event("Framework has been removed"))
                sub.close()
                return sub, Framework(fid, info)
            fw = self.frameworks.get(fid) if fid is not None else None
            if (
                fw is not None
                and not fw.recovered
                and fw.info.get("principal", "") != info.get("principal", "")
            ):
                # Mesos answers 200 and this error event; the framework goes on as it was.
                sub.send(_error_event("Changing framework's principal is not allowed."))
                sub.close()
                return sub, fw
            if fw is None:
                fid = fid or f"{self.id}-{next(self._framework_seq):04d}"
                fw = self.frameworks[fid] = Framework(fid, info)
            else:
                self._take_over(fw, info)
            fw.subscriber = sub
            fw.suppressed = {r for r in call["subscribe"].get("suppressed_roles") or ()}
            sub.send(self._subscribed_event(fw))
            sub.send(encode_event({"type": "HEARTBEAT"}))
            log.info(
                "framework subscribed", extra={"framework_id": fw.id, "framework_name": fw.name}
            )
            self._resend_pending(fw)
            self._request_allocation()
            self._notify()
            return sub, fw

    def _take_over(self, fw: Framework, info: dict[str, Any]) -> None:
        """A framework resubscribing with its id: the old stream (if any) learns it failed over."""
        if fw.failover_timer is not None:
            fw.failover_timer.cancel()
            fw.failover_timer = None
        if fw.subscriber is not None and not fw.subscriber.closed:
            fw.subscriber.send(_error_event("Framework failed over"))
            fw.subscriber.close()
        for offer_id in list(fw.offers):
            self._remove_offer(self.offers[offer_id], rescind=False)
        fw.info = info
        fw.recovered = False

    def _subscribed_event(self, fw: Framework) -> bytes:
        return encode_event(
            {
                "type": "SUBSCRIBED",
                "subscribed": {
                    "framework_id": _id(fw.id),
                    "heartbeat_interval_seconds": self.heartbeat_interval,
                    "master_info": self.master_info(),
                },
            }
        )

    def master_info(self) -> dict[str, Any]:
        """MasterInfo as SUBSCRIBED carries it."""
        ip = 0x0100007F  # 127.0.0.1 in network byte order read as a little-endian uint32
        return {
            "id": self.id,
            "ip": ip,
            "port": self.port,
            "pid": f"master@127.0.0.1:{self.port}",
            "hostname": self.hostname,
            "version": VERSION,
            "address": {"hostname": self.hostname, "ip": "127.0.0.1", "port": self.port},
            "capabilities": [{"type": "AGENT_UPDATE"}, {"type": "QUOTA_V2"}],
        }

    def disconnected(self, sub: Subscriber) -> None:
        """A subscriber's connection ended: its framework (if still its) waits for failover."""
        with self.lock:
            sub.close()
            fw = next((f for f in self.frameworks.values() if f.subscriber is sub), None)
            if fw is None:
                return
            for offer_id in list(fw.offers):
                self._remove_offer(self.offers[offer_id], rescind=False)
            timeout = fw.failover_timeout
            log.info("framework disconnected", extra={"framework_id": fw.id, "failover": timeout})
            fw.failover_timer = self.timers.call_later(
                timeout, self._locked(lambda: self._failover_expired(fw))
            )
            self._notify()

    def _failover_expired(self, fw: Framework) -> None:
        if self.frameworks.get(fw.id) is fw and not fw.connected:
            log.info("framework failover timeout passed", extra={"framework_id": fw.id})
            self._remove_framework(fw, "its failover timeout passed")

    def _remove_framework(self, fw: Framework, why: str) -> None:
        """TEARDOWN or failover timeout: kill its tasks, drop its offers, forget it."""
        for offer_id in list(fw.offers):
            self._remove_offer(self.offers[offer_id], rescind=False)
        del self.frameworks[fw.id]
        self.removed.add(fw.id)
        if fw.subscriber is not None:
            fw.subscriber.close()
        for key in [k for k in self.tasks if k[0] == fw.id]:
            task = self.tasks[key]
            task.updates.clear()
            if task.terminal:
                self._remove_task(task)
            else:
                self._kill_task(task, None, f"framework {fw.id} was removed: {why}")
        for key in [k for k in self.unreachable if k[0] == fw.id]:
            del self.unreachable[key]
        self._notify()

    # ------------------------------------------------------------------ calls

    def call(
        self, call: dict[str, Any], stream_id: str | None, principal: str | None = None
    ) -> None:
        """Handle a non-SUBSCRIBE call (already validated for shape); raises CallError.
        ``principal``: the one the request authenticated as (None: not authenticated)."""
        fid = _value(call.get("framework_id"))
        with self.lock:
            fw = self.frameworks.get(fid or "")
            if fw is None or fw.recovered:
                raise CallError(403, "Framework cannot be found")
            if principal is not None and principal != fw.info.get("principal", ""):
                raise CallError(
                    400,
                    f"Authenticated principal '{principal}' does not match principal "
                    f"'{fw.info.get('principal', '')}' set in `FrameworkInfo`",
                )
            if fw.subscriber is None or fw.subscriber.closed:
                raise CallError(403, "Framework is not subscribed")
            if stream_id is None:
                raise CallError(
                    400, "All non-subscribe calls should include the 'Mesos-Stream-Id' header"
                )
            if stream_id != fw.subscriber.stream_id:
                raise CallError(
                    400,
                    f"The stream ID '{stream_id}' included in this request didn't match the "
                    f"stream ID currently associated with framework ID {fw.id}",
                )
            handler = self._handlers().get(call["type"])
            if handler is not None:
                handler(fw, call.get(call["type"].lower()) or {})
            self._notify()

    def _handlers(self) -> dict[str, Callable[[Framework, dict[str, Any]], None]]:
        return {
            "TEARDOWN": lambda fw, _: self._remove_framework(fw, "TEARDOWN"),
            "ACCEPT": self._accept,
            "DECLINE": self._decline,
            "REVIVE": self._revive,
            "SUPPRESS": self._suppress,
            "KILL": self._kill_call,
            "SHUTDOWN": self._shutdown_call,
            "ACKNOWLEDGE": self._acknowledge,
            "RECONCILE": self._reconcile,
        }

    def _decline(self, fw: Framework, body: dict[str, Any]) -> None:
        refuse = _refuse_seconds(body.get("filters"))
        for offer_id in _ids(body.get("offer_ids")):
            offer = self.offers.get(offer_id)
            if offer is not None and offer.framework_id == fw.id:
                self._remove_offer(offer, rescind=False, refuse=refuse)

    def _revive(self, fw: Framework, body: dict[str, Any]) -> None:
        roles = body.get("roles") or fw.roles
        fw.suppressed.difference_update(roles)
        fw.filters.clear()
        self._request_allocation()

    def _suppress(self, fw: Framework, body: dict[str, Any]) -> None:
        fw.suppressed.update(body.get("roles") or fw.roles)

    def _kill_call(self, fw: Framework, body: dict[str, Any]) -> None:
        task_id = _value(body.get("task_id"))
        if task_id is None:
            return
        task = self.tasks.get((fw.id, task_id))
        if task is None:
            # As Mesos: an unknown task is answered like a reconciliation of it.
            self._send_reconcile(fw, task_id, "Attempted to kill an unknown task")
            return
        self._kill_task(task, _grace(body.get("kill_policy")))

    def _shutdown_call(self, fw: Framework, body: dict[str, Any]) -> None:
        executor_id, agent_id = _value(body.get("executor_id")), _value(body.get("agent_id"))
        agent = self.agents.get(agent_id or "")
        executor = agent.executors.get((fw.id, executor_id or "")) if agent else None
        if executor is not None:
            for task in list(executor.tasks.values()):
                self._kill_task(task, None, f"executor {executor_id} was shut down")

    def _acknowledge(self, fw: Framework, body: dict[str, Any]) -> None:
        task = self.tasks.get((fw.id, _value(body.get("task_id")) or ""))
        raw = body.get("uuid")
        if task is None or not task.updates or task.updates[0].get("uuid") != raw:
            log.debug("unexpected acknowledgement", extra={"framework_id": fw.id, "uuid": raw})
            return
        task.updates.popleft()
        if task.updates:
            self._forward(task)
        elif task.terminal:
            self._remove_task(task)

    def _reconcile(self, fw: Framework, body: dict[str, Any]) -> None:
        wanted = body.get("tasks") or []
        if not wanted:  # implicit: everything the master knows of this framework
            for key, task in self.tasks.items():
                if key[0] == fw.id:
                    self._send_reconcile(fw, task.task_id)
            for key in self.unreachable:
                if key[0] == fw.id:
                    self._send_reconcile(fw, key[1])
            return
        for entry in wanted:
            task_id = _value(entry.get("task_id")) if isinstance(entry, dict) else None
            if task_id is not None:
                self._send_reconcile(fw, task_id, "Reconciliation: Task is unknown")

    def _send_reconcile(self, fw: Framework, task_id: str, unknown: str = "") -> None:
        task = self.tasks.get((fw.id, task_id))
        if task is not None:
            status = self._status(
                task_id,
                task.state,
                "SOURCE_MASTER",
                agent_id=task.agent_id,
                executor_id=task.executor.executor_id,
                reason="REASON_RECONCILIATION",
                message="Reconciliation: Latest task state",
            )
        elif (fw.id, task_id) in self.unreachable:
            status = dict(self.unreachable[(fw.id, task_id)])
            status.update(reason="REASON_RECONCILIATION", source="SOURCE_MASTER")
            status["timestamp"] = self.wallclock()
            if not fw.partition_aware:
                status["state"] = "TASK_LOST"
        else:
            status = self._status(
                task_id,
                "TASK_UNKNOWN" if fw.partition_aware else "TASK_LOST",
                "SOURCE_MASTER",
                reason="REASON_RECONCILIATION",
                message=unknown or "Reconciliation: Task is unknown",
            )
        fw.send(encode_event({"type": "UPDATE", "update": {"status": status}}))

    # ------------------------------------------------------------------ ACCEPT

    def _accept(self, fw: Framework, body: dict[str, Any]) -> None:
        offer_ids = _ids(body.get("offer_ids"))
        operations = [op for op in body.get("operations") or [] if isinstance(op, dict)]
        offers, error = self._take_offers(fw, offer_ids)
        if error:
            for offer in offers:
                self._recover(offer)
            self._fail_operations(fw, operations, error)
            return
        agent = self.agents[offers[0].agent_id]
        remaining = ResourceSet()
        for offer in offers:
            remaining = remaining + offer.resources
            agent.offered = agent.offered - offer.resources
        for op in operations:
            remaining = self._operation(fw, agent, op, remaining, offers[0].role)
        if not remaining.is_empty():
            refuse = _refuse_seconds(body.get("filters"))
            if refuse > 0:
                fw.filters[agent.id] = Filter(remaining, self.timers.clock() + refuse)
        self._refresh(agent)

    def _take_offers(self, fw: Framework, offer_ids: list[str]) -> tuple[list[Offer], str]:
        """Remove the offers from the framework; (offers, the validation error or '')."""
        offers: list[Offer] = []
        error = "" if offer_ids else "No offers specified"
        if len(set(offer_ids)) != len(offer_ids):
            error = "Duplicate offers specified"
        for offer_id in dict.fromkeys(offer_ids):
            offer = self.offers.get(offer_id)
            if offer is None or offer.framework_id != fw.id:
                error = error or f"Offer {offer_id} is no longer valid"
                continue
            del self.offers[offer_id]
            fw.offers.discard(offer_id)
            offers.append(offer)
        if not error and len({o.agent_id for o in offers}) > 1:
            error = "Aggregated offers must belong to one single agent"
        return offers, error

    def _fail_operations(self, fw: Framework, operations: list[dict[str, Any]], error: str) -> None:
        state = "TASK_DROPPED" if fw.partition_aware else "TASK_LOST"
        for op in operations:
            for task_id in _operation_task_ids(op):
                self._master_update(
                    fw,
                    task_id,
                    state,
                    "REASON_INVALID_OFFERS",
                    f"Task launched with invalid offers: {error}",
                )

    def _operation(
        self,
        fw: Framework,
        agent: Agent,
        op: dict[str, Any],
        remaining: ResourceSet,
        offer_role: str,
    ) -> ResourceSet:
        """Apply one operation of an ACCEPT; the resources left for the next."""

        def in_use(task_id: str) -> bool:
            return (fw.id, task_id) in self.tasks

        kind = op.get("type")
        if kind == "LAUNCH":
            infos = (op.get("launch") or {}).get("task_infos")
            planned, errors, remaining = plan_launch(infos, agent.id, remaining, in_use, offer_role)
            for task_id, message in errors:
                self._master_update(
                    fw, task_id, "TASK_ERROR", "REASON_TASK_INVALID", message, agent.id
                )
            for p in planned:
                executor = self._executor(
                    agent, fw, p.task_id, ResourceSet(), False, command_user(p.info) or fw.user
                )
                self._launch(agent, executor, p.info, p.task_id, p.resources)
                self._drop_if_not_started(executor)
            return remaining
        if kind == "LAUNCH_GROUP":
            body = op.get("launch_group")
            try:
                plan = plan_group(
                    body,
                    fw.id,
                    agent.id,
                    remaining,
                    in_use,
                    lambda eid: (fw.id, eid) in agent.executors,
                    offer_role,
                )
            except Invalid as exc:
                for task_id in _operation_task_ids(op):
                    self._master_update(
                        fw, task_id, "TASK_ERROR", "REASON_TASK_GROUP_INVALID", str(exc), agent.id
                    )
                return remaining
            executor = self._executor(
                agent, fw, plan.executor_id, plan.executor_resources, True, fw.user, plan.executor
            )
            remaining = remaining - plan.executor_resources
            for p in plan.tasks:
                remaining = remaining - p.resources
                self._launch(agent, executor, p.info, p.task_id, p.resources)
            self._drop_if_not_started(executor)
            return remaining
        log.warning("unsupported offer operation ignored", extra={"type": kind})
        return remaining

    def _executor(
        self,
        agent: Agent,
        fw: Framework,
        executor_id: str,
        resources: ResourceSet,
        group: bool,
        user: str,
        info: dict[str, Any] | None = None,
    ) -> Executor:
        key = (fw.id, executor_id)
        executor = agent.executors.get(key)
        if executor is None:
            run_id = str(uuid.uuid4())
            directory = None
            if agent.directory is not None:
                directory = (
                    agent.directory / "frameworks" / fw.id / "executors" / executor_id / "runs"
                ) / run_id
            executor = Executor(
                executor_id, fw.id, resources, run_id, directory, group, user=user, info=info or {}
            )
            agent.executors[key] = executor
            agent.used = agent.used + resources
            assert self.runner is not None
            executor.launch_error = self.runner.prepare(executor)
        return executor

    def _launch(
        self,
        agent: Agent,
        executor: Executor,
        info: dict[str, Any],
        task_id: str,
        resources: ResourceSet,
    ) -> None:
        gpus = int(resources.scalar("gpus"))
        assigned, agent.gpus_free = tuple(agent.gpus_free[:gpus]), agent.gpus_free[gpus:]
        task = Task(
            task_id=task_id,
            framework_id=executor.framework_id,
            agent_id=agent.id,
            executor=executor,
            info=info,
            resources=resources,
            gpus=assigned,
        )
        agent.used = agent.used + resources
        key = (executor.framework_id, task_id)
        agent.tasks[key] = task
        executor.tasks[task_id] = task
        self.tasks[key] = task
        self.unreachable.pop(key, None)
        if executor.launch_error:
            return  # the caller drops it, with the rest of its group
        assert self.runner is not None
        self.runner.start(agent, task)
        limit = _seconds(info.get("max_completion_time"))
        if limit is not None and not task.terminal:
            self.timers.call_later(limit, self._locked(lambda: self._expire(task, limit)))

    def _expire(self, task: Task, limit: float) -> None:
        """max_completion_time passed: the executor kills the task and reports it FAILED."""
        if task.terminal or task.abandoned or task.killing:
            return
        task.expired = True
        self._kill_task(task, None, f"Task exceeded its maximum completion time of {limit:g}s")

    # ------------------------------------------------------------------ offers

    def _request_allocation(self) -> None:
        """Allocate soon (batched: many triggers, one pass)."""
        if not self._allocation_pending:
            self._allocation_pending = True
            self.timers.call_later(0.0, self._locked(self._allocate))

    def _periodic_allocation(self) -> None:
        if self._stopped:
            return
        with self.lock:
            self._allocate()
        self.timers.call_later(self.allocation_interval, self._periodic_allocation)

    def _allocate(self) -> None:
        """Offer every agent's free resources to the frameworks that want offers."""
        self._allocation_pending = False
        if self._stopped:
            return
        now = self.timers.clock()
        for fw in list(self.frameworks.values()):
            if not fw.connected or not self._offerable:
                continue
            if fw.suppressed.issuperset(fw.roles):
                continue
            role = next(r for r in fw.roles if r not in fw.suppressed)
            fw_json = json.dumps(_id(fw.id))
            offers = [
                self._make_offer(fw, fw_json, agent, role, resources)
                for agent, resources in self._candidates(fw, role, now)
            ]
            if offers:
                # Assembled from pre-encoded pieces: 10,000 offers in one event stay cheap.
                event = '{"type":"OFFERS","offers":{"offers":[' + ",".join(offers) + "]}}"
                fw.send(encode(event.encode("utf-8")))
        self._notify()

    def _candidates(
        self, fw: Framework, role: str, now: float
    ) -> Iterable[tuple[Agent, ResourceSet]]:
        """Agents with something to offer ``fw`` for ``role`` (the unreserved part of what is
        free and what is reserved for ``role``), and that."""
        gpu_ok = "GPU_RESOURCES" in fw.capabilities
        for agent_id in list(self._offerable):
            agent = self.agents[agent_id]
            if not gpu_ok and agent.total.scalar("gpus") > 0:
                continue  # as Mesos: no offers at all from GPU agents without GPU_RESOURCES
            offerable = agent.free.for_role(role)
            if offerable.is_empty():
                continue  # only reservations of other roles are free
            refused = fw.filters.get(agent_id)
            if refused is not None:
                if refused.until <= now:
                    del fw.filters[agent_id]
                elif refused.resources.contains(offerable):
                    continue
            yield agent, offerable

    def _make_offer(
        self, fw: Framework, fw_json: str, agent: Agent, role: str, resources: ResourceSet
    ) -> str:
        """Offer ``resources`` (all the agent has free for ``role``) to ``fw``; the offer's
        JSON, as Mesos 1.11 shows it to ``fw`` (allocation_info only with MULTI_ROLE)."""
        offer = Offer(f"{self.id}-O{next(self._offer_seq)}", fw.id, agent.id, resources, role)
        self.offers[offer.id] = offer
        fw.offers.add(offer.id)
        agent.offered = resources if agent.offered.is_empty() else agent.offered + resources
        if resources is agent.free:
            agent.free = ResourceSet()
            self._offerable.discard(agent.id)
        else:
            self._refresh(agent)
        alloc_role = role if "MULTI_ROLE" in fw.capabilities else None
        alloc = ""
        if alloc_role is not None:
            alloc = ',"allocation_info":' + json.dumps({"role": alloc_role})
        return (
            f'{{"id":{{"value":"{offer.id}"}},"framework_id":{fw_json},'
            f'"agent_id":{{"value":"{agent.id}"}},{agent.offer_json},'
            f'"resources":{self._resources_json(resources, alloc_role, fw.refinement)}{alloc}}}'
        )

    def _resources_json(
        self, resources: ResourceSet, alloc_role: str | None, refinement: bool
    ) -> str:
        """Resources as offer JSON, cached: idle agents of one kind share the same text."""
        key = (resources, alloc_role, refinement)
        text = self._json_cache.get(key)
        if text is None:
            if len(self._json_cache) > 10_000:
                self._json_cache.clear()
            text = json.dumps(resources.to_json(alloc_role, refinement), separators=(",", ":"))
            self._json_cache[key] = text
        return text

    def _remove_offer(self, offer: Offer, rescind: bool, refuse: float = 0.0) -> None:
        self.offers.pop(offer.id, None)
        fw = self.frameworks.get(offer.framework_id)
        if fw is not None:
            fw.offers.discard(offer.id)
            if rescind:
                fw.send(encode_event({"type": "RESCIND", "rescind": {"offer_id": _id(offer.id)}}))
        agent = self.agents.get(offer.agent_id)
        if agent is not None:
            agent.offered = agent.offered - offer.resources
            self._refresh(agent)
            if fw is not None and refuse > 0:
                fw.filters[agent.id] = Filter(offer.resources, self.timers.clock() + refuse)

    def _recover(self, offer: Offer) -> None:
        """Resources of an offer taken by ACCEPT go back to the agent."""
        agent = self.agents.get(offer.agent_id)
        if agent is not None:
            agent.offered = agent.offered - offer.resources
            self._refresh(agent)

    def rescind_all(self) -> None:
        """Rescind every outstanding offer (fault injection and tests)."""
        with self.lock:
            for offer in list(self.offers.values()):
                self._remove_offer(offer, rescind=True)

    # ------------------------------------------------------------------ task status

    def _status(
        self,
        task_id: str,
        state: str,
        source: str,
        *,
        agent_id: str | None = None,
        executor_id: str | None = None,
        reason: str | None = None,
        message: str | None = None,
        with_uuid: bool = False,
    ) -> dict[str, Any]:
        status: dict[str, Any] = {
            "task_id": _id(task_id),
            "state": state,
            "source": source,
            "timestamp": self.wallclock(),
        }
        if agent_id:
            status["agent_id"] = _id(agent_id)
        if executor_id:
            status["executor_id"] = _id(executor_id)
        if reason:
            status["reason"] = reason
        if message:
            status["message"] = message
        if with_uuid:
            status["uuid"] = base64.b64encode(uuid.uuid4().bytes).decode("ascii")
        return status

    def _master_update(
        self,
        fw: Framework,
        task_id: str,
        state: str,
        reason: str,
        message: str,
        agent_id: str | None = None,
    ) -> None:
        status = self._status(
            task_id, state, "SOURCE_MASTER", agent_id=agent_id, reason=reason, message=message
        )
        fw.send(encode_event({"type": "UPDATE", "update": {"status": status}}))

    def agent_update(
        self,
        task: Task,
        state: str,
        message: str = "",
        reason: str | None = None,
        source: str = "SOURCE_EXECUTOR",
    ) -> None:
        """The task's executor (or agent) reports a new state (runners call this, under the
        lock)."""
        if task.terminal or task.abandoned:
            return
        status = self._status(
            task.task_id,
            state,
            source,
            agent_id=task.agent_id,
            executor_id=task.executor.executor_id,
            reason=reason,
            message=message or None,
            with_uuid=True,
        )
        task.state, task.status = state, status
        if state in TERMINAL_STATES:
            self._release(task)
        if task.framework_id in self.removed:
            if task.terminal:
                self._remove_task(task)
        else:
            task.updates.append(status)
            if len(task.updates) == 1:
                self._forward(task)
        if state in ("TASK_FAILED", "TASK_KILLED"):
            self._take_group_down(task, state, message)
        self._notify()

    def _drop_if_not_started(self, executor: Executor) -> None:
        """The agent could not start the executor (as a Mesos agent that cannot create the
        executor's directory for its user): each of its tasks is TASK_DROPPED (TASK_LOST if the
        framework is not partition-aware), REASON_EXECUTOR_TERMINATED, from the agent."""
        if not executor.launch_error:
            return
        fw = self.frameworks.get(executor.framework_id)
        state = "TASK_DROPPED" if fw is not None and fw.partition_aware else "TASK_LOST"
        for task in list(executor.tasks.values()):
            self.agent_update(
                task, state, executor.launch_error, "REASON_EXECUTOR_TERMINATED", "SOURCE_AGENT"
            )

    def task_exited(self, task: Task, returncode: int | None, error: str = "") -> None:
        """A task's process ended (``returncode`` as Popen: negative is a signal); or could not
        start (``error``)."""
        if task.kill_timer is not None:
            task.kill_timer.cancel()
        if error:
            self.agent_update(task, "TASK_FAILED", error, "REASON_EXECUTOR_TERMINATED")
        elif task.expired:
            self.agent_update(
                task, "TASK_FAILED", task.kill_cause, "REASON_MAX_COMPLETION_TIME_REACHED"
            )
        elif task.killing:
            self.agent_update(task, "TASK_KILLED", task.kill_cause or _exit_text(returncode))
        elif returncode == 0:
            self.agent_update(task, "TASK_FINISHED", _exit_text(returncode))
        else:
            self.agent_update(task, "TASK_FAILED", _exit_text(returncode))

    def _take_group_down(self, task: Task, state: str, message: str) -> None:
        """The default executor's rule: a task that fails or is killed kills the rest."""
        executor = task.executor
        if not executor.group or executor.killing_cause:
            return
        verb = "failed" if state == "TASK_FAILED" else "was killed"
        executor.killing_cause = f"task '{task.task_id}' of its group {verb}" + (
            f" ({message})" if message else ""
        )
        for other in list(executor.tasks.values()):
            if other is not task and not other.terminal:
                self._kill_task(other, None, f"Killed because {executor.killing_cause}")

    def _kill_task(self, task: Task, grace: float | None, cause: str = "") -> None:
        if task.terminal or task.killing or task.abandoned:
            return
        task.killing = True
        task.kill_cause = cause
        fw = self.frameworks.get(task.framework_id)
        if fw is not None and "TASK_KILLING_STATE" in fw.capabilities:
            self.agent_update(task, "TASK_KILLING", cause)
        if grace is None:
            grace = _grace(task.info.get("kill_policy"))
        assert self.runner is not None
        self.runner.kill(task, DEFAULT_KILL_GRACE if grace is None else grace)

    def _release(self, task: Task) -> None:
        agent = self.agents.get(task.agent_id)
        if agent is None:
            return
        agent.used = agent.used - task.resources
        agent.gpus_free = sorted(agent.gpus_free + list(task.gpus))
        executor = task.executor
        if all(t.terminal for t in executor.tasks.values()):
            # The executor exits with its last task; as Mesos, the framework hears of it.
            agent.used = agent.used - executor.resources
            agent.executors.pop((executor.framework_id, executor.executor_id), None)
            failed = any(t.state != "TASK_FINISHED" for t in executor.tasks.values())
            fw = self.frameworks.get(executor.framework_id)
            # An executor that never started is reported only for a task group (Mesos 1.11:
            # status -1 then, and nothing for a command task's).
            if fw is not None and (executor.group or not executor.launch_error):
                failure = {
                    "agent_id": _id(agent.id),
                    "executor_id": _id(executor.executor_id),
                    "status": -1 if executor.launch_error else 1 if failed else 0,
                }
                fw.send(encode_event({"type": "FAILURE", "failure": failure}))
        self._refresh(agent)

    def _remove_task(self, task: Task) -> None:
        key = (task.framework_id, task.task_id)
        self.tasks.pop(key, None)
        agent = self.agents.get(task.agent_id)
        if agent is not None:
            agent.tasks.pop(key, None)
        task.executor.tasks.pop(task.task_id, None)
        self._complete(task)

    def _complete(self, task: Task) -> None:
        self.completed.append(self._view(task))

    def _forward(self, task: Task) -> None:
        """Send the head of the task's update stream; re-sent with backoff until acknowledged."""
        head = task.updates[0]
        fw = self.frameworks.get(task.framework_id)
        if fw is not None:
            fw.send(encode_event({"type": "UPDATE", "update": {"status": head}}))
        self._schedule_retry(task, head["uuid"], self.update_retry_interval)

    def _schedule_retry(self, task: Task, uid: str, delay: float) -> None:
        def retry() -> None:
            with self.lock:
                if not task.updates or task.updates[0]["uuid"] != uid or task.abandoned:
                    return
                fw = self.frameworks.get(task.framework_id)
                if fw is not None:
                    fw.send(encode_event({"type": "UPDATE", "update": {"status": task.updates[0]}}))
                self._schedule_retry(task, uid, min(delay * 2, MAX_UPDATE_RETRY))

        self.timers.call_later(delay, retry)

    def _resend_pending(self, fw: Framework) -> None:
        """A (re)subscribed framework gets the unacknowledged updates of its tasks now."""
        for key, task in self.tasks.items():
            if key[0] == fw.id and task.updates:
                fw.send(encode_event({"type": "UPDATE", "update": {"status": task.updates[0]}}))

    # ------------------------------------------------------------------ views

    def _locked(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            with self.lock:
                fn()

        return run

    def _view(self, task: Task) -> TaskView:
        agent = self.agents.get(task.agent_id)
        return TaskView(
            task_id=task.task_id,
            framework_id=task.framework_id,
            agent_id=task.agent_id,
            hostname=agent.hostname if agent is not None else "",
            executor_id=task.executor.executor_id,
            state=task.state,
            pid=task.pid,
            sandbox=task.sandbox,
            gpus=task.gpus,
            resources=str(task.resources),
        )

    def task_views(self) -> list[TaskView]:
        """Active tasks (and those whose last update is not acknowledged yet), then completed."""
        with self.lock:
            live = [self._view(t) for a in self.agents.values() for t in a.tasks.values()]
            live_keys = {(v.framework_id, v.task_id) for v in live}
            done = [v for v in self.completed if (v.framework_id, v.task_id) not in live_keys]
            return live + done

    def framework_views(self) -> list[FrameworkView]:
        with self.lock:
            return [
                FrameworkView(
                    id=fw.id,
                    name=fw.name,
                    connected=fw.connected,
                    roles=fw.roles,
                    suppressed=fw.suppressed.issuperset(fw.roles),
                    capabilities=fw.capabilities,
                    failover_timeout=fw.failover_timeout,
                    offers=len(fw.offers),
                    tasks=sum(1 for k in self.tasks if k[0] == fw.id),
                    stream_id=fw.subscriber.stream_id if fw.connected and fw.subscriber else None,
                )
                for fw in self.frameworks.values()
            ]

    def state_json(self) -> dict[str, Any]:
        """A subset of Mesos's ``/master/state``."""
        with self.lock:
            return {
                "version": VERSION,
                "id": self.id,
                "pid": f"master@127.0.0.1:{self.port}",
                "hostname": self.hostname,
                "activated_slaves": len(self.agents),
                "slaves": [_agent_state(a) for a in self.agents.values()],
                "frameworks": [self._framework_state(fw) for fw in self.frameworks.values()],
            }

    def _framework_state(self, fw: Framework) -> dict[str, Any]:
        tasks = [t for k, t in self.tasks.items() if k[0] == fw.id]
        # Mesos leaves "principal" out of a framework that has none.
        principal = {"principal": fw.info["principal"]} if fw.info.get("principal") else {}
        return {
            "id": fw.id,
            "name": fw.name,
            **principal,
            "active": fw.connected and not fw.suppressed.issuperset(fw.roles),
            "connected": fw.connected,
            "recovered": fw.recovered,
            "roles": list(fw.roles),
            "capabilities": sorted(fw.capabilities),
            "failover_timeout": fw.failover_timeout,
            "user": fw.user,
            "offers": [{"id": o, "agent_id": self.offers[o].agent_id} for o in sorted(fw.offers)],
            "tasks": [
                {
                    "id": t.task_id,
                    "framework_id": fw.id,
                    "slave_id": t.agent_id,
                    "executor_id": t.executor.executor_id,
                    "state": t.state,
                    "resources": t.resources.to_state(),
                    # As a real master: the user only where the TaskInfo's command names one.
                    **({"user": command_user(t.info)} if command_user(t.info) else {}),
                }
                for t in tasks
            ],
        }


def _agent_state(agent: Agent) -> dict[str, Any]:
    return {
        "id": agent.id,
        "hostname": agent.hostname,
        "pid": f"slave({agent.path[7:-1]})@{agent.ip}:{agent.port}",
        "resources": agent.total.to_state(),
        "reserved_resources": agent.total.reserved_state(),
        "unreserved_resources": agent.total.unreserved().to_state(),
        "used_resources": agent.used.to_state(),
        "offered_resources": agent.offered.to_state(),
        "attributes": {
            a["name"]: a["scalar"]["value"] if a["type"] == "SCALAR" else a["text"]["value"]
            for a in agent.attributes
        },
        "active": True,
    }


def command_user(info: dict[str, Any]) -> str:
    """A TaskInfo's CommandInfo.user ('' if unset)."""
    command = info.get("command")
    user = command.get("user") if isinstance(command, dict) else None
    return user if isinstance(user, str) else ""


def _error_event(message: str) -> bytes:
    return encode_event({"type": "ERROR", "error": {"message": message}})


def _ids(raw: Any) -> list[str]:
    if not isinstance(raw, list):
        return []
    return [v for v in (_value(x) for x in raw) if v is not None]


def _refuse_seconds(filters: Any) -> float:
    value = filters.get("refuse_seconds") if isinstance(filters, dict) else None
    if not isinstance(value, int | float) or value < 0:
        return DEFAULT_REFUSE_SECONDS
    return min(float(value), 365 * 24 * 3600.0)


def _operation_task_ids(op: dict[str, Any]) -> list[str]:
    if op.get("type") == "LAUNCH":
        return task_ids_of((op.get("launch") or {}).get("task_infos") or [])
    if op.get("type") == "LAUNCH_GROUP":
        group = (op.get("launch_group") or {}).get("task_group") or {}
        return task_ids_of(group.get("tasks") or [])
    return []


def _exit_text(returncode: int | None) -> str:
    if returncode is None:
        return "Command terminated"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"Command terminated with signal {name}"
    return f"Command exited with status {returncode}"


def check_uuid(raw: Any) -> None:
    """Raise CallError 400 unless ``raw`` is a base64 16-byte UUID (ACKNOWLEDGE)."""
    try:
        ok = isinstance(raw, str) and len(base64.b64decode(raw, validate=True)) == 16
    except (binascii.Error, ValueError):
        ok = False
    if not ok:
        raise CallError(400, f"Failed to validate scheduler::Call: Invalid UUID '{raw}'")
