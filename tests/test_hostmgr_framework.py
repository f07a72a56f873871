"""The host manager through pymesos against a scripted master on loopback.

The master here is a test double (the minicluster is the full one): it speaks the v1 scheduler
HTTP API's wire format (chunked RecordIO stream with Mesos-Stream-Id, 202 for calls, /version)
and records every call, so these tests can check what the framework sends and when: the
SUBSCRIBE fields, decline + suppress when idle, revive on demand, LAUNCH_GROUP, persistence
before ACKNOWLEDGE, reconciliation on subscription, kills of unknown tasks, and reconnection
when heartbeats stop.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import queue
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from daemon import migrated_sqlite_url, wait_for
from prometheus_client import CollectorRegistry
from support import make_spec
from test_hostmgr_offers import raw_offer

from peloton.core.gang import Gang
from peloton.core.hosts import HostRecord
from peloton.core.records import AttemptRecord, JobRecord, TaskUpdate, attempt_id
from peloton.core.resources import Resources
from peloton.core.states import NOT_LAUNCHED, JobState, TaskState
from peloton.errors import FailedPrecondition, InvalidArgument
from peloton.hostmgr.framework import HostManager, MesosSettings
from peloton.hostmgr.metrics import HostmgrMetrics
from peloton.jobmgr.manager import JobManager
from peloton.placement.launcher import Launcher
from peloton.placement.metrics import PlacementMetrics
from peloton.storage.db import Database
from peloton.storage.hosts import SqlHostStore
from peloton.v1 import job_pb2

_CLOSE = object()


class ScriptedMaster:
    """A Mesos master double: the test pushes events, the framework's calls are recorded."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.subscribes: list[dict[str, Any]] = []
        self._streams: list[queue.Queue[object]] = []
        self._lock = threading.Lock()
        # Cleared: acknowledgements are recorded but not answered until it is set again.
        self.answer_acks = threading.Event()
        self.answer_acks.set()
        master = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                body = json.dumps({"version": "1.11.0"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                call = json.loads(self.rfile.read(length))
                if call["type"] == "SUBSCRIBE":
                    master._stream(self, call)
                    return
                with master._lock:
                    master.calls.append(call)
                if call["type"] == "ACKNOWLEDGE":
                    master.answer_acks.wait()
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self._thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.http.server_port}"

    def _stream(self, handler: BaseHTTPRequestHandler, call: dict[str, Any]) -> None:
        events: queue.Queue[object] = queue.Queue()
        with self._lock:
            self.subscribes.append(call)
            self._streams.append(events)
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("Mesos-Stream-Id", str(uuid.uuid4()))
        handler.end_headers()
        while True:
            event = events.get()
            if event is _CLOSE:
                handler.wfile.write(b"0\r\n\r\n")
                handler.close_connection = True
                return
            data = json.dumps(event).encode()
            record = f"{len(data)}\n".encode() + data
            handler.wfile.write(f"{len(record):x}\r\n".encode() + record + b"\r\n")
            handler.wfile.flush()

    def send(self, event: dict[str, Any]) -> None:
        """Send an event on the newest subscription stream."""
        wait_for(lambda: self._streams or None, 10, "a subscription")
        self._streams[-1].put(event)

    def close_stream(self) -> None:
        self._streams[-1].put(_CLOSE)

    def subscribed(self, framework_id: str, heartbeat: float = 15.0) -> None:
        self.send(
            {
                "type": "SUBSCRIBED",
                "subscribed": {
                    "framework_id": {"value": framework_id},
                    "heartbeat_interval_seconds": heartbeat,
                },
            }
        )

    def calls_of(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [c for c in self.calls if c["type"] == kind]

    def wait_call(self, kind: str, pred: Callable[[dict[str, Any]], bool] = lambda c: True) -> Any:
        return wait_for(
            lambda: next((c for c in self.calls_of(kind) if pred(c)), None), 10, f"a {kind} call"
        )

    def update(self, task_id: str, state: str, agent: str = "a1") -> str:
        uid = base64.b64encode(uuid.uuid4().bytes).decode()
        status = {
            "task_id": {"value": task_id},
            "state": state,
            "agent_id": {"value": agent},
            "executor_id": {"value": "ex"},
            "source": "SOURCE_EXECUTOR",
            "uuid": uid,
        }
        self.send({"type": "UPDATE", "update": {"status": status}})
        return uid

    def stop(self) -> None:
        self.answer_acks.set()
        for stream in self._streams:
            stream.put(_CLOSE)
        self.http.shutdown()
        self.http.server_close()


class ListSource:
    """An AdmittedGangs over a list (the resource manager's role in these tests)."""

    def __init__(self, gangs: Sequence[Gang] = ()) -> None:
        self.gangs = list(gangs)
        self.returned: list[tuple[Gang, str]] = []

    def take_admitted(self, limit: int) -> Sequence[Gang]:
        taken, self.gangs = self.gangs[:limit], self.gangs[limit:]
        return taken

    def return_admitted(self, returned: Sequence[tuple[Gang, str]]) -> None:
        self.returned.extend(returned)
        self.gangs.extend(gang for gang, _ in returned)


@pytest.fixture
def master() -> Iterator[ScriptedMaster]:
    m = ScriptedMaster()
    yield m
    m.stop()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database.from_url(migrated_sqlite_url(tmp_path))
    yield database
    database.dispose()


def make_hostmgr(master: ScriptedMaster, db: Database, jobs: JobManager) -> HostManager:
    settings = MesosSettings(
        master=master.address, framework_name="peloton-test", role="gpu", refuse_seconds=17
    )
    hm = HostManager(settings, jobs, SqlHostStore(db), HostmgrMetrics(CollectorRegistry()))
    jobs.set_killer(hm)
    return hm


@pytest.fixture
def jobs(db: Database) -> JobManager:
    return JobManager(db)


@pytest.fixture
def hostmgr(master: ScriptedMaster, db: Database, jobs: JobManager) -> Iterator[HostManager]:
    hm = make_hostmgr(master, db, jobs)
    hm.start()
    yield hm
    hm.stop()


def admitted_gang(
    master: ScriptedMaster, hostmgr: HostManager, jobs: JobManager, spec: job_pb2.JobSpec
) -> tuple[JobRecord, Gang]:
    """Subscribed to the scripted master, a job of ``spec`` created and admitted whole."""
    master.subscribed("fw-1")
    assert hostmgr.wait_connected(10)
    job, _ = jobs.create_job(spec)
    instances = jobs.admit_pending([(job.id, spec.instances, "test")])[0]
    return job, Gang.of_job(job.id, job.spec, instances, datetime.now(UTC))


def test_subscribe_declares_capabilities_role_and_failover_and_saves_the_id(
    master: ScriptedMaster, hostmgr: HostManager, db: Database
) -> None:
    sub = wait_for(lambda: master.subscribes or None, 10, "SUBSCRIBE")[0]
    info = sub["subscribe"]["framework_info"]
    caps = {c["type"] for c in info["capabilities"]}
    assert {"GPU_RESOURCES", "PARTITION_AWARE"} <= caps
    assert info["roles"] == ["gpu"] and info["name"] == "peloton-test"
    assert info["failover_timeout"] > 0 and info["checkpoint"] is True
    # Agents fail every executor of an empty user: the daemon's own is the default.
    assert info["user"] == pwd.getpwuid(os.getuid()).pw_name
    assert "framework_id" not in sub
    master.subscribed("fw-1")
    assert hostmgr.wait_connected(10)
    assert SqlHostStore(db).load_framework_id("peloton-test") == "fw-1"
    # Reconciliation on subscription: explicit (nothing active here) then implicit.
    master.wait_call("RECONCILE", lambda c: c["reconcile"]["tasks"] == [])


def test_offers_are_declined_never_dropped_malformed_and_shared_hostname_ones_too(
    master: ScriptedMaster, hostmgr: HostManager
) -> None:
    master.subscribed("fw-1")
    assert hostmgr.wait_connected(10)
    hostmgr.set_demand(False)
    broken = raw_offer("o3", "a3")
    del broken["agent_id"]
    offers = [raw_offer("o1", "a1", "node-a"), raw_offer("o2", "a2", "node-a"), broken]
    master.send({"type": "OFFERS", "offers": {"offers": offers}})

    def declined() -> set[str] | None:
        ids = {i["value"] for c in master.calls_of("DECLINE") for i in c["decline"]["offer_ids"]}
        return ids if ids == {"o1", "o2", "o3"} else None

    wait_for(declined, 10, "DECLINE of o1, o2 (one hostname, two agents) and malformed o3")
    assert [(v.record.hostname, v.record.agent_id) for v in hostmgr.hosts.list()] == [
        ("node-a", "a1"),
        ("node-a", "a2"),
    ]
    assert hostmgr.hosts.capacity()["total"].gpu == 8


def test_the_framework_user_is_configurable(
    master: ScriptedMaster, db: Database, jobs: JobManager
) -> None:
    settings = MesosSettings(master=master.address, user="trainer")
    hm = HostManager(settings, jobs, SqlHostStore(db), HostmgrMetrics(CollectorRegistry()))
    hm.start()
    try:
        sub = wait_for(lambda: master.subscribes or None, 10, "SUBSCRIBE")[0]
        assert sub["subscribe"]["framework_info"]["user"] == "trainer"
    finally:
        hm.stop()


def test_a_daemon_user_without_a_name_must_name_the_framework_user(
    master: ScriptedMaster, db: Database, jobs: JobManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    def nameless(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", nameless)
    store, metrics = SqlHostStore(db), HostmgrMetrics(CollectorRegistry())
    with pytest.raises(InvalidArgument) as info:
        HostManager(MesosSettings(master=master.address), jobs, store, metrics)
    assert info.value.field == "mesos_user" and f"uid {os.getuid()}" in str(info.value)
    settings = MesosSettings(master=master.address, user="trainer")
    assert HostManager(settings, jobs, store, HostmgrMetrics(CollectorRegistry())) is not None


def test_idle_offers_are_declined_with_a_filter_and_offers_suppressed_then_revived(
    master: ScriptedMaster, hostmgr: HostManager
) -> None:
    master.subscribed("fw-1")
    assert hostmgr.wait_connected(10)
    hostmgr.set_demand(False)
    master.send({"type": "OFFERS", "offers": {"offers": [raw_offer("o1")]}})
    decline = master.wait_call("DECLINE")
    assert decline["decline"]["offer_ids"] == [{"value": "o1"}]
    assert decline["decline"]["filters"]["refuse_seconds"] == 17
    master.wait_call("SUPPRESS")
    assert hostmgr.hosts.get("h1").record.total.gpu == 4
    metric = hostmgr.metrics.registry.get_sample_value
    assert metric("peloton_mesos_connected") == 1
    assert metric("peloton_offers_received_total") == 1
    assert metric("peloton_offers_declined_total") == 1
    assert metric("peloton_offers_held") == 0
    assert metric("peloton_hosts", {"state": "UP"}) == 1
    assert metric("peloton_cluster_resources", {"kind": "gpu", "state": "total"}) == 4
    assert metric("peloton_cluster_resources", {"kind": "gpu", "state": "free"}) == 4
    hostmgr.set_demand(True)
    master.wait_call("REVIVE")


def test_a_gang_is_launched_as_one_group_and_updates_are_persisted_then_acked(
    master: ScriptedMaster, hostmgr: HostManager, jobs: JobManager
) -> None:
    job, gang = admitted_gang(master, hostmgr, jobs, make_spec(3, gpu=1))
    source = ListSource([gang])
    launcher = Launcher(source, hostmgr, jobs)
    master.send({"type": "OFFERS", "offers": {"offers": [raw_offer("o1", "a1", "h1", gpus=2)]}})
    master.send({"type": "OFFERS", "offers": {"offers": [raw_offer("o2", "a2", "h2", gpus=2)]}})
    wait_for(lambda: len(hostmgr.snapshot()) == 2, 10, "two offered hosts")
    assert launcher.run_once() == 1, source.returned

    accepts = [
        master.wait_call("ACCEPT", lambda c, o=o: c["accept"]["offer_ids"][0]["value"] == o)
        for o in ("o1", "o2")
    ]
    groups = [a["accept"]["operations"][0]["launch_group"] for a in accepts]
    ids = [[t["task_id"]["value"] for t in g["task_group"]["tasks"]] for g in groups]
    assert ids == [[attempt_id(job.id, 0, 1), attempt_id(job.id, 1, 1)], [attempt_id(job.id, 2, 1)]]
    env = {
        v["name"]: v["value"]
        for v in groups[1]["task_group"]["tasks"][0]["command"]["environment"]["variables"]
    }
    assert (env["PELOTON_RANK"], env["PELOTON_GANG_SIZE"], env["PELOTON_INSTANCE_ID"]) == (
        "2",
        "3",
        "2",
    )
    # Recorded with the launch: where its sandbox is, for any later daemon.
    task, _ = jobs.get_task(job.id, 2)
    assert (task.state, task.current.host, task.current.agent_id) == (
        TaskState.LAUNCHING,
        "h2",
        "a2",
    )
    assert task.current.executor_id == groups[1]["executor"]["executor_id"]["value"]

    for i in range(3):
        uid = master.update(attempt_id(job.id, i, 1), "TASK_RUNNING")
        ack = master.wait_call("ACKNOWLEDGE", lambda c, u=uid: c["acknowledge"]["uuid"] == u)
        assert ack["acknowledge"]["task_id"] == {"value": attempt_id(job.id, i, 1)}
        # Acknowledged only once it was persisted.
        assert jobs.get_task(job.id, i)[0].state == TaskState.RUNNING
    metric = hostmgr.metrics.registry.get_sample_value
    assert metric("peloton_tasks_launched_total") == 3
    assert metric("peloton_status_updates_total", {"state": "TASK_RUNNING"}) == 3
    assert metric("peloton_cluster_resources", {"kind": "gpu", "state": "used"}) == 3
    for i in range(3):
        master.update(attempt_id(job.id, i, 1), "TASK_FINISHED")
    wait_for(lambda: jobs.get_job(job.id).state == JobState.SUCCEEDED, 10, "job SUCCEEDED")
    # Nothing of the ended attempts stays in memory (kills no longer need their agents).
    assert hostmgr._agents == {}


def test_gangs_sharing_a_host_are_launched_in_one_accept_of_its_offers(
    master: ScriptedMaster, hostmgr: HostManager, jobs: JobManager
) -> None:
    """Two gangs placed on one host in a round: one ACCEPT of its offer with a LAUNCH_GROUP
    per gang, each with its executor, the offer's GPUs handed out once between them."""
    job, first = admitted_gang(master, hostmgr, jobs, make_spec(1, gpu=1))
    other, _ = jobs.create_job(make_spec(1, gpu=1))
    instances = jobs.admit_pending([(other.id, 1, "test")])[0]
    second = Gang.of_job(other.id, other.spec, instances, datetime.now(UTC))
    master.send({"type": "OFFERS", "offers": {"offers": [raw_offer("o1", "a1", "h1", gpus=2)]}})
    wait_for(lambda: len(hostmgr.snapshot()) == 1, 10, "the offered host")
    source = ListSource([first, second])
    assert Launcher(source, hostmgr, jobs).run_once() == 2, source.returned

    accept = master.wait_call("ACCEPT")
    assert accept["accept"]["offer_ids"] == [{"value": "o1"}]
    groups = [op["launch_group"] for op in accept["accept"]["operations"]]
    assert [[t["task_id"]["value"] for t in g["task_group"]["tasks"]] for g in groups] == [
        [attempt_id(job.id, 0, 1)],
        [attempt_id(other.id, 0, 1)],
    ]
    assert len({g["executor"]["executor_id"]["value"] for g in groups}) == 2
    gpus = [
        r["scalar"]["value"]
        for g in groups
        for t in g["task_group"]["tasks"]
        for r in t["resources"]
        if r["name"] == "gpus"
    ]
    assert gpus == [1.0, 1.0]
    assert master.calls_of("ACCEPT") == [accept]
    assert hostmgr.metrics.registry.get_sample_value("peloton_tasks_launched_total") == 2


def test_a_sandbox_is_found_from_the_attempts_record_while_its_agent_serves_it(
    master: ScriptedMaster, db: Database, jobs: JobManager
) -> None:
    hm = make_hostmgr(master, db, jobs)  # never started: sandboxes need no subscription
    try:
        hm.hosts.save([observed(hm, "h1", "a1"), observed(hm, "h2", "a2")])

        def ran_on(agent_id: str, host: str = "h1", executor: str = "j-0-1-executor") -> str:
            attempt = AttemptRecord(
                "j", 0, 1, TaskState.FAILED, host, "", "", None, None, agent_id, executor
            )
            try:
                return str(hm.sandbox(attempt))
            except FailedPrecondition as exc:
                return str(exc)

        assert ran_on("a1") == str(("10.0.0.h1:5051", "", "j-0-1-executor"))
        assert "names no agent and executor" in ran_on("")
        assert "names no agent and executor" in ran_on("a1", executor="")
        assert "has not been placed" in ran_on("a1", host="")
        assert "knows no agent a9 (h3)" in ran_on("a9", "h3")
        hm.hosts.agent_lost("a2")
        assert ran_on("a2", "h2").endswith("its agent a2 (h2) is DOWN")
        # Another agent of that hostname, elsewhere, is not the lost one under a new id.
        hm.hosts.save([observed(hm, "h2", "a3", "10.0.0.9:5051")])
        assert ran_on("a2", "h2").endswith("its agent a2 (h2) is DOWN")
        # The agent restarts under a new id: its record goes, its old sandboxes are not served.
        hm.hosts.agent_lost("a1")
        hm.hosts.save([observed(hm, "h1", "a1-again")])
        gone = ran_on("a1")
        assert "agent a1 (h1) has registered again as a1-again" in gone, gone
        assert "/slaves/a1/frameworks/" in gone, gone
    finally:
        hm.stop()


def observed(hm: HostManager, hostname: str, agent_id: str, address: str = "") -> HostRecord:
    """The record of a host seen in an offer (address: 10.0.0.<hostname>:5051 by default)."""
    address = address or f"10.0.0.{hostname}:5051"
    record = hm.hosts.observe(hostname, agent_id, Resources(cpu=4), {}, address)
    assert record is not None
    return record


def test_a_task_peloton_does_not_know_is_killed_and_its_update_acked(
    master: ScriptedMaster, hostmgr: HostManager
) -> None:
    master.subscribed("fw-1")
    assert hostmgr.wait_connected(10)
    uid = master.update("not-ours", "TASK_RUNNING")
    kill = master.wait_call("KILL")
    assert kill["kill"]["task_id"] == {"value": "not-ours"}
    assert kill["kill"]["agent_id"] == {"value": "a1"}
    master.wait_call("ACKNOWLEDGE", lambda c: c["acknowledge"]["uuid"] == uid)


def test_resubscribes_with_the_same_id_after_the_stream_ends_and_when_heartbeats_stop(
    master: ScriptedMaster, hostmgr: HostManager
) -> None:
    master.subscribed("fw-1", heartbeat=0.3)
    assert hostmgr.wait_connected(10)
    master.send({"type": "HEARTBEAT"})
    master.close_stream()
    again = wait_for(lambda: master.subscribes[1:] or None, 15, "a resubscription")[0]
    assert again["framework_id"] == {"value": "fw-1"}
    master.subscribed("fw-1", heartbeat=0.3)
    wait_for(lambda: hostmgr.connected, 10, "subscribed again")
    # No heartbeat for 5 intervals (1.5 s): the framework reconnects by itself.
    third = wait_for(lambda: master.subscribes[2:] or None, 15, "a reconnect without heartbeats")[0]
    assert third["framework_id"] == {"value": "fw-1"}


def test_a_restarted_framework_reuses_the_saved_id(
    master: ScriptedMaster, db: Database, jobs: JobManager
) -> None:
    SqlHostStore(db).save_framework_id("peloton-test", "fw-old")
    hm = make_hostmgr(master, db, jobs)
    hm.start()
    try:
        sub = wait_for(lambda: master.subscribes or None, 10, "SUBSCRIBE")[0]
        assert sub["framework_id"] == {"value": "fw-old"}
        assert sub["subscribe"]["framework_info"]["id"] == {"value": "fw-old"}
    finally:
        hm.stop()


def test_a_failed_task_takes_its_gang_down_on_every_host(
    master: ScriptedMaster, hostmgr: HostManager, jobs: JobManager
) -> None:
    job, gang = admitted_gang(master, hostmgr, jobs, make_spec(2, gpu=4, max_failures=0))
    master.send({"type": "OFFERS", "offers": {"offers": [raw_offer("o1", "a1", "h1")]}})
    master.send({"type": "OFFERS", "offers": {"offers": [raw_offer("o2", "a2", "h2")]}})
    wait_for(lambda: len(hostmgr.snapshot()) == 2, 10, "two offered hosts")
    assert Launcher(ListSource([gang]), hostmgr, jobs).run_once() == 1
    first, second = attempt_id(job.id, 0, 1), attempt_id(job.id, 1, 1)
    master.update(first, "TASK_RUNNING", "a1")
    master.update(second, "TASK_RUNNING", "a2")
    master.update(first, "TASK_FAILED", "a1")
    kill = master.wait_call("KILL")
    assert kill["kill"]["task_id"] == {"value": second}
    assert kill["kill"]["agent_id"] == {"value": "a2"}
    master.update(second, "TASK_KILLED", "a2")
    # No restarts allowed: the job fails with the failure's reason; the sibling was killed.
    wait_for(lambda: jobs.get_job(job.id).state == JobState.FAILED, 10, "job FAILED")
    assert jobs.get_task(job.id, 1)[0].state == TaskState.KILLED
    assert jobs.get_job(job.id).message.startswith("instance 0 failed")


def test_updates_are_persisted_while_the_master_has_not_answered_their_acknowledgements(
    master: ScriptedMaster, hostmgr: HostManager, jobs: JobManager
) -> None:
    """A master slow to answer acknowledgements (a busy one) holds up no later update."""
    job, _ = admitted_gang(master, hostmgr, jobs, make_spec(2, gpu=1))
    for state in (TaskState.PLACING, TaskState.PLACED, TaskState.LAUNCHING):
        jobs.update_tasks(job.id, [TaskUpdate(i, 1, state, host="h1") for i in range(2)])
    master.answer_acks.clear()
    first = master.update(attempt_id(job.id, 0, 1), "TASK_RUNNING")
    master.wait_call("ACKNOWLEDGE", lambda c: c["acknowledge"]["uuid"] == first)
    master.update(attempt_id(job.id, 1, 1), "TASK_RUNNING")
    wait_for(
        lambda: jobs.get_task(job.id, 1)[0].state == TaskState.RUNNING,
        10,
        "the second update persisted while the first acknowledgement waits",
        state=lambda: jobs.list_tasks(job.id)[0],
    )
    master.answer_acks.set()


def test_reconciliation_asks_for_active_attempts_and_unknown_ones_become_lost(
    master: ScriptedMaster, db: Database, jobs: JobManager
) -> None:
    job, _ = jobs.create_job(make_spec(1, max_failures=0))
    jobs.admit_pending([(job.id, 1, "t")])
    for state in (TaskState.PLACING, TaskState.PLACED, TaskState.LAUNCHING, TaskState.RUNNING):
        jobs.update_tasks(job.id, [TaskUpdate(0, 1, state, host="h1")])
    task_id = attempt_id(job.id, 0, 1)
    hm = make_hostmgr(master, db, jobs)
    hm.start()
    try:
        master.subscribed("fw-1")
        explicit = master.wait_call("RECONCILE", lambda c: bool(c["reconcile"]["tasks"]))
        assert explicit["reconcile"]["tasks"] == [{"task_id": {"value": task_id}}]
        # What a master answers for a task it does not know (no uuid: nothing to acknowledge).
        status = {
            "task_id": {"value": task_id},
            "state": "TASK_UNKNOWN",
            "reason": "REASON_RECONCILIATION",
            "source": "SOURCE_MASTER",
        }
        master.send({"type": "UPDATE", "update": {"status": status}})
        wait_for(lambda: jobs.get_task(job.id, 0)[0].state == TaskState.LOST, 10, "task LOST")
        assert jobs.get_job(job.id).state == JobState.FAILED
    finally:
        hm.stop()


@pytest.mark.parametrize("launched_here", [False, True], ids=["by-a-predecessor", "by-this-daemon"])
def test_a_launch_that_never_reached_the_master_counts_no_failure_unless_this_daemon_sent_it(
    master: ScriptedMaster, db: Database, jobs: JobManager, launched_here: bool
) -> None:
    """An attempt recorded LAUNCHING by a daemon that stopped before its ACCEPT went out is
    unknown to the master: it starts again at once, counting no failure (max_failures 0 would
    fail the job). One this daemon launched itself, whose ACCEPT the master refused, is a
    failure: a launch refused every time must not be retried for ever."""
    job, _ = jobs.create_job(make_spec(1, max_failures=0, backoff_seconds=60))
    jobs.admit_pending([(job.id, 1, "t")])
    for state in (TaskState.PLACING, TaskState.PLACED, TaskState.LAUNCHING):
        jobs.update_tasks(job.id, [TaskUpdate(0, 1, state, host="h1")])
    task_id = attempt_id(job.id, 0, 1)
    hm = make_hostmgr(master, db, jobs)
    if launched_here:
        hm.hosts.use(task_id, "a1", Resources(cpu=1, mem_mb=256, gpu=1))
    hm.start()
    try:
        master.subscribed("fw-1")
        status = {
            "task_id": {"value": task_id},
            "state": "TASK_UNKNOWN",
            "reason": "REASON_RECONCILIATION",
            "message": "Reconciliation: Task is unknown",
            "source": "SOURCE_MASTER",
        }
        master.send({"type": "UPDATE", "update": {"status": status}})
        wait_for(
            lambda: (
                jobs.get_task(job.id, 0)[0].current.attempt == 2
                or jobs.get_job(job.id).state == JobState.FAILED
            ),
            10,
            "a new attempt or the job failed",
            state=lambda: jobs.get_job(job.id),
        )
        got, (task, _) = jobs.get_job(job.id), jobs.get_task(job.id, 0)
        if launched_here:
            assert (got.state, task.failures, task.current.reason) == (
                JobState.FAILED,
                1,
                "unknown",
            )
        else:
            assert (got.state, task.failures) == (JobState.PENDING, 0)
            (ended,) = task.history
            assert (ended.state, ended.reason) == (TaskState.LOST, NOT_LAUNCHED)
            assert ended.message.startswith("its launch never reached the Mesos master")
    finally:
        hm.stop()


def test_a_draining_host_gets_no_placements(master: ScriptedMaster, hostmgr: HostManager) -> None:
    master.subscribed("fw-1")
    assert hostmgr.wait_connected(10)
    for offer_id, agent, host in (("o1", "a1", "h1"), ("o2", "a2", "h2")):
        master.send({"type": "OFFERS", "offers": {"offers": [raw_offer(offer_id, agent, host)]}})
    wait_for(lambda: len(hostmgr.hosts.list()) == 2, 10, "two hosts known")
    hostmgr.hosts.set_draining("h1", True)
    assert [h.hostname for h in hostmgr.snapshot()] == ["h2"]
    hostmgr.hosts.set_draining("h1", False)
    assert [h.hostname for h in hostmgr.snapshot()] == ["h1", "h2"]


def test_an_unplaceable_gang_goes_back_with_a_reason_and_stays_ready(
    master: ScriptedMaster, hostmgr: HostManager, jobs: JobManager
) -> None:
    job, gang = admitted_gang(master, hostmgr, jobs, make_spec(3, gpu=4))
    # Three 4-GPU hosts are known, but two of them take back their offers: the gang fits the
    # cluster, just not now.
    for i in (1, 2, 3):
        offer = raw_offer(f"o{i}", f"a{i}", f"h{i}")
        master.send({"type": "OFFERS", "offers": {"offers": [offer]}})
    wait_for(lambda: len(hostmgr.snapshot()) == 3, 10, "three offered hosts")
    for i in (2, 3):
        master.send({"type": "RESCIND", "rescind": {"offer_id": {"value": f"o{i}"}}})
    wait_for(lambda: len(hostmgr.snapshot()) == 1, 10, "one offered host")
    source = ListSource([gang])
    assert Launcher(source, hostmgr, jobs).run_once() == 0
    ((returned, reason),) = source.returned
    assert returned is gang
    assert reason == "needs 3 hosts with 4 free A100 GPUs; 1 host has them"
    assert {t.state for t in jobs.list_tasks(job.id)[0]} == {TaskState.READY}
    assert master.calls_of("ACCEPT") == []
    assert [h.hostname for h in hostmgr.snapshot()] == ["h1"]  # no lease left behind


def test_a_gang_no_hosts_could_ever_hold_fails_with_the_reason(
    master: ScriptedMaster, hostmgr: HostManager, jobs: JobManager
) -> None:
    job, gang = admitted_gang(master, hostmgr, jobs, make_spec(3, gpu=4))
    master.send({"type": "OFFERS", "offers": {"offers": [raw_offer("o1", "a1", "h1")]}})
    wait_for(lambda: len(hostmgr.snapshot()) == 1, 10, "an offered host")
    source = ListSource([gang])
    registry = CollectorRegistry()
    launcher = Launcher(source, hostmgr, jobs, metrics=PlacementMetrics(registry))
    assert launcher.run_once() == 0
    assert source.returned == []  # not offered again: it can never be placed
    got = jobs.get_job(job.id)
    assert got.state == JobState.FAILED
    assert got.reason == "unplaceable"
    assert "no set of the cluster's hosts fits" in got.message and "GPU" in got.message
    failures = "peloton_placement_failures_total"
    assert registry.get_sample_value(failures, {"reason": "infeasible"}) == 1
    assert registry.get_sample_value("peloton_placement_rounds_total") == 1


def test_reconciliation_leaves_out_attempts_just_launched_until_the_master_tells_of_them(
    master: ScriptedMaster, hostmgr: HostManager, jobs: JobManager
) -> None:
    # Their ACCEPT goes on a connection of its own: a reconciliation on the driver's could
    # reach the master first, be answered "unknown" and have the gang marked LOST.
    job, gang = admitted_gang(master, hostmgr, jobs, make_spec(2, gpu=1))
    master.send({"type": "OFFERS", "offers": {"offers": [raw_offer("o1", "a1", "h1", gpus=2)]}})
    wait_for(lambda: len(hostmgr.snapshot()) == 1, 10, "an offered host")
    assert Launcher(ListSource([gang]), hostmgr, jobs).run_once() == 1
    launched = {attempt_id(job.id, i, 1) for i in (0, 1)}
    master.wait_call("ACCEPT")

    def reconciled() -> list[set[str]]:
        return [
            {t["task_id"]["value"] for t in c["reconcile"]["tasks"]}
            for c in master.calls_of("RECONCILE")
        ]

    before = len(reconciled())
    master.subscribed("fw-1")  # a subscription reconciles
    wait_for(lambda: len(reconciled()) > before, 10, "a reconciliation")
    assert all(not (ids & launched) for ids in reconciled()), reconciled()
    # Once the master tells of one, it is reconciled like any other.
    master.update(attempt_id(job.id, 0, 1), "TASK_RUNNING")
    wait_for(lambda: jobs.get_task(job.id, 0)[0].state == TaskState.RUNNING, 10, "task RUNNING")
    before = len(reconciled())
    master.subscribed("fw-1")
    wait_for(lambda: attempt_id(job.id, 0, 1) in set().union(*reconciled()[before:]), 10, "it")
    assert attempt_id(job.id, 1, 1) not in set().union(*reconciled())


def test_a_subscription_revives_offers_a_leader_before_may_have_filtered(
    master: ScriptedMaster, hostmgr: HostManager
) -> None:
    # Re-subscribed under its framework id, a framework keeps the decline filters an idle
    # daemon before it set; gangs waiting now need the offers at once.
    master.subscribed("fw-1")
    assert hostmgr.wait_connected(10)
    master.wait_call("REVIVE")


def test_offers_wake_placement_at_once_while_the_worker_writes_status_updates(
    master: ScriptedMaster,
    hostmgr: HostManager,
    jobs: JobManager,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While gangs wait, new offers wake placement as they arrive, not after the status
    updates queued before them on the host manager's worker are written."""
    job, _ = admitted_gang(master, hostmgr, jobs, make_spec(1, gpu=1))
    for state in (TaskState.PLACING, TaskState.PLACED, TaskState.LAUNCHING):
        jobs.update_tasks(job.id, [TaskUpdate(0, 1, state, host="h1")])
    writing, release = threading.Event(), threading.Event()
    record = jobs.record_progress

    def slow(updates: Any) -> list[str]:
        writing.set()
        assert release.wait(30), "the test never released the write"
        return record(updates)

    monkeypatch.setattr(jobs, "record_progress", slow)
    woken = threading.Event()
    hostmgr.add_offer_listener(woken.set)
    hostmgr.set_demand(True)
    master.update(attempt_id(job.id, 0, 1), "TASK_RUNNING")
    assert writing.wait(10), "the status update never reached the write"
    master.send({"type": "OFFERS", "offers": {"offers": [raw_offer("o9", "a9", "h9")]}})
    try:
        assert woken.wait(10), "placement was not woken while the worker was busy"
        assert not release.is_set()
    finally:
        release.set()
    wait_for(
        lambda: jobs.get_task(job.id, 0)[0].state == TaskState.RUNNING,
        10,
        "the update written once released",
        state=lambda: jobs.list_tasks(job.id)[0],
    )
