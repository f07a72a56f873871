"""Database engines: one URL selects SQLite (embedded default) or PostgreSQL (psycopg2).

SQLite is tuned for one daemon on one machine: WAL journal, foreign keys on, a busy timeout, and
write transactions that start with ``BEGIN IMMEDIATE`` so two writers queue instead of failing
with "database is locked" when one upgrades a read lock.

Every transaction is bounded in time (:class:`DbTimeouts`, shortened by the RPC's deadline, see
:mod:`peloton.storage.deadline`): on PostgreSQL by ``statement_timeout`` on the server and by the
driver's waits on the client (a server that went silent answers nothing, not even the timeout),
on SQLite by the busy timeout and a progress handler. A database that does not answer in time
costs the caller :class:`~peloton.errors.Unavailable`, never a hung thread.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2.extensions
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import QueuePool

from peloton.errors import InvalidArgument, Unavailable
from peloton.storage.deadline import Limits, current_limits, current_scope, limits

_WRITE = "peloton_write"
# Connections of the engine that appends (Database.appending), at most twice this many.
APPEND_POOL_SIZE = 2
# The server's statement_timeout fires this much before the client stops waiting, so that a
# server that answers reports the timeout itself (and the connection stays usable).
CLIENT_GRACE_SECONDS = 0.2
# A transaction's deadline this close to the session's statement_timeout leaves the session's in
# force (the client still stops waiting at the deadline): a SET LOCAL costs a round trip.
SERVER_TIMEOUT_SLACK_SECONDS = 1.0
# A backend checks this often whether its client is gone (a cut connection), and stops.
PG_CLIENT_CHECK_MS = 500


@dataclass(frozen=True)
class DbTimeouts:
    """Bounds on database waits; an RPC's deadline shortens each further."""

    # Longest a statement may run (an RPC's whole transaction: at most its deadline).
    statement_seconds: float = 30.0
    # Longest wait for a pooled connection when all are in use.
    pool_seconds: float = 5.0
    # Longest a new connection may take; also how soon TCP keepalives find a dead peer.
    connect_seconds: float = 5.0


def default_sqlite_url(data_dir: Path) -> str:
    """The embedded database: a file in the data directory."""
    return f"sqlite:///{(data_dir / 'peloton.db').resolve()}"


def make_engine(
    url: str,
    *,
    pool_size: int = 16,
    timeouts: DbTimeouts | None = None,
    autocommit: bool = False,
) -> Engine:
    """An engine for ``url`` (``sqlite:///PATH`` or ``postgresql://...``); ``autocommit`` (on
    PostgreSQL): its connections commit every statement by itself."""
    timeouts = timeouts or DbTimeouts()
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise InvalidArgument("db_url", f"cannot parse {url!r}") from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(url, timeouts)
    if backend == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg2")
        return _postgres_engine(
            parsed.render_as_string(hide_password=False), pool_size, timeouts, autocommit
        )
    raise InvalidArgument("db_url", f"unsupported database {backend!r}; use sqlite or postgresql")


class _DeadlinePool(QueuePool):
    """A queue pool whose checkout wait is also bounded by the running transaction's deadline."""

    # SQLAlchemy names a pool's logger after its class's module: keep it among SQLAlchemy's
    # loggers (quiet below WARNING), not peloton's, which log at INFO.
    __module__ = "sqlalchemy.pool"

    @property
    def _timeout(self) -> float:
        bound = current_limits()
        if bound is None or bound.deadline is None:
            return self._cap
        return max(0.001, min(self._cap, bound.deadline - time.monotonic()))

    @_timeout.setter
    def _timeout(self, value: float) -> None:
        self._cap = value


def _postgres_engine(
    url: str, pool_size: int, timeouts: DbTimeouts, autocommit: bool = False
) -> Engine:
    # The driver waits for the server in _wait_for_postgres, which bounds every wait.
    psycopg2.extensions.set_wait_callback(_wait_for_postgres)
    whole = max(1, round(timeouts.connect_seconds))
    connect_args = {
        "connect_timeout": whole,
        # Keepalives find a peer that vanished from an idle connection.
        "keepalives": 1,
        "keepalives_idle": whole,
        "keepalives_interval": max(1, whole // 3),
        "keepalives_count": 3,
        "options": (
            f"-c statement_timeout={_ms(timeouts.statement_seconds)}"
            f" -c client_connection_check_interval={PG_CLIENT_CHECK_MS}"
        ),
    }
    # No pre-ping: it would cost a round trip per transaction. A connection found dead
    # fails one request (UNAVAILABLE, retryable) and SQLAlchemy then drops the whole pool.
    # values_plus_batch: the rows of one flush's UPDATE (the jobs of an admission) go in one
    # round trip, not one each.
    engine = create_engine(
        url,
        executemany_mode="values_plus_batch",
        poolclass=_DeadlinePool,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=1800,
        pool_timeout=timeouts.pool_seconds,
        connect_args=connect_args,
        # Set once per connection (switching a pooled one costs round trips each time).
        **({"isolation_level": "AUTOCOMMIT"} if autocommit else {}),
    )
    if autocommit:
        return engine  # no transaction to SET LOCAL in: the client's wait is bounded alone

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        bound = current_limits()
        if bound is not None and bound.deadline is not None:
            left = bound.deadline - time.monotonic() - CLIENT_GRACE_SECONDS
            # A round trip of its own: only where the deadline is shorter than the session's
            # timeout by more than a moment (a client's usual 30 s deadline is not).
            if left < bound.statement_seconds - SERVER_TIMEOUT_SLACK_SECONDS:
                conn.exec_driver_sql(f"SET LOCAL statement_timeout = {_ms(left)}")

    return engine


def _ms(seconds: float) -> int:
    # 0 would mean "no timeout" to both databases.
    return max(1, int(seconds * 1000))


def _wait_for_postgres(conn: Any) -> None:
    """psycopg2's wait callback: poll the connection until the server answered, giving up at
    the running transaction's bound (the server's own timeout cannot fire when it is silent)."""
    bound = current_limits()
    limit = _wait_limit(conn, bound) if bound is not None else None
    poller = select.poll()
    while True:
        state = conn.poll()
        if state == psycopg2.extensions.POLL_OK:
            return
        flag = select.POLLIN if state == psycopg2.extensions.POLL_READ else select.POLLOUT
        poller.register(conn.fileno(), flag)
        left = None if limit is None else limit - time.monotonic()
        if left is not None and left <= 0:
            raise psycopg2.OperationalError("the database did not answer in time")
        poller.poll(None if left is None else left * 1000)
        poller.unregister(conn.fileno())


_READY = (
    psycopg2.extensions.STATUS_READY,
    psycopg2.extensions.STATUS_BEGIN,
    psycopg2.extensions.STATUS_PREPARED,
)


def _wait_limit(conn: Any, bound: Limits) -> float:
    """When to stop waiting: a connect's or a statement's time, and never past the deadline."""
    now = time.monotonic()
    step = bound.connect_seconds if conn.status not in _READY else bound.statement_seconds
    limit = now + step + CLIENT_GRACE_SECONDS
    return limit if bound.deadline is None else min(limit, bound.deadline)


def _cut_postgres(dbapi_conn: Any) -> None:
    """Shut the connection's socket down: the waiting thread wakes with an error at once (a
    cancel request would need the server to answer), and the backend notices its client is
    gone within client_connection_check_interval and stops the query."""
    try:
        fd = dbapi_conn.fileno()
    except Exception:  # already closed: nothing runs on it
        return
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed meanwhile


def _cut_sqlite(dbapi_conn: Any) -> None:
    """Interrupt the statement running on the connection (SQLite allows it from any thread)."""
    if dbapi_conn is not None:
        dbapi_conn.interrupt()


def _sqlite_engine(url: str, timeouts: DbTimeouts) -> Engine:
    parsed = make_url(url)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": timeouts.statement_seconds},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event below emit BEGIN itself (pysqlite would defer it).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()
        dbapi_conn.set_progress_handler(_sqlite_past_deadline, 10_000)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        bound = current_limits()
        seconds = timeouts.statement_seconds
        if bound is not None and bound.deadline is not None:
            seconds = bound.deadline - time.monotonic()
        conn.exec_driver_sql(f"PRAGMA busy_timeout={_ms(seconds)}")
        write = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def _sqlite_past_deadline() -> bool:
    """SQLite's progress handler: True interrupts the statement once the RPC's time is up."""
    bound = current_limits()
    return bound is not None and bound.deadline is not None and time.monotonic() > bound.deadline


class Database:
    """Sessions for readers and writers over one engine, each bounded in time."""

    def __init__(self, engine: Engine, timeouts: DbTimeouts | None = None) -> None:
        self.engine = engine
        self.timeouts = timeouts or DbTimeouts()
        self._read = sessionmaker(bind=engine, expire_on_commit=False)
        self._write = sessionmaker(
            bind=engine.execution_options(**{_WRITE: True}), expire_on_commit=False
        )
        self._cut: Callable[[Any], None] = (
            _cut_postgres if self.dialect == "postgresql" else _cut_sqlite
        )
        self._lock = threading.Lock()
        self._in_use: dict[int, Any] = {}  # connection records checked out, by id
        self._unreachable = ""  # why the health probe last failed; empty while it answers
        self._closes_at: float | None = None  # on shutdown: when every transaction must end
        self._closer: threading.Timer | None = None
        self._append_engine: Engine | None = None
        event.listen(engine, "checkout", self._on_checkout)
        event.listen(engine, "checkin", self._on_checkin)

    @classmethod
    def from_url(cls, url: str, timeouts: DbTimeouts | None = None) -> Database:
        return cls(make_engine(url, timeouts=timeouts), timeouts)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def reading(self) -> Iterator[Session]:
        """A read-only session (its transaction is rolled back at the end)."""
        with self._bounded(), self._read() as session:
            yield session

    @contextmanager
    def writing(self) -> Iterator[Session]:
        """A write transaction: committed if the block returns, rolled back if it raises."""
        with self._bounded(), self._write() as session, session.begin():
            yield session

    @contextmanager
    def appending(self) -> Iterator[Connection]:
        """A connection for one statement that is a write of its own (a multi-row INSERT into
        an append-only table): on PostgreSQL it commits by itself, one round trip where a
        transaction takes four (BEGIN, the deadline's SET LOCAL, the statement, COMMIT); on
        SQLite it runs in a write transaction (which queues for the write lock)."""
        if self.dialect != "postgresql":
            with self.writing() as session:
                yield session.connection()
            return
        with self._bounded(), self._appender().connect() as conn:
            yield conn

    def _appender(self) -> Engine:
        """The engine of :meth:`appending`: a small pool of connections in autocommit, made at
        the first append."""
        with self._lock:
            if self._append_engine is None:
                url = self.engine.url.render_as_string(hide_password=False)
                engine = make_engine(
                    url, pool_size=APPEND_POOL_SIZE, timeouts=self.timeouts, autocommit=True
                )
                event.listen(engine, "checkout", self._on_checkout)
                event.listen(engine, "checkin", self._on_checkin)
                self._append_engine = engine
            return self._append_engine

    def set_unreachable(self, reason: str) -> None:
        """What the health probe found: RPCs fail fast while ``reason`` is not empty, so that
        they do not each wait out their deadline (and hold a worker thread) meanwhile."""
        self._unreachable = reason

    def interrupt(self) -> None:
        """Abort every transaction running now."""
        with self._lock:
            for record in self._in_use.values():
                self._cut(record.dbapi_connection)

    def close_within(self, seconds: float) -> None:
        """On shutdown: transactions from now on must end within ``seconds``, and those still
        running then are aborted, so that no thread outlives the daemon waiting on the
        database."""
        self._closes_at = time.monotonic() + seconds
        self._closer = threading.Timer(seconds, self.interrupt)
        self._closer.daemon = True
        self._closer.start()

    def dispose(self) -> None:
        if self._closer is not None:
            self._closer.cancel()
        self.engine.dispose()
        if self._append_engine is not None:
            self._append_engine.dispose()

    @contextmanager
    def _bounded(self) -> Iterator[None]:
        """Run a transaction within the RPC's deadline (if any) and the configured bounds."""
        scope = current_scope()
        seconds = None if scope is None else scope.database_seconds()
        if scope is not None and self._unreachable:
            raise Unavailable(f"database unreachable ({self._unreachable}); retry later")
        if seconds is not None and seconds <= 0:
            raise Unavailable("no time left before the RPC's deadline to ask the database")
        t = self.timeouts
        deadline = self._closes_at
        if seconds is not None:
            mine = time.monotonic() + min(seconds, t.statement_seconds)
            deadline = mine if deadline is None else min(deadline, mine)
        try:
            with limits(Limits(deadline, t.statement_seconds, t.connect_seconds)):
                yield
        except (OperationalError, PoolTimeoutError) as exc:
            raise Unavailable(f"database unavailable: {_reason(exc)}; retry later") from exc

    def _on_checkout(self, _dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        with self._lock:
            self._in_use[id(record)] = record
        scope = current_scope()
        if scope is not None:
            record.info["peloton_scope"] = scope
            scope.hold(id(record), lambda: self._cut(record.dbapi_connection))

    def _on_checkin(self, _dbapi_conn: Any, record: Any) -> None:
        scope = record.info.pop("peloton_scope", None)
        if scope is not None:
            scope.release(id(record))
        with self._lock:
            self._in_use.pop(id(record), None)


def _reason(exc: Exception) -> str:
    """The driver's first line: what went wrong, without the SQL or SQLAlchemy's links."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        text = str(exc.orig).strip()
    else:
        text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
