"""Database engines: one URL selects SQLite (embedded default) or PostgreSQL (psycopg2).

SQLite is tuned for one daemon on one machine: WAL journal, foreign keys on, a busy timeout, and
write transactions that start with ``BEGIN IMMEDIATE`` so two writers queue instead of failing
with "database is locked" when one upgrades a read lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

from peloton.errors import InvalidArgument

SQLITE_BUSY_TIMEOUT_MS = 30_000
_WRITE = "peloton_write"


def default_sqlite_url(data_dir: Path) -> str:
    """The embedded database: a file in the data directory."""
    return f"sqlite:///{(data_dir / 'peloton.db').resolve()}"


def make_engine(url: str, *, pool_size: int = 16) -> Engine:
    """An engine for ``url`` (``sqlite:///PATH`` or ``postgresql://...``)."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise InvalidArgument("db_url", f"cannot parse {url!r}") from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(url)
    if backend == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg2")
        # No pre-ping: it would cost a round trip per transaction. A connection found dead
        # fails one request (UNAVAILABLE, retryable) and SQLAlchemy then drops the whole pool.
        return create_engine(parsed, pool_size=pool_size, max_overflow=pool_size, pool_recycle=1800)
    raise InvalidArgument("db_url", f"unsupported database {backend!r}; use sqlite or postgresql")


def _sqlite_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event below emit BEGIN itself (pysqlite would defer it).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


class Database:
    """Sessions for readers and writers over one engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._read = sessionmaker(bind=engine, expire_on_commit=False)
        self._write = sessionmaker(
            bind=engine.execution_options(**{_WRITE: True}), expire_on_commit=False
        )

    @classmethod
    def from_url(cls, url: str) -> Database:
        return cls(make_engine(url))

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def reading(self) -> Iterator[Session]:
        """A read-only session (its transaction is rolled back at the end)."""
        with self._read() as session:
            yield session

    @contextmanager
    def writing(self) -> Iterator[Session]:
        """A write transaction: committed if the block returns, rolled back if it raises."""
        with self._write() as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
