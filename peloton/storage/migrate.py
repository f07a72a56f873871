"""Alembic migrations driven from code: upgrade a database and check it is current."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from peloton.errors import FailedPrecondition

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "migrations/versions holds no revision"
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the database up to ``revision`` (default: the newest)."""
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def ensure_current(engine: Engine, url_hint: str) -> None:
    """Refuse to run on a database that is not at the newest schema revision."""
    current = current_revision(engine)
    head = head_revision()
    if current != head:
        state = "has no peloton schema" if current is None else f"is at revision {current}"
        raise FailedPrecondition(
            f"database {state}, need {head}; run: peloton db upgrade --db-url {url_hint}"
        )
