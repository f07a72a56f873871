"""Hosts and the framework id in the database; the host registry's view built on them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from support import make_spec

from peloton.core.hosts import HostState
from peloton.core.records import TaskUpdate, attempt_id
from peloton.core.resources import Resources
from peloton.core.states import TASK_ACTIVE, TaskState
from peloton.errors import FailedPrecondition, NotFound
from peloton.hostmgr.hosts import HostRegistry
from peloton.jobmgr.manager import JobManager
from peloton.storage.db import Database
from peloton.storage.hosts import SqlHostStore

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
HOST = Resources(cpu=8, mem_mb=32768, disk_mb=100000, gpu=4)


def test_framework_id_is_saved_and_replaced(db: Database) -> None:
    store = SqlHostStore(db, lambda: NOW)
    assert store.load_framework_id("peloton") == ""
    store.save_framework_id("peloton", "fw-1")
    store.save_framework_id("peloton", "fw-2")
    assert SqlHostStore(db).load_framework_id("peloton") == "fw-2"


def test_hosts_survive_a_restart_with_totals_and_drain_state(db: Database) -> None:
    registry = HostRegistry(SqlHostStore(db), lambda: NOW)
    record = registry.observe("h1", "a1", HOST, {"rack": "r1"}, "127.0.0.1:5051")
    assert record is not None
    registry.save([record])
    assert registry.observe("h1", "a1", HOST.scale(0.5), {"rack": "r1"}, "127.0.0.1:5051") is None
    registry.use("job-0-0", "a1", Resources(cpu=2, gpu=1))
    assert registry.get("h1").free == Resources(cpu=6, mem_mb=32768, disk_mb=100000, gpu=3)
    registry.set_draining("h1", True)
    assert registry.draining() == {"a1"}

    again = HostRegistry(SqlHostStore(db), lambda: NOW)
    record = again.get("h1").record
    assert (record.total, record.state, record.attributes) == (
        HOST,
        HostState.DRAINING,
        {"rack": "r1"},
    )
    again.set_draining("h1", False)
    assert again.draining() == set()


def test_a_lost_agent_goes_down_and_leaves_the_capacity(db: Database) -> None:
    registry = HostRegistry(SqlHostStore(db), lambda: NOW)
    for name in ("h1", "h2"):
        record = registry.observe(name, f"a{name[1]}", HOST, {}, f"{name}:5051")
        assert record is not None
        registry.save([record])
    assert registry.capacity()["total"] == HOST.scale(2)
    assert registry.agent_lost("a2") is not None
    assert registry.capacity()["total"] == HOST
    assert registry.counts() == {"UP": 1, "DOWN": 1}
    with pytest.raises(FailedPrecondition, match="DOWN"):
        registry.set_draining("h2", True)
    with pytest.raises(NotFound, match="nope"):
        registry.get("nope")
    # The agent re-registers under a new id at the same address: it supersedes the DOWN record.
    record = registry.observe("h2", "a2b", HOST, {}, "h2:5051")
    assert record is not None
    registry.save([record])
    assert registry.counts() == {"UP": 2}
    assert [v.record.agent_id for v in HostRegistry(SqlHostStore(db), lambda: NOW).list()] == [
        "a1",
        "a2b",
    ]


def test_agents_that_share_a_hostname_are_distinct_hosts(db: Database) -> None:
    registry = HostRegistry(SqlHostStore(db), lambda: NOW)
    records = [
        registry.observe("node-a", agent, HOST, {"rack": "r1"}, "127.0.0.1:5050")
        for agent in ("a2", "a1")
    ]
    registry.save([r for r in records if r is not None])
    again = HostRegistry(SqlHostStore(db), lambda: NOW)
    assert [(v.record.hostname, v.record.agent_id) for v in again.list()] == [
        ("node-a", "a1"),
        ("node-a", "a2"),
    ]
    assert again.capacity()["total"] == HOST.scale(2)
    # A shared hostname does not name one host: the agent id does.
    with pytest.raises(FailedPrecondition, match=r"node-a names 2 agents \(a1, a2\)"):
        again.get("node-a")
    assert again.set_draining("a2", True).record.state == HostState.DRAINING
    assert again.draining() == {"a2"}
    # One of them lost: it stays DOWN beside the other (not superseded: that one is UP).
    assert again.agent_lost("a1") is not None
    assert again.counts() == {"DRAINING": 1, "DOWN": 1}


def test_active_attempts_are_the_launched_ones(db: Database) -> None:
    jobs = JobManager(db)
    job, _ = jobs.create_job(make_spec(2))
    jobs.admit_pending([(job.id, 2, "test")])
    for state in (TaskState.PLACING, TaskState.PLACED, TaskState.LAUNCHING):
        jobs.update_tasks(job.id, [TaskUpdate(0, 1, state)])
    assert SqlHostStore(db).active_attempts(TASK_ACTIVE) == [attempt_id(job.id, 0, 1)]


def test_what_launched_attempts_hold_is_read_from_the_database(db: Database) -> None:
    """A follower's view of the hosts: each launched attempt's agent and the job's per-task
    resources; attempts not launched yet (no agent) or ended hold nothing."""
    jobs = JobManager(db)
    job, _ = jobs.create_job(make_spec(3, gpu=2))
    jobs.admit_pending([(job.id, 3, "test")])
    for i in range(2):
        for state in (TaskState.PLACING, TaskState.PLACED, TaskState.LAUNCHING):
            jobs.update_tasks(job.id, [TaskUpdate(i, 1, state, host="h1", agent_id=f"a{i}")])
    jobs.update_tasks(job.id, [TaskUpdate(1, 1, TaskState.FAILED)])
    store = SqlHostStore(db)
    per_task = Resources(cpu=1, mem_mb=256, gpu=2)
    assert store.held(TASK_ACTIVE) == [(attempt_id(job.id, 0, 1), "a0", per_task)]
    registry = HostRegistry(store, lambda: NOW)
    record = registry.observe("h0", "a0", HOST, {}, "127.0.0.1:5051")
    assert record is not None
    registry.save([record])
    (view,) = HostRegistry.as_stored(store, lambda: NOW).list()
    assert (view.record.agent_id, view.used) == ("a0", per_task)
