"""peloton as a Mesos framework: subscription, offers, launches, kills, status updates,
reconciliation and failover, through pymesos's scheduler driver.

Threads: pymesos's I/O thread calls the :class:`_Callbacks` methods; they only parse, update the
in-memory offer pool and queue work, and never raise (pymesos turns an exception in its thread
into a SIGINT of the daemon). One worker thread does everything that writes or calls Mesos:
status updates (persisted through the job manager, *then* acknowledged), declines, suppress and
revive, reconciliation, lease expiry and the heartbeat watchdog.

With ``mesos_secret_file``, every request to the master (SUBSCRIBE through pymesos, the calls
through it and through :mod:`peloton.hostmgr.calls`) carries HTTP Basic authentication. A master
that refuses the SUBSCRIBE (401 for a missing or wrong secret, 400 or 403, or an ERROR event
instead of SUBSCRIBED, e.g. for a principal other than the framework's) is told in the log and in
``peloton_mesos_subscribe_refusals_total``, and asked again after a backoff (up to a minute):
pymesos itself would raise in its I/O thread, which interrupts the daemon's main thread, or
subscribe again at once.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import os
import pwd
import queue
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
import pymesos.process
from pymesos import MesosSchedulerDriver, Scheduler

from peloton.config import ServerConfig
from peloton.core.capacity import LostHost
from peloton.core.hosts import HostRecord, HostState, HostStore
from peloton.core.ledger import HostLedger
from peloton.core.offers import HostOffers, LaunchTask, Lease, LeaseError, Offer, executor_id
from peloton.core.records import AttemptRecord, TaskUpdate, parse_attempt_id
from peloton.core.resources import EXECUTOR_RESOURCES, ZERO, Resources
from peloton.core.states import NOT_LAUNCHED, TASK_ACTIVE, TASK_PROGRESS, TASK_TERMINAL, TaskState
from peloton.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from peloton.hostmgr import states as mesos_states
from peloton.hostmgr.calls import (
    Acknowledger,
    Credential,
    Pipes,
    Stream,
    accept_body,
    read_credential,
)
from peloton.hostmgr.hosts import HostRegistry
from peloton.hostmgr.launch import OfferedResources, grace_policy, launch_group, offered_by
from peloton.hostmgr.metrics import ClusterGauges, HostmgrMetrics
from peloton.hostmgr.offers import OfferPool, parse_offer

log = logging.getLogger(__name__)

_ALL_PORTS = ((1, 65535),)
# ACCEPT filters: the rest of the offer comes back at the master's next allocation.
_NO_REFUSE = {"refuse_seconds": 0.0}
# Attempts launched less than this long ago are left out of explicit reconciliation.
LAUNCH_GRACE_SECONDS = 30.0
# A day: pymesos gives up reconnecting (and aborts the daemon) only after this long.
_CONNECT_TIMEOUT = 24 * 3600.0
# A SUBSCRIBE the master refused is sent again after 1 s, then 2, 4, ... up to a minute.
REFUSED_BACKOFF_FIRST = 1.0
REFUSED_BACKOFF_MAX = 60.0
# peloton_mesos_subscribe_refusals_total's reason, by the HTTP status of the refusal (0: an ERROR
# event instead of SUBSCRIBED).
REFUSAL_REASONS = {401: "unauthenticated", 403: "forbidden", 400: "invalid", 0: "error"}


_DEFAULTS = ServerConfig()


@dataclass(frozen=True)
class MesosSettings:
    """How peloton subscribes to Mesos and handles offers: the ServerConfig options whose Flag
    names a field here (their help says what each does; defaults are theirs)."""

    master: str
    framework_name: str = _DEFAULTS.framework_name
    role: str = _DEFAULTS.mesos_role
    principal: str = _DEFAULTS.mesos_principal
    # The file with the principal's secret ("": no framework authentication); read at start.
    secret_file: str = _DEFAULTS.mesos_secret_file
    # FrameworkInfo.user; empty: the daemon's. Mesos's own drivers fill in the current user, the
    # v1 API does not, and agents (--switch_user) fail every executor of a user that is empty.
    user: str = _DEFAULTS.mesos_user
    failover_timeout_seconds: float = _DEFAULTS.failover_timeout_seconds
    offer_hold_seconds: float = _DEFAULTS.offer_hold_seconds
    refuse_seconds: float = _DEFAULTS.offer_refuse_seconds
    lease_seconds: float = _DEFAULTS.lease_seconds
    reconcile_interval_seconds: float = _DEFAULTS.reconcile_interval_seconds
    # Heartbeats missing for this many intervals mean the connection is dead: reconnect.
    missed_heartbeats: int = 5
    host_loss_grace_seconds: float = _DEFAULTS.host_loss_grace_seconds
    runtime_image: str = _DEFAULTS.runtime_image

    @classmethod
    def from_config(cls, config: ServerConfig) -> MesosSettings:
        return cls(**config.mesos_values())


def refused_backoff(refusals: int) -> float:
    """Seconds to wait before subscribing again after ``refusals`` refusals in a row: 1, 2, 4,
    ... up to a minute."""
    doublings = min(max(refusals, 1) - 1, 16)
    return min(REFUSED_BACKOFF_MAX, REFUSED_BACKOFF_FIRST * 2.0**doublings)


def current_user() -> str:
    """The name of the user this process runs as. InvalidArgument (naming ``mesos_user``) if
    its uid has no name: agents look the framework's user up by name and drop every task of
    one they do not know."""
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        raise InvalidArgument(
            "mesos_user",
            f"the daemon runs as uid {uid}, which has no user name: set mesos_user to a user "
            "that exists on every agent",
        ) from None


@dataclass(frozen=True)
class _Planned:
    """A status update turned into the change it asks peloton to write."""

    job_id: str
    task_id: str
    update: TaskUpdate
    status: Mapping[str, Any]


@dataclass
class _HostLaunch:
    """One host's part of a launch: its lease, what is left of its offers, the LAUNCH_GROUP
    operations of its ACCEPT and how many tasks they hold."""

    lease: Lease
    offered: OfferedResources
    ops: list[dict[str, Any]] = field(default_factory=list)
    tasks: int = 0


class HostManager:
    """The framework. ``start()`` subscribes and returns; ``stop()`` leaves the tasks running
    (failover: a restarted daemon takes them over)."""

    def __init__(
        self,
        settings: MesosSettings,
        jobs: HostLedger,
        store: HostStore,
        metrics: HostmgrMetrics,
        *,
        on_capacity: Callable[[Resources, Sequence[LostHost]], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        executor_resources: Resources | None = None,
        writers: int = 1,
    ) -> None:
        """``on_capacity``: told the cluster's total and its recently lost hosts whenever
        either changes. ``writers``: jobs whose status updates are written at once (more than
        one only where the database takes concurrent writers)."""
        self.settings = settings
        self._user = settings.user or current_user()
        self._credential: Credential | None = read_credential(
            settings.principal, settings.secret_file
        )
        self._refusals = 0  # SUBSCRIBEs refused in a row: the backoff
        self._jobs = jobs
        self._store = store
        self.metrics = metrics
        self._on_capacity = on_capacity
        self._now = monotonic
        self._clock = clock
        self.pool = OfferPool(settings.lease_seconds)
        self.hosts = HostRegistry(store, clock)
        self._executor_resources = executor_resources or EXECUTOR_RESOURCES
        self._work: queue.Queue[Callable[[], None]] = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._driver: _Driver | None = None
        self._worker: threading.Thread | None = None
        self.framework_id = store.load_framework_id(settings.framework_name)
        self._connected = threading.Event()
        self._last_event = 0.0
        self._heartbeat_interval = 15.0
        self._demand = True  # a fresh subscription is not suppressed
        self._suppressed = False
        self._next_reconcile = 0.0
        self._capacity: tuple[Resources, tuple[LostHost, ...]] = (Resources(), ())
        # The agent id of each attempt that may run on Mesos, for the KILLs that name it: set at
        # launch (or by a status update after a restart), dropped when the attempt ends (where
        # ended attempts ran is read from their records).
        self._agents: dict[str, str] = {}
        # When each attempt this daemon launched was sent (monotonic), until its first status
        # update: explicit reconciliation leaves these out (see _reconcile).
        self._sent: dict[str, float] = {}
        self._sent_lock = threading.Lock()
        self._offer_listeners: list[Callable[[], None]] = []
        self._pending: list[Mapping[str, Any]] = []
        self._acks = Acknowledger()
        # Acknowledgements go out on a thread of their own: waiting for the master's answers
        # to thousands of them held up the next batch of updates (seconds under load).
        self._ack_sender = ThreadPoolExecutor(1, thread_name_prefix="hostmgr-ack")
        self._accepts = Pipes()  # the launch workers' ACCEPTs
        self._writers = ThreadPoolExecutor(writers, thread_name_prefix="hostmgr-write")
        self._drain_queued = False
        metrics.watch(ClusterGauges(self.hosts.counts, self.hosts.capacity))

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        # Read again: with several daemons, the leader before this one may have subscribed
        # since this one was built, and its framework id is the one whose tasks run on.
        self.framework_id = self._store.load_framework_id(self.settings.framework_name)
        self._worker = threading.Thread(target=self._run, name="hostmgr", daemon=True)
        self._worker.start()
        self._connect()

    def stop(self) -> None:
        """Unsubscribe without TEARDOWN: Mesos keeps the tasks for failover_timeout."""
        self._stop.set()
        self._work.put(lambda: None)
        driver = self._driver
        if driver is not None:
            driver.stop(failover=True)
            driver.join()
        if self._worker is not None:
            self._worker.join(timeout=10)
        # Acknowledgements not sent yet are dropped (Mesos sends those updates again), and one
        # being sent is cut short by closing its connection.
        self._ack_sender.shutdown(wait=False, cancel_futures=True)
        self._acks.close()
        self._accepts.close()
        self._writers.shutdown()
        self.metrics.connected.set(0)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    def _framework_info(self) -> dict[str, Any]:
        s = self.settings
        info: dict[str, Any] = {
            "user": self._user,
            "name": s.framework_name,
            "roles": [s.role],
            "failover_timeout": s.failover_timeout_seconds,
            "checkpoint": True,
            "capabilities": [
                {"type": c}
                for c in ("GPU_RESOURCES", "PARTITION_AWARE", "TASK_KILLING_STATE", "MULTI_ROLE")
            ],
        }
        if s.principal:
            info["principal"] = s.principal
        if self.framework_id:
            info["id"] = {"value": self.framework_id}
        return info

    def _connect(self) -> None:
        driver = _Driver(
            _Callbacks(self),
            self._framework_info(),
            self.settings.master,
            use_addict=False,
            implicit_acknowledgements=False,
            failover=True,
            timeout=_CONNECT_TIMEOUT,
        )
        driver.set_credential(self._credential)
        driver.owner = self
        self._driver = driver
        self._last_event = self._now()
        driver.start()

    def _reconnect(self, why: str) -> None:
        """Drop the subscription and subscribe again (same framework id), e.g. when heartbeats
        stopped: pymesos itself only notices a connection that is closed."""
        log.warning("reconnecting to Mesos", extra={"reason": why})
        self._set_disconnected()
        old = self._driver
        if old is not None:
            old.stop(failover=True)
            old.join()
        if not self._stop.is_set():
            self._connect()

    def _set_disconnected(self) -> None:
        self._connected.clear()
        self.metrics.connected.set(0)

    # ------------------------------------------------------------------ driver events

    def on_subscribed(self, framework_id: str, heartbeat: float) -> None:
        self._heartbeat_interval = heartbeat or 15.0
        self._last_event = self._now()
        self._suppressed = False
        self._refusals = 0
        if framework_id != self.framework_id:
            self._store.save_framework_id(self.settings.framework_name, framework_id)
            self.framework_id = framework_id
        self._connected.set()
        self.metrics.connected.set(1)
        log.info("subscribed to Mesos", extra={"framework_id": framework_id})
        # Offers held from before the (re)subscription are void.
        self.pool.take_unleased()
        self._work.put(self._reconcile)
        # A framework that subscribes again under its id keeps its decline filters at the
        # master: those a leader before this daemon set while idle would hold the offers back
        # (up to refuse_seconds) from gangs waiting now.
        self._work.put(self._revive)

    def on_event(self) -> None:
        self._last_event = self._now()

    def on_offers(self, raw: Sequence[Mapping[str, Any]]) -> None:
        now = self._now()
        offers: list[Offer] = []
        malformed: list[str] = []
        for r in raw:
            try:
                offers.append(parse_offer(r, now))
            except ValueError:
                log.exception("declining a malformed offer")
                # Declined, not dropped: an offer nobody answers stays outstanding at the master
                # (no --offer_timeout by default), its resources locked away for good.
                offer_id = r.get("id", {}).get("value") if isinstance(r, Mapping) else None
                if isinstance(offer_id, str):
                    malformed.append(offer_id)
        if malformed:
            self._work.put(lambda: self._decline_ids(malformed, self.settings.refuse_seconds))
        self.metrics.offers_received.inc(len(offers))
        self.pool.add(offers)
        self.metrics.offers_held.set(self.pool.held())
        if self._demand:
            # Gangs wait for these: placement looks at once, not after the batch of status
            # updates queued before them on the worker is written (up to a second of a full
            # cluster's launches, which come with each of the master's allocations).
            self._tell_offer_listeners()
        # Host records are updated on the worker, in order with the status updates that came
        # before these offers: resources a task freed are then no longer counted as used when
        # they show up in an offer (the total would be overestimated).
        self._work.put(lambda: self._observe(offers))
        self._work.put(self._after_offers)

    def _observe(self, offers: Sequence[Offer]) -> None:
        # What each agent offered in this event (the pool may have moved on by now).
        offered: dict[str, Resources] = {}
        last: dict[str, Offer] = {}
        for o in offers:
            offered[o.agent_id] = offered.get(o.agent_id, Resources()) + o.resources
            last[o.agent_id] = o
        changed = [
            record
            for agent_id, o in last.items()
            if (
                record := self.hosts.observe(
                    o.hostname, agent_id, offered[agent_id], o.attributes, o.agent_address
                )
            )
            is not None
        ]
        self.hosts.save(changed)

    def on_rescind(self, offer_id: str) -> None:
        self.pool.rescind(offer_id)
        self.metrics.offers_held.set(self.pool.held())

    def on_update(self, status: Mapping[str, Any]) -> None:
        # Updates are handled in batches: a burst (a gang starting, a reconciliation) becomes
        # one transaction per job instead of one per update.
        with self._sent_lock:  # the master knows it
            self._sent.pop(status.get("task_id", {}).get("value", ""), None)
        with self._lock:
            self._pending.append(status)
            queued, self._drain_queued = self._drain_queued, True
        if not queued:
            self._work.put(self._handle_updates)

    def on_agent_lost(self, agent_id: str) -> None:
        self.pool.remove_agent(agent_id)
        host = self.hosts.agent_lost(agent_id)
        if host is not None:
            log.warning(
                "agent lost; its host still counts toward the capacity gangs are judged on",
                extra={
                    "host": host.hostname,
                    "agent_id": agent_id,
                    "counted_for_seconds": self.settings.host_loss_grace_seconds,
                },
            )
        self._work.put(self._check_capacity)

    def on_error(self, message: str) -> None:
        # The master refuses us (e.g. the framework was removed after failover_timeout): the
        # old id is dead, so subscribe as a new framework; reconciliation ends the lost tasks.
        log.error("Mesos error", extra={"error": message})
        if "removed" in message.lower():
            self.framework_id = ""
            self._store.save_framework_id(self.settings.framework_name, "")
        self._work.put(lambda: self._reconnect(f"master error: {message}"))

    def on_disconnected(self) -> None:
        if self.connected:  # not every failed try to subscribe again
            log.warning("disconnected from Mesos; pymesos reconnects with backoff")
        self._set_disconnected()

    def on_refused(self, status: int, body: str) -> float:
        """The master answered SUBSCRIBE with HTTP ``status`` (not 200, 307 or 503), or with an
        ERROR event ``body`` (``status`` 0): say why, count it, and return how long to wait
        before subscribing again."""
        self._refusals += 1
        delay = refused_backoff(self._refusals)
        reason = REFUSAL_REASONS.get(status, "other")
        self.metrics.subscribe_refusals.labels(reason=reason).inc()
        log.error(
            self._refusal_message(status, body),
            extra={
                "status": status,
                "reason": reason,
                "principal": self.settings.principal,
                "refused_in_a_row": self._refusals,
                "retry_in_seconds": delay,
            },
        )
        return delay

    def _refusal_message(self, status: int, body: str) -> str:
        principal = self.settings.principal
        subscription = (
            f"Mesos master refused the subscription of framework {self.settings.framework_name!r}"
        )
        if status == 0:
            if "principal" in body:
                body += (
                    " (a framework keeps the principal it registered with, none included: give "
                    "peloton its former mesos_principal, or a new framework_name once its tasks "
                    "have ended)"
                )
            return f"{subscription}: {body}"
        answer = f"HTTP {status}" + (f" {body.strip()!r}" if body.strip() else "")
        if status not in (401, 403):
            return f"{subscription}: {answer}"
        prefix = f"Mesos master refused framework authentication for principal {principal!r}"
        if status == 403:
            return f"{prefix}: {answer}"
        if not principal:
            why = "the master authenticates frameworks: set mesos_principal and mesos_secret_file"
        elif self._credential is None:
            why = "the master authenticates frameworks and mesos_secret_file is not set"
        else:
            why = (
                "wrong principal or secret: mesos_secret_file must hold the secret the master's "
                "--credentials gives this principal"
            )
        return f"{prefix}: {answer}: {why}"

    # ------------------------------------------------------------------ worker

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                job = self._work.get(timeout=1.0)
            except queue.Empty:
                job = None
            try:
                if job is not None:
                    job()
                self._tick()
            except Exception:
                log.exception("host manager step failed")

    def _tick(self) -> None:
        now = self._now()
        for lease in self.pool.expire(now):
            log.info("lease expired", extra={"host": lease.hostname})
        if not self.connected:
            return
        if now - self._last_event > self.settings.missed_heartbeats * self._heartbeat_interval:
            self._reconnect(f"no heartbeat for {now - self._last_event:.0f}s")
            return
        stale = self.pool.take_unleased(self.settings.offer_hold_seconds, now)
        if stale:
            self._decline(stale, refuse=1.0)
        if now >= self._next_reconcile:
            self._reconcile()
        self._check_capacity()

    def _after_offers(self) -> None:
        if not self._demand:
            offers = self.pool.take_unleased()
            if offers:
                self._decline(offers, refuse=self.settings.refuse_seconds)
            if not self._capacity[1]:
                self._suppress()
        self._check_capacity()
        self._tell_offer_listeners()

    def _tell_offer_listeners(self) -> None:
        for listener in list(self._offer_listeners):
            listener()

    def _decline(self, offers: Sequence[Offer], refuse: float) -> None:
        self.metrics.offers_held.set(self.pool.held())
        self._decline_ids([o.offer_id for o in offers], refuse)

    def _decline_ids(self, offer_ids: Sequence[str], refuse: float) -> None:
        self._call(
            lambda d: d.declineOffer([{"value": i} for i in offer_ids], {"refuse_seconds": refuse})
        )
        self.metrics.offers_declined.inc(len(offer_ids))

    def _suppress(self) -> None:
        if not self._suppressed and self._call(lambda d: d.suppressOffers()):
            self._suppressed = True
            log.info("offers suppressed: nothing waits for placement")

    def _call(self, fn: Callable[[MesosSchedulerDriver], None]) -> bool:
        driver = self._driver
        if driver is None or not self.connected:
            return False
        try:
            fn(driver)
            return True
        except Exception as exc:  # the master went away mid-call; the stream notices too
            log.warning("Mesos call failed", extra={"error": str(exc)})
            return False

    def _check_capacity(self) -> None:
        capacity = (
            self.hosts.total(),
            self.hosts.recently_lost(self.settings.host_loss_grace_seconds),
        )
        if capacity != self._capacity:
            self._log_no_longer_counted(self._capacity[1], capacity[1])
            self._capacity = capacity
            if self._on_capacity is not None:
                self._on_capacity(*capacity)
            if capacity[1] and self._suppressed:
                # An agent that comes back shows itself only in offers: none while suppressed.
                self._revive()

    def _log_no_longer_counted(self, before: Sequence[LostHost], now: Sequence[LostHost]) -> None:
        """Say which lost hosts stopped counting toward the capacity: back, or out of grace
        (gangs that need them fail from now on)."""
        still = {h.hostname for h in now}
        for h in before:
            if h.hostname in still:
                continue
            if self._clock() < h.counted_until:
                log.info("lost host is back", extra={"host": h.hostname})
            else:
                log.warning(
                    "lost host's grace ended: it no longer counts toward capacity",
                    extra={"host": h.hostname, "lost_at": h.lost_at.isoformat()},
                )

    # ------------------------------------------------------------------ demand (placement)

    def add_offer_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever new offers arrived: on the thread that reads the
        master's events while placement has demand (at once), and on the worker after the
        offers are accounted for. It must be quick and safe from any thread (a wake-up)."""
        self._offer_listeners.append(listener)

    def set_demand(self, demand: bool) -> None:
        """Placement has gangs waiting (REVIVE when it starts) or none (SUPPRESS, decline)."""
        with self._lock:
            changed, self._demand = demand != self._demand, demand
        if changed and demand:
            self._work.put(self._revive)
        elif changed:
            self._work.put(self._after_offers)

    def _revive(self) -> None:
        """Ask for offers while gangs wait for placement or lost hosts are counted (their
        agents' return is seen in offers)."""
        if (self._demand or self._capacity[1]) and self._call(lambda d: d.reviveOffers()):
            self._suppressed = False
            log.info("offers revived: gangs wait for placement, or a lost host may come back")

    def snapshot(self) -> list[HostOffers]:
        """Unleased offered hosts that may take placements (draining and down ones left out)."""
        return self.pool.snapshot(exclude=self.hosts.draining())

    def totals(self) -> list[HostOffers]:
        """Hosts that take placements (up, not draining) with their total resources, for
        telling a gang that never fits from one that waits, and the hosts lost recently (they
        may come back). Totals carry no port ranges: every port is assumed, so a gang is never
        judged infeasible for ports."""
        lost = {(h.hostname, h.lost_at) for h in self._capacity[1]}
        return [
            HostOffers(
                v.record.hostname,
                v.record.agent_id,
                v.record.total,
                _ALL_PORTS,
                v.record.attributes,
            )
            for v in self.hosts.list()
            if v.record.state == HostState.UP
            or (
                v.record.state == HostState.DOWN
                and (v.record.hostname, v.record.updated_at) in lost
            )
        ]

    def free_hosts(self, ended: Collection[str] = ()) -> list[HostOffers]:
        """Hosts that take placements now (up, not draining) with what peloton's tasks leave
        free on them, offered or not: placement-aware admission asks these whether a gang
        fits (offers come and go; what runs where does not). Every port is assumed free.
        ``ended``: jobs whose tasks count as ended (where a reserved gang will start)."""
        back = self.hosts.held(ended) if ended else {}
        return [
            HostOffers(
                v.record.hostname,
                v.record.agent_id,
                v.free + back.get(v.record.agent_id, ZERO),
                _ALL_PORTS,
                v.record.attributes,
            )
            for v in self.hosts.list()
            if v.record.state == HostState.UP
        ]

    def lease(self, agent_id: str) -> Lease | None:
        return self.pool.lease(agent_id, self._now())

    def release(self, lease: Lease) -> None:
        self.pool.release(lease)

    # ------------------------------------------------------------------ launch and kill

    def launch(self, shares: Sequence[tuple[Lease, Sequence[LaunchTask]]]) -> None:
        """Launch each share (a host's tasks of one gang) as one task group, one ACCEPT per
        host: shares on the same lease (gangs placed on one host in one round) go to the
        master as one ACCEPT with a LAUNCH_GROUP each, as its offers can be accepted once.

        All leases are consumed first, all or none (LeaseError if one expired or lost an
        offer); Unavailable if not subscribed. A host whose ACCEPT fails loses its tasks: the
        master never saw them, so reconciliation reports them LOST.
        """
        stream = self._stream()
        if stream is None or not self.framework_id:
            raise Unavailable("not subscribed to a Mesos master")
        hosts: dict[str, _HostLaunch] = {}
        for lease, tasks in shares:
            host = hosts.get(lease.lease_id)
            if host is None:
                host = hosts[lease.lease_id] = _HostLaunch(lease, offered_by(lease))
            try:
                host.ops.append(
                    launch_group(
                        lease,
                        self.framework_id,
                        executor_id(tasks),
                        self._executor_resources,
                        tasks,
                        self.settings.runtime_image,
                        host.offered,
                    )
                )
            except ValueError as exc:
                raise LeaseError(f"{lease.hostname} ({lease.agent_id}): {exc}") from exc
            host.tasks += len(tasks)
        self.pool.take_for_launch([h.lease for h in hosts.values()], self._now())
        self.metrics.offers_held.set(self.pool.held())
        sent = time.monotonic()
        with self._sent_lock:
            self._sent.update((t.task_id, sent) for _, tasks in shares for t in tasks)
        for lease, tasks in shares:
            for t in tasks:
                self._agents[t.task_id] = lease.agent_id
                self.hosts.use(t.task_id, lease.agent_id, t.resources)
        # One ACCEPT per host, pipelined. What the launches leave of a host is what the next
        # gangs need: have it offered again at the next allocation, not after the default 5 s
        # refuse filter.
        calls = [
            accept_body(self.framework_id, h.lease.offer_ids, h.ops, _NO_REFUSE)
            for h in hosts.values()
        ]
        try:
            answers = self._accepts.exchange(stream, calls)
        except (OSError, ValueError) as exc:
            log.warning("ACCEPT failed", extra={"error": str(exc), "hosts": len(calls)})
            answers = []
        for i, h in enumerate(hosts.values()):
            status, body = answers[i] if i < len(answers) else (0, b"")
            if 200 <= status < 300:
                self.metrics.tasks_launched.inc(h.tasks)
            elif status:
                log.warning(
                    "ACCEPT refused",
                    extra={
                        "host": h.lease.hostname,
                        "status": status,
                        "body": body[:200].decode(errors="replace"),
                    },
                )

    def kill(self, attempt_ids: Sequence[str], grace_seconds: int) -> None:
        """TaskKiller: KILL each attempt with a grace period (SIGTERM, then SIGKILL)."""
        for attempt in attempt_ids:
            self._work.put(lambda a=attempt: self._kill(a, grace_seconds))  # type: ignore[misc]

    def _kill(self, task_id: str, grace_seconds: int, agent_id: str = "") -> None:
        body: dict[str, Any] = {"task_id": {"value": task_id}}
        agent = agent_id or self._agents.get(task_id, "")
        if agent:
            body["agent_id"] = {"value": agent}
        body["kill_policy"] = grace_policy(grace_seconds)
        self._call(
            lambda d: d._send(
                {"type": "KILL", "framework_id": {"value": self.framework_id}, "kill": body}
            )
        )
        log.info("kill sent", extra={"task_id": task_id, "grace_seconds": grace_seconds})

    def sandbox(self, attempt: AttemptRecord) -> tuple[str, str, str]:
        """(agent address, framework id, executor id) of an attempt's sandbox, from where its
        record says it was launched: ended attempts included, whichever daemon launched them.

        FailedPrecondition if the sandbox is unknown or its agent is gone: DOWN (Mesos lost
        it, and its sandboxes with it), or registered again under a new agent id (a restarted
        agent serves no sandbox of its former id)."""
        if not attempt.host:
            raise FailedPrecondition(f"task {attempt.id} has not been placed on a host")
        if not (attempt.agent_id and attempt.executor_id):
            raise FailedPrecondition(
                f"the sandbox of {attempt.id} on {attempt.host} is unknown: its record names no "
                "agent and executor (it ran before peloton recorded them, schema revision 0007)"
            )
        return self._agent_address(attempt), self.framework_id, attempt.executor_id

    def _agent_address(self, attempt: AttemptRecord) -> str:
        """The address of the agent an attempt ran on, if that agent still serves it."""
        try:
            host: HostRecord | None = self.hosts.get(attempt.agent_id).record
        except NotFound:
            host = None  # a new agent of its host and address superseded its record
        if host is not None and host.state != HostState.DOWN:
            return host.address
        where = f"{attempt.agent_id} ({attempt.host})"
        # The same agent under a new id: its hostname, and its address where that is known.
        successors = [
            v.record.agent_id
            for v in self.hosts.list()
            if v.record.hostname == attempt.host
            and v.record.state != HostState.DOWN
            and (host is None or v.record.address == host.address)
        ]
        if successors:
            raise FailedPrecondition(
                f"the sandbox of {attempt.id} is not served: its agent {where} has registered "
                f"again as {', '.join(successors)}, and Mesos serves no sandbox of a former "
                f"agent id (on the host it is under <agent work_dir>/slaves/{attempt.agent_id}/"
                f"frameworks/{self.framework_id}/executors/{attempt.executor_id}/runs/latest)"
            )
        if host is None:
            raise FailedPrecondition(
                f"the sandbox of {attempt.id} is unknown: peloton knows no agent {where}"
            )
        raise FailedPrecondition(f"the sandbox of {attempt.id} is gone: its agent {where} is DOWN")

    # ------------------------------------------------------------------ status updates

    def _handle_updates(self) -> None:
        """Persist every queued status update, then acknowledge each. Updates of one job go in
        one transaction; an update that is stale, illegal or not ours is acknowledged without
        a write; one whose write failed is not acknowledged (Mesos sends it again)."""
        with self._lock:
            batch, self._pending = self._pending, []
            self._drain_queued = False
        seen: set[str] = set()
        ack: list[Mapping[str, Any]] = []
        by_job: dict[str, list[_Planned]] = {}
        # What peloton has now of every task the batch is about, read once for the batch.
        current = self._store.current_attempts(
            (ids[0], ids[1])
            for status in batch
            if (ids := parse_attempt_id(status["task_id"]["value"])) is not None
        )
        by_state: Counter[str] = Counter()
        for status in batch:
            uid = status.get("uuid")
            if uid is not None and uid in seen:
                continue  # a re-send of an update already in this batch
            if uid is not None:
                seen.add(uid)
            by_state[status.get("state", "")] += 1
            try:
                planned = self._plan(status, current)
            except Exception:
                log.exception("status update not handled", extra={"status": dict(status)})
                continue
            if planned is None:
                ack.append(status)
            else:
                by_job.setdefault(planned.job_id, []).append(planned)
        for state, n in by_state.items():  # a labels() lookup per update cost 20 us
            self.metrics.status_updates.labels(state=state).inc(n)
        ack.extend(self._record_progress(by_job))
        # The rest are written job by job (one transaction each), on the writers at once.
        for written in self._writers.map(lambda job: self._apply(*job), by_job.items()):
            ack.extend(p.status for p in written)
        self._acknowledge(ack)

    def _record_progress(self, by_job: dict[str, list[_Planned]]) -> list[Mapping[str, Any]]:
        """Write, in one transaction, the jobs of ``by_job`` whose updates only move tasks on
        toward running (most of them, as gangs start), and take them out of it; returns their
        statuses, to acknowledge. Jobs the job manager leaves out stay, for :meth:`_apply`."""
        progress = {
            job_id: [p.update for p in items]
            for job_id, items in by_job.items()
            if all(p.update.state in TASK_PROGRESS for p in items)
        }
        if not progress:
            return []
        try:
            left = set(self._jobs.record_progress(progress))
        except Exception:
            log.exception("persisting status updates failed", extra={"jobs": len(progress)})
            return []  # written one job at a time next
        return [p.status for job_id in progress if job_id not in left for p in by_job.pop(job_id)]

    def _acknowledge(self, statuses: Sequence[Mapping[str, Any]]) -> None:
        stream = self._stream()
        if stream is not None and statuses:
            self._ack_sender.submit(self._acks.send, stream, self.framework_id, statuses)

    def _stream(self) -> Stream | None:
        """Where calls of the current subscription go (None: not subscribed)."""
        driver = self._driver
        if driver is None or not self.connected:
            return None
        master, stream_id = driver.master, driver.stream_id
        if not master or not stream_id:
            return None
        credential = self._credential
        return Stream(master, stream_id, credential.headers() if credential else None)

    def _apply(self, job_id: str, items: list[_Planned]) -> list[_Planned]:
        """Write one job's updates; returns those that may be acknowledged (written, or found
        not to apply)."""
        # The job manager takes the rest of a failed gang down (on every host) as it writes.
        written, skipped = self._write(job_id, items)
        for p in written:
            if p.update.state in TASK_TERMINAL:
                self.hosts.unuse(p.task_id)
        return written + skipped

    def _write(self, job_id: str, items: list[_Planned]) -> tuple[list[_Planned], list[_Planned]]:
        """(written, not applicable): all in one transaction if they all apply (the job manager
        applies a task's updates in order: a TASK_STARTING and TASK_RUNNING of one task in a
        batch are two changes), else one by one."""
        if len(items) > 1:
            try:
                self._jobs.update_tasks(job_id, [p.update for p in items])
                return items, []
            except (FailedPrecondition, NotFound):
                pass  # one of them does not apply: find it below
            except Exception:
                log.exception("persisting status updates failed", extra={"job_id": job_id})
                return [], []
        written: list[_Planned] = []
        skipped: list[_Planned] = []
        for p in items:
            try:
                self._jobs.update_tasks(job_id, [p.update])
                written.append(p)
            except (FailedPrecondition, NotFound) as exc:
                log.info(
                    "status update not applied", extra={"task_id": p.task_id, "error": str(exc)}
                )
                skipped.append(p)
            except Exception:
                log.exception("persisting a status update failed", extra={"task_id": p.task_id})
        return written, skipped

    def _plan(
        self,
        status: Mapping[str, Any],
        attempts: Mapping[tuple[str, int], tuple[int, TaskState, str]],
    ) -> _Planned | None:
        """The peloton change a status update asks for; None if nothing is to be written (it is
        stale, not ours, or no change), after killing what must not run. ``attempts``: the
        current attempts, as the store's ``current_attempts`` gives them."""
        task_id = status["task_id"]["value"]
        state = status.get("state", "")
        agent_id = status.get("agent_id", {}).get("value", "")
        ids = parse_attempt_id(task_id)
        mesos_active = state in mesos_states.MESOS_ACTIVE and state != "TASK_UNREACHABLE"
        current = None if ids is None else attempts.get((ids[0], ids[1]))
        if ids is None or current is None or ids[2] != current[0] or current[1] in TASK_TERMINAL:
            # Not ours, or peloton has moved on (a newer attempt, or this one ended, or the job
            # was deleted): the task must not run.
            if mesos_active:
                log.warning("killing a task peloton does not run", extra={"task_id": task_id})
                self._kill(task_id, 0, agent_id)
            else:
                # Ended on Mesos after peloton had ended or replaced the attempt: no kill to come.
                self._agents.pop(task_id, None)
            return None
        job_id, instance, attempt = ids
        _, current_state, current_host = current
        target = mesos_states.to_peloton(state, current_state)
        executor = status.get("executor_id", {}).get("value", "")
        agent = agent_id or self._agents.get(task_id, "")
        ending = target is not None and target in TASK_TERMINAL
        if ending:
            # An ended attempt is killed no more (where it ran is read from its record now).
            self._agents.pop(task_id, None)
        elif agent:
            self._agents[task_id] = agent
        if not ending and agent and self.hosts.host_of(task_id) == "":
            # A daemon that restarted learns what its running tasks hold from their updates.
            spec = self._jobs.get_job(job_id).spec
            self.hosts.use(task_id, agent, Resources.from_proto(spec.task.resources))
        if target is None:
            return None
        reason, message = mesos_states.reason_of(
            state, status.get("reason", ""), status.get("message", "")
        )
        if mesos_states.never_reached_mesos(state, status.get("reason", ""), current_state) and (
            self.hosts.host_of(task_id) == ""
        ):
            # Recorded by a daemon that led before this one and stopped before its ACCEPT went
            # out (this daemon counts what it launched itself). One of this daemon's own, whose
            # ACCEPT the master refused, stays a failure: a launch refused every time must not
            # be retried for ever.
            reason = NOT_LAUNCHED
            message = f"its launch never reached the Mesos master ({message})"
        # The agent and executor as Mesos reports them: they fill in the record of an attempt
        # launched before peloton recorded them at launch.
        update = TaskUpdate(
            instance, attempt, target, reason, message, current_host, agent, executor
        )
        return _Planned(job_id, task_id, update, status)

    # ------------------------------------------------------------------ reconciliation

    def _reconcile(self) -> None:
        """Explicit reconciliation of every attempt peloton believes active, then implicit
        (Mesos then reports every task it knows; ones peloton doesn't run are killed)."""
        self._next_reconcile = self._now() + self.settings.reconcile_interval_seconds
        # Not the attempts launched a moment ago: their ACCEPT goes on a connection of its own
        # and may reach the master after this call (or be still in its authorization), which
        # would answer "unknown" and have a gang just launched marked LOST and restarted. One
        # whose ACCEPT was lost is reconciled next time (or told LOST by the master).
        recent = time.monotonic() - LAUNCH_GRACE_SECONDS
        with self._sent_lock:
            self._sent = {t: at for t, at in self._sent.items() if at > recent}
            sent = set(self._sent)
        active = [t for t in self.active_attempts() if t not in sent]
        for i in range(0, len(active), 1000):
            batch = [{"task_id": {"value": t}} for t in active[i : i + 1000]]
            self._call(lambda d, b=batch: d.reconcileTasks(b))  # type: ignore[misc]
        self._call(lambda d: d.reconcileTasks([]))
        log.info("reconciliation requested", extra={"explicit": len(active)})

    def active_attempts(self) -> list[str]:
        """Mesos task ids of every attempt peloton believes may run on a host."""
        return self._store.active_attempts(TASK_ACTIVE)

    def host_state(self, name: str) -> HostState:
        """The state of the host an agent id or hostname names."""
        return self.hosts.get(name).record.state


class _Driver(MesosSchedulerDriver):  # type: ignore[misc]
    """pymesos's driver, telling the owner the heartbeat interval and that events arrive, and
    waiting (see :class:`_Connection`) before it subscribes again after a refusal."""

    owner: HostManager

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stopping = threading.Event()

    def set_credential(self, credential: Credential | None) -> None:
        """Authenticate every request with ``credential``: pymesos sends ``_basic_credential``
        as the Authorization header of its SUBSCRIBE and calls (set here rather than from its
        ``principal`` and ``secret`` arguments, which it encodes as ASCII only)."""
        self._basic_credential = credential.authorization if credential is not None else None

    def stop(self, failover: bool = False) -> None:
        self._stopping.set()  # cuts a backoff short
        super().stop(failover)

    def refused(self, status: int, body: str) -> None:
        """SUBSCRIBE was answered ``status``: tell the owner, then wait its backoff (on
        pymesos's I/O thread, which subscribes again once this returns) unless stopped."""
        try:
            delay = self.owner.on_refused(status, body)
        except Exception:
            log.exception("handling a refused subscription failed")
            delay = REFUSED_BACKOFF_MAX
        self._stopping.wait(delay)

    def on_subscribed(self, info: dict[str, Any]) -> None:
        super().on_subscribed(info)
        try:
            self.owner.on_subscribed(
                info["framework_id"]["value"], float(info.get("heartbeat_interval_seconds", 15))
            )
        except Exception:
            log.exception("handling SUBSCRIBED failed")

    def on_event(self, event: dict[str, Any]) -> None:
        self.owner.on_event()
        super().on_event(event)

    def on_error(self, event: dict[str, Any]) -> None:
        message = str(event.get("message", ""))
        if self.owner.connected or "removed" in message.lower():
            super().on_error(event)  # the owner subscribes again (as a new framework if removed)
            return
        # No SUBSCRIBED came first: the master refused this subscription in an event (a changed
        # principal, its authorizer). It closes the stream, and pymesos would subscribe again
        # at once, to the same answer: wait a backoff first.
        self.refused(0, message)


class _Connection(pymesos.process.Connection):  # type: ignore[misc]
    """pymesos's connection to the master, which turns a refused SUBSCRIBE of a :class:`_Driver`
    into :meth:`_Driver.refused` and a new try after it. pymesos raises on any answer but 200,
    307 and 503 in its I/O thread, which ends the thread and interrupts the main thread with that
    exception: the daemon would die of a wrong secret, and, restarted, spin against the master."""

    def read(self) -> bool:
        try:
            return bool(super().read())
        except Exception as exc:
            driver, parser = self._callback, self._parser
            if not isinstance(driver, _Driver) or self._stream_id is not None or parser is None:
                raise
            if not parser.is_headers_complete() or parser.get_status_code() == 200:
                raise  # not a refusal (a malformed answer): as pymesos does
            status = int(parser.get_status_code())
            body = _refused_body(exc) or _rest_of_body(self._sock, parser)
        # The master holds no connection open while this one waits out its backoff.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        driver.refused(status, body)
        return False  # pymesos closes this connection and subscribes again


def _rest_of_body(sock: socket.socket, parser: Any) -> str:
    """The refusal's body when pymesos raised on its headers before the body had arrived (a
    loaded machine reads them apart): read on for up to a second, as the master sends the body
    right behind them ("" if it does not come)."""
    deadline = time.monotonic() + 1.0
    with contextlib.suppress(OSError):
        while not parser.is_message_complete():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            data = sock.recv(65536)
            if not data:
                break
            parser.execute(data, len(data))
    if not parser.is_message_complete():
        return ""
    return bytes(parser.recv_body()).decode(errors="replace")[:500]


def _refused_body(exc: Exception) -> str:
    """The master's answer in pymesos's ``Failed with HTTP <status>: <body bytes>`` ("" if the
    body had not all arrived: pymesos then fails with a TypeError of its own)."""
    _, sep, text = str(exc).partition(": ")
    if not sep or not text.startswith(("b'", 'b"')):
        return ""
    try:
        body = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return ""
    return body.decode(errors="replace")[:500] if isinstance(body, bytes) else ""


# pymesos makes its connections by this module-level name; only a _Driver's refusals are handled
# differently (any other driver's connection re-raises as pymesos does).
pymesos.process.Connection = _Connection


class _EventJson:
    """What pymesos's connection parses the master's events with, in place of the json module
    (its only use there): orjson, as the ACCEPTs are encoded (the json module parsing the
    stream's offers and status updates took ~8 % of a busy daemon's interpreter)."""

    loads = staticmethod(orjson.loads)


pymesos.process.json = _EventJson


class _Callbacks(Scheduler):  # type: ignore[misc]
    """pymesos callbacks; each catches everything (an escape would SIGINT the daemon)."""

    def __init__(self, owner: HostManager) -> None:
        self._owner = owner

    def _safe(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            log.exception("Mesos event handling failed")

    def resourceOffers(self, driver: object, offers: list[dict[str, Any]]) -> None:
        self._safe(lambda: self._owner.on_offers(offers))

    def offerRescinded(self, driver: object, offer_id: dict[str, Any]) -> None:
        self._safe(lambda: self._owner.on_rescind(offer_id["value"]))

    def statusUpdate(self, driver: object, status: dict[str, Any]) -> None:
        self._safe(lambda: self._owner.on_update(status))

    def slaveLost(self, driver: object, agent_id: dict[str, Any]) -> None:
        self._safe(lambda: self._owner.on_agent_lost(agent_id["value"]))

    def executorLost(
        self,
        driver: object,
        executor_id: dict[str, Any],
        agent_id: dict[str, Any],
        status: int,
    ) -> None:
        self._safe(
            lambda: log.info(
                "executor lost",
                extra={
                    "executor_id": executor_id["value"],
                    "agent_id": agent_id["value"],
                    "status": status,
                },
            )
        )

    def error(self, driver: object, message: str) -> None:
        self._safe(lambda: self._owner.on_error(message))

    def disconnected(self, driver: object) -> None:
        self._safe(self._owner.on_disconnected)
