"""Shared fixtures: a fresh, migrated database per test on SQLite and on real PostgreSQL.

PostgreSQL is required, not optional: if it cannot be reached the PostgreSQL-parametrized tests
fail (``.ci/run`` starts the local server first). Set PELOTON_TEST_PG_ADMIN_URL to point the suite
at another server; each test gets its own throwaway database cloned from a migrated template.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
from daemon import Peloton
from images_support import write_runtime_image, write_test_images
from sqlalchemy.engine import make_url
from support import FakeClock, RecordingKiller

from peloton.jobmgr.manager import JobManager
from peloton.minicluster import Minicluster
from peloton.storage import migrate
from peloton.storage.db import Database, make_engine

PG_ADMIN_URL = os.environ.get(
    "PELOTON_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
BACKENDS = ("sqlite", "postgresql")


def _pg_admin() -> psycopg2.extensions.connection:
    url = make_url(PG_ADMIN_URL)
    try:
        conn = psycopg2.connect(
            host=url.host,
            port=url.port or 5432,
            user=url.username,
            password=url.password,
            dbname=url.database or "postgres",
            connect_timeout=5,
        )
    except psycopg2.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL is required for the test suite and is unreachable at "
            f"{PG_ADMIN_URL}: {exc}".strip(),
            pytrace=False,
        )
    conn.autocommit = True
    return conn


def _pg_url(dbname: str) -> str:
    return make_url(PG_ADMIN_URL).set(database=dbname).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A migrated PostgreSQL database that per-test databases are cloned from."""
    name = f"peloton_tmpl_{uuid.uuid4().hex[:10]}"
    admin = _pg_admin()
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    engine = make_engine(_pg_url(name))
    migrate.upgrade(engine)
    engine.dispose()
    yield name
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


@pytest.fixture
def pg_empty_url() -> Iterator[str]:
    """A throwaway PostgreSQL database with no schema."""
    name = f"peloton_test_{uuid.uuid4().hex[:12]}"
    admin = _pg_admin()
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    yield _pg_url(name)
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A migrated, empty database of the parametrized backend."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'peloton.db'}"
        engine = make_engine(url)
        migrate.upgrade(engine)
        engine.dispose()
        yield url
        return
    template = request.getfixturevalue("pg_template")
    name = f"peloton_test_{uuid.uuid4().hex[:12]}"
    admin = _pg_admin()
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    yield _pg_url(name)
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database.from_url(db_url)
    yield database
    database.dispose()


# ---------------------------------------------------------------- job manager fixtures


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def killer() -> RecordingKiller:
    return RecordingKiller()


@pytest.fixture
def manager(db: Database, clock: FakeClock, killer: RecordingKiller) -> JobManager:
    """A JobManager over the parametrized backend, with a fake clock and a recording killer."""
    return JobManager(db, clock=clock, killer=killer)


# ---------------------------------------------------------------- daemon with a minicluster


@pytest.fixture
def peloton(db_url: str, cluster: Minicluster, tmp_path: Path) -> Iterator[Peloton]:
    """A ``peloton server`` process on the parametrized database, framework of the test
    module's ``cluster``."""
    p = Peloton(db_url, cluster, tmp_path / "daemon")
    yield p
    p.close()


# ---------------------------------------------------------------- task containers


@pytest.fixture(scope="session")
def image_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An agents' image store (``--docker-registry``): the test images of
    :data:`images_support.IMAGES` (no Python, no peloton) and peloton's runtime bundle image."""
    directory = tmp_path_factory.mktemp("registry")
    write_test_images(directory, tmp_path_factory.mktemp("layers"))
    write_runtime_image(directory)
    return directory
