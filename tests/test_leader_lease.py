"""The leader lease on PostgreSQL (peloton.storage.leases, peloton.ha.elector): acquire, renew,
take over an expired lease with a higher epoch, release; SQLite refuses a daemon id."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import in_process_server, scrape_metrics, wait_for
from prometheus_client import CollectorRegistry
from sqlalchemy import text

from peloton.core.term import LeaseTiming
from peloton.errors import FailedPrecondition
from peloton.ha.elector import Elector
from peloton.ha.metrics import LeaderMetrics
from peloton.storage.db import Database
from peloton.storage.leases import SqlLeaseStore, read_cluster

TTL = 30.0  # long: these tests expire the lease by hand, never by waiting
on_postgresql = pytest.mark.parametrize("backend", ["postgresql"])


def expire(db: Database) -> None:
    """Time passes on the database's clock: the lease is past its expiry."""
    with db.writing() as session:
        session.execute(text("UPDATE leader_leases SET expires_at = now() - interval '1 second'"))


@on_postgresql
def test_one_daemon_acquires_and_renews_and_the_other_is_refused(db: Database) -> None:
    a, b = SqlLeaseStore(db, "a"), SqlLeaseStore(db, "b")
    assert a.hold("10.0.0.1:5392", None, TTL) == 1
    assert b.hold("10.0.0.2:5392", None, TTL) is None
    assert a.hold("10.0.0.1:5392", 1, TTL) == 1
    record = read_cluster(db)
    assert record.lease is not None
    assert (record.lease.holder, record.lease.epoch, record.lease.expired) == ("a", 1, False)
    assert record.lease.renewed_at >= record.lease.acquired_at
    assert [(d.daemon_id, d.address) for d in record.daemons] == [
        ("a", "10.0.0.1:5392"),
        ("b", "10.0.0.2:5392"),
    ]


@on_postgresql
def test_an_expired_lease_is_taken_over_with_a_higher_epoch_and_the_old_epoch_is_refused(
    db: Database,
) -> None:
    a, b = SqlLeaseStore(db, "a"), SqlLeaseStore(db, "b")
    assert a.hold("a:1", None, TTL) == 1
    expire(db)
    assert read_cluster(db).lease.expired  # type: ignore[union-attr]
    assert b.hold("b:1", None, TTL) == 2
    # The old leader, back from a pause: its renewal names a stale epoch, its takeover an
    # unexpired lease.
    assert a.hold("a:1", 1, TTL) is None
    assert a.hold("a:1", None, TTL) is None
    # Its own expired lease is not renewed either: it must take it over, with a new epoch.
    expire(db)
    assert b.hold("b:1", 2, TTL) is None
    assert b.hold("b:1", None, TTL) == 3


@on_postgresql
def test_a_released_lease_is_taken_over_at_once(db: Database) -> None:
    a, b = SqlLeaseStore(db, "a"), SqlLeaseStore(db, "b")
    assert a.hold("a:1", None, TTL) == 1
    b.release(1)  # not b's: nothing happens
    assert b.hold("b:1", None, TTL) is None
    a.release(1)
    assert b.hold("b:1", None, TTL) == 2


@on_postgresql
def test_of_daemons_racing_for_an_expired_lease_exactly_one_wins(db: Database) -> None:
    stores = [SqlLeaseStore(db, f"d{i}") for i in range(4)]
    for round_ in range(10):
        start = threading.Barrier(len(stores))
        won: list[int | None] = [None] * len(stores)
        threads = [
            threading.Thread(target=take, args=(store, start, won, i))
            for i, store in enumerate(stores)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [w for w in won if w is not None] == [round_ + 1], won
        expire(db)


def take(store: SqlLeaseStore, start: threading.Barrier, won: list[int | None], i: int) -> None:
    start.wait()
    won[i] = store.hold(f"d{i}:1", None, TTL)


@pytest.mark.parametrize("backend", ["sqlite"])
def test_sqlite_refuses_a_daemon_id(db_url: str, tmp_path: Path) -> None:
    db = Database.from_url(db_url)
    try:
        with pytest.raises(FailedPrecondition, match="need PostgreSQL"):
            SqlLeaseStore(db, "a")
    finally:
        db.dispose()
    with (
        pytest.raises(FailedPrecondition, match="sqlite is one daemon's embedded database"),
        in_process_server(db_url, tmp_path, daemon_id="a"),
    ):
        pass


# ---------------------------------------------------------------------------- the elector

FAST = LeaseTiming(ttl=2.0, renew_every=0.3)


@pytest.fixture
def electors(db_url: str) -> Iterator[list[Elector]]:
    """Two electors, "a" and "b", each on its own connection to the database."""
    made: list[Elector] = []
    dbs = [Database.from_url(db_url) for _ in range(2)]
    for i, (name, db) in enumerate(zip("ab", dbs, strict=True)):
        # The gauge reads the elector that is made just after it.
        metrics = LeaderMetrics(CollectorRegistry(), lambda i=i: made[i].leads())
        made.append(Elector(SqlLeaseStore(db, name), f"{name}:1", FAST, metrics))
    for elector in made:
        elector.start()
    yield made
    for elector in made:
        elector.stop()
    for db in dbs:
        db.dispose()


@on_postgresql
def test_of_two_electors_one_leads_and_the_other_takes_over_when_it_stops(
    electors: list[Elector], db: Database
) -> None:
    def leaders() -> list[int]:
        return [i for i, e in enumerate(electors) if e.leads()]

    (first,) = wait_for(lambda: leaders() or None, 10, "a leader", state=lambda: read_cluster(db))
    epoch = electors[first].epoch
    assert epoch is not None
    electors[first].stop()  # releases: the other need not wait out the time to live
    other = 1 - first
    wait_for(
        lambda: electors[other].leads(),
        FAST.renew_every + 5,
        "the other daemon to lead",
        state=lambda: read_cluster(db),
    )
    assert electors[other].epoch == epoch + 1
    assert leaders() == [other]


@on_postgresql
def test_a_daemon_restarted_under_its_id_heartbeats_with_its_new_start(db: Database) -> None:
    SqlLeaseStore(db, "a").hold("a:1", None, TTL)
    (first,) = read_cluster(db).daemons
    restarted = SqlLeaseStore(db, "a")  # the same id, a new process
    restarted.hold("a:2", None, TTL)
    (again,) = read_cluster(db).daemons
    assert again.started_at > first.started_at and again.address == "a:2"
    assert again.heartbeat_at >= again.started_at
    restarted.hold("a:2", None, TTL)
    assert read_cluster(db).daemons[0].started_at == again.started_at


def test_without_a_daemon_id_the_daemon_is_the_leader(db_url: str, tmp_path: Path) -> None:
    with in_process_server(db_url, tmp_path) as server:
        assert server.leads()
        assert scrape_metrics(server.metrics_port)[("peloton_leader", ())] == 1
