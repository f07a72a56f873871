"""The fence of a leader's scheduling writes (peloton.ha.fence, peloton.storage.leases.holds):
admissions and placements commit only while the lease is this daemon's under its epoch; the API's
writes and Mesos's task updates are not fenced."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from support import make_spec

from peloton.core.records import Placement, TaskUpdate
from peloton.core.states import TaskState
from peloton.errors import FailedPrecondition, Unavailable
from peloton.ha.fence import Deposed, LeaderFence
from peloton.jobmgr.manager import JobManager
from peloton.storage.db import Database
from peloton.storage.leases import SqlLeaseStore, end_idle_transactions, holds

TTL = 30.0  # long: these tests expire the lease by hand, never by waiting
pytestmark = pytest.mark.parametrize("backend", ["postgresql"])


class Belief:
    """The elector as the fence asks it: the epoch this daemon believes it leads in."""

    def __init__(self, epoch: int | None) -> None:
        self.epoch = epoch


def expire(db: Database) -> None:
    with db.writing() as session:
        session.execute(text("UPDATE leader_leases SET expires_at = now() - interval '1 second'"))


def test_holds_only_for_the_holder_under_its_epoch_until_expiry(db: Database) -> None:
    assert SqlLeaseStore(db, "a").hold("a:1", None, TTL) == 1
    with db.writing() as session:
        assert holds(session, "a", 1)
        assert not holds(session, "a", 2)
        assert not holds(session, "b", 1)
    expire(db)
    with db.writing() as session:
        assert not holds(session, "a", 1)
    assert SqlLeaseStore(db, "b").hold("b:1", None, TTL) == 2
    with db.writing() as session:
        assert not holds(session, "a", 1)
        assert holds(session, "b", 2)


def test_a_deposed_leader_admits_and_places_nothing_but_the_api_still_writes(
    db: Database, manager: JobManager
) -> None:
    assert SqlLeaseStore(db, "a").hold("a:1", None, TTL) == 1
    belief = Belief(1)
    manager.set_fence(LeaderFence(belief, "a"))
    job, _ = manager.create_job(make_spec(2))
    assert manager.admit_pending([(job.id, 2, "admitted")]) == [(0, 1)]
    # Another daemon took the lease over while this one still believed it led (its own clock
    # is the first check; the database is the second).
    expire(db)
    assert SqlLeaseStore(db, "b").hold("b:1", None, TTL) == 2
    placing = [TaskUpdate(i, 1, TaskState.PLACING, "placing") for i in (0, 1)]
    with pytest.raises(Deposed, match="no longer holds the leader lease"):
        manager.update_tasks(job.id, placing)
    with pytest.raises(Deposed, match="no longer holds the leader lease"):
        manager.record_launches({job.id: {i: Placement(1, "h", "a", "e") for i in (0, 1)}})
    belief.epoch = None  # its term ended on its own clock
    with pytest.raises(FailedPrecondition, match="no longer leads"):
        manager.update_tasks(job.id, placing)
    other, _ = manager.create_job(make_spec(1))
    with pytest.raises(Deposed):
        manager.admit_pending([(other.id, 1, "admitted")])
    with pytest.raises(Deposed):
        manager.set_pending_reasons({other.id: ("waiting", "for GPUs")})
    with pytest.raises(Deposed):
        manager.preempt(job.id, "for a higher priority")
    with pytest.raises(Deposed):
        manager.fail_pending(other.id, "never fits", "too big")
    assert manager.instances(job.id, {TaskState.READY}) == (0, 1)
    # The API's writes are every daemon's: a kill through a follower is recorded.
    assert manager.kill_job(other.id).terminal


def test_a_fenced_transaction_left_idle_neither_blocks_a_takeover_nor_commits(
    db: Database,
) -> None:
    """A leader paused (SIGSTOP) inside a fenced transaction holds the lease row's lock: the
    server ends that transaction once it idles, so the takeover waits that long at most."""
    end_idle_transactions(db, 0.2)
    assert SqlLeaseStore(db, "a").hold("a:1", None, TTL) == 1
    with pytest.raises(Unavailable), db.writing() as session:
        assert holds(session, "a", 1)
        expire(db)  # waits for the share lock until the server ends the idle transaction
    assert SqlLeaseStore(db, "b").hold("b:1", None, TTL) == 2
