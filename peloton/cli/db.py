"""``peloton db ...``: schema migrations."""

from __future__ import annotations

from pathlib import Path

import click
from sqlalchemy.engine import make_url

from peloton.cli.common import cli_error
from peloton.cli.options import config_option, database_options
from peloton.config import ServerConfig


def _config(db_url: str, data_dir: Path) -> ServerConfig:
    return ServerConfig(db_url=db_url, data_dir=data_dir)


@click.group()
def db() -> None:
    """Create and upgrade the database schema."""


@db.command()
@config_option
@database_options
def upgrade(db_url: str, data_dir: Path) -> None:
    """Upgrade the database to the newest schema (creates it if empty)."""
    from peloton.storage import migrate
    from peloton.storage.db import make_engine

    url = _config(db_url, data_dir).database_url
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        engine = make_engine(url)
        before = migrate.current_revision(engine)
        migrate.upgrade(engine)
        after = migrate.current_revision(engine)
        engine.dispose()
    except Exception as exc:
        raise cli_error(exc) from None
    shown = make_url(url).render_as_string(hide_password=True)
    if before == after:
        click.echo(f"{shown}: already at revision {after}")
    else:
        click.echo(f"{shown}: upgraded from {before or 'empty'} to {after}")


@db.command()
@config_option
@database_options
def current(db_url: str, data_dir: Path) -> None:
    """Print the database's schema revision and the newest one."""
    from peloton.storage import migrate
    from peloton.storage.db import make_engine

    url = _config(db_url, data_dir).database_url
    try:
        engine = make_engine(url)
        revision = migrate.current_revision(engine)
        engine.dispose()
    except Exception as exc:
        raise cli_error(exc) from None
    click.echo(f"current {revision or 'none'}, newest {migrate.head_revision()}")
