"""The leader lease and the daemons' heartbeats: the ``leader_leases`` and ``daemons`` tables.

Only the database's clock decides expiry: every statement compares with and computes from its
``now()`` (the start of its transaction, never later than the statement runs, so the expiry it
sets errs early for the holder and the takeover it allows errs late for the others). A daemon's
own clock never reaches the database. The statements:

- acquire: insert the lease, or take over one whose ``expires_at`` is past, raising the epoch;
- renew: ``UPDATE ... WHERE holder = me AND epoch = my epoch AND expires_at >= now()``;
- release: expire it now, under the same condition, so that another daemon takes over at once;
- fence (:func:`holds`): inside a scheduling write's own transaction, check the lease is still
  this daemon's under its epoch and unexpired (at ``clock_timestamp()``, the statement's own
  time on the database's clock), and keep it so until that transaction ends.

PostgreSQL only: several daemons need a shared database server. SQLite is one daemon's embedded
database, and that daemon is always the leader (it takes no lease).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, event, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.orm import Session
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.sql.dml import ReturningInsert

from peloton.errors import FailedPrecondition
from peloton.storage.db import Database
from peloton.storage.models import DaemonRow, LeaderLeaseRow

# The one lease there is: the right to schedule (and, later, to hold the Mesos subscription).
SCHEDULER_LEASE = "scheduler"


@dataclass(frozen=True)
class LeaseRecord:
    """The lease row as the database holds it, with the database's time of reading it."""

    holder: str
    epoch: int
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime
    now: datetime

    @property
    def expired(self) -> bool:
        return self.expires_at < self.now


@dataclass(frozen=True)
class DaemonRecord:
    """A daemon that ran with a daemon id, and its last heartbeat."""

    daemon_id: str
    address: str
    started_at: datetime
    heartbeat_at: datetime


@dataclass(frozen=True)
class ClusterRecord:
    """The lease (None: no daemon ever held it), every daemon, and the database's time."""

    lease: LeaseRecord | None
    daemons: list[DaemonRecord]
    now: datetime


def require_shared_database(db: Database) -> None:
    """Refuse a database that several daemons cannot share."""
    if db.dialect != "postgresql":
        raise FailedPrecondition(
            f"several daemons (--daemon-id) need PostgreSQL; {db.dialect} is one daemon's "
            "embedded database, and that daemon always leads"
        )


class SqlLeaseStore:
    """Acquire, renew and release one lease for one daemon, and heartbeat that daemon."""

    def __init__(self, db: Database, daemon_id: str, name: str = SCHEDULER_LEASE) -> None:
        require_shared_database(db)
        self._db = db
        self._me = daemon_id
        self._name = name
        self._announced = False  # whether a heartbeat has said when this process started

    def hold(self, address: str, epoch: int | None, ttl: float) -> int | None:
        """Heartbeat, then renew the lease held under ``epoch`` (None: try to acquire it) for
        ``ttl`` seconds of the database's clock. Returns the epoch now held, None if refused."""
        now = func.now()
        expiry = now + timedelta(seconds=ttl)
        with self._db.writing() as session:
            beat = insert(DaemonRow).values(
                id=self._me, address=address, started_at=now, heartbeat_at=now
            )
            fresh = {"address": beat.excluded.address, "heartbeat_at": now}
            if not self._announced:  # a restart under the same id starts anew
                fresh["started_at"] = now
            session.execute(beat.on_conflict_do_update(index_elements=[DaemonRow.id], set_=fresh))
            if epoch is not None:
                renew = (
                    update(LeaderLeaseRow)
                    .where(
                        LeaderLeaseRow.name == self._name,
                        LeaderLeaseRow.holder == self._me,
                        LeaderLeaseRow.epoch == epoch,
                        LeaderLeaseRow.expires_at >= now,
                    )
                    .values(renewed_at=now, expires_at=expiry)
                    .returning(LeaderLeaseRow.epoch)
                )
                held = session.execute(renew).scalar_one_or_none()
            else:
                held = session.execute(self._take(now, expiry)).scalar_one_or_none()
        self._announced = True
        return held

    def _take(
        self, now: ColumnElement[datetime], expiry: ColumnElement[datetime]
    ) -> ReturningInsert[int]:
        """The statement that acquires the lease: inserts it, or takes over an expired one under
        the next epoch; it returns the epoch, or nothing if the lease is held."""
        take = insert(LeaderLeaseRow).values(
            name=self._name,
            holder=self._me,
            epoch=1,
            acquired_at=now,
            renewed_at=now,
            expires_at=expiry,
        )
        # On PostgreSQL the conflicting row is locked and the condition read again once a
        # concurrent takeover commits: of two daemons racing, one gets the lease.
        return take.on_conflict_do_update(
            index_elements=[LeaderLeaseRow.name],
            set_={
                "holder": take.excluded.holder,
                "epoch": LeaderLeaseRow.epoch + 1,
                "acquired_at": now,
                "renewed_at": now,
                "expires_at": expiry,
            },
            where=LeaderLeaseRow.expires_at < now,
        ).returning(LeaderLeaseRow.epoch)

    def release(self, epoch: int) -> None:
        """Give the lease up now (if still held under ``epoch``): another daemon need not wait
        for it to expire."""
        with self._db.writing() as session:
            session.execute(
                update(LeaderLeaseRow)
                .where(
                    LeaderLeaseRow.name == self._name,
                    LeaderLeaseRow.holder == self._me,
                    LeaderLeaseRow.epoch == epoch,
                )
                # Strictly past, as takeovers ask.
                .values(expires_at=func.now() - timedelta(microseconds=1))
            )


def end_idle_transactions(db: Database, seconds: float) -> None:
    """Have the server end every transaction of ``db`` that sits idle ``seconds`` between
    statements (and its connection with it). A daemon paused mid-transaction (SIGSTOP, a stalled
    VM) would otherwise hold its row locks for as long as it is paused: the lease row's, which
    the fence (:func:`holds`) locks, and so the lease itself, or a job's, which its successor
    must write. Connections made before this call are closed."""
    ms = max(1, int(seconds * 1000))

    @event.listens_for(db.engine, "connect")
    def _on_connect(conn: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        cursor = conn.cursor()
        cursor.execute(f"SET idle_in_transaction_session_timeout = {ms}")
        cursor.close()
        conn.commit()  # a SET in a transaction rolled back (as the pool does) is undone

    db.engine.dispose()


def holds(session: Session, holder: str, epoch: int, name: str = SCHEDULER_LEASE) -> bool:
    """Whether ``holder`` holds the lease under ``epoch`` now, in the caller's open write
    transaction: the fence of a leader's scheduling writes (placements, admissions).

    The row is locked FOR SHARE: a takeover (an UPDATE of it) waits for this transaction to end,
    so a write that passed the fence commits before any next leader's epoch begins, never after
    (a holder paused in between holds the lock only until the server ends its idle transaction,
    see :func:`end_idle_transactions`, and that write never commits). Expiry is compared with
    ``clock_timestamp()``, the time of this statement, not ``now()``: a leader paused after its
    transaction began must not pass on its start time.
    """
    held = session.execute(
        select(LeaderLeaseRow.epoch)
        .where(
            LeaderLeaseRow.name == name,
            LeaderLeaseRow.holder == holder,
            LeaderLeaseRow.epoch == epoch,
            LeaderLeaseRow.expires_at > func.clock_timestamp(),
        )
        .with_for_update(read=True)
    ).scalar_one_or_none()
    return held is not None


def read_cluster(db: Database, name: str = SCHEDULER_LEASE) -> ClusterRecord:
    """The lease and every daemon's heartbeat, as the database sees them now."""
    require_shared_database(db)
    with db.reading() as session:
        now = session.execute(select(func.now())).scalar_one()
        row = session.get(LeaderLeaseRow, name)
        lease = None
        if row is not None:
            lease = LeaseRecord(
                row.holder, row.epoch, row.acquired_at, row.renewed_at, row.expires_at, now
            )
        daemons = [
            DaemonRecord(d.id, d.address, d.started_at, d.heartbeat_at)
            for d in session.scalars(select(DaemonRow).order_by(DaemonRow.id))
        ]
    return ClusterRecord(lease, daemons, now)
