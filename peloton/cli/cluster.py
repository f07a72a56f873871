"""``peloton cluster ...``: the daemons on one PostgreSQL database and which of them leads.

It reads the database (as ``peloton db`` does), not a daemon: it answers when no daemon does,
and with the same ``--config`` as the daemons it judges their heartbeats by their lease's time
to live.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from peloton.cli import output as out
from peloton.cli.common import cli_error
from peloton.cli.options import config_option, config_options
from peloton.config import ServerConfig

if TYPE_CHECKING:
    from peloton.storage.leases import ClusterRecord


@click.group()
def cluster() -> None:
    """Several daemons on one database: who leads, and each daemon's health."""


@cluster.command()
@config_option
@config_options("db_url", "data_dir", "leader_lease_ttl_seconds")
@out.output_option
def status(db_url: str, data_dir: Path, leader_lease_ttl_seconds: float, fmt: str) -> None:
    """Which daemon leads (its epoch, since when) and each daemon's last heartbeat.

    A daemon is healthy while its last heartbeat is younger than the lease's time to live.
    """
    from peloton.storage.db import Database
    from peloton.storage.leases import read_cluster

    url = ServerConfig(db_url=db_url, data_dir=data_dir).database_url
    try:
        db = Database.from_url(url)
        try:
            record = read_cluster(db)
        finally:
            db.dispose()
    except Exception as exc:
        raise cli_error(exc) from None
    data = _data(record, leader_lease_ttl_seconds)
    if fmt != "table":
        out.emit_data(data, fmt)
        return
    _print(data)


def _iso(value: datetime) -> str:
    return value.isoformat()


def _data(record: ClusterRecord, ttl: float) -> dict[str, Any]:
    """Every field, times in ISO 8601 (UTC) and ages in seconds on the database's clock."""
    lease = record.lease
    leader = lease.holder if lease is not None and not lease.expired else None
    lease_data = None
    if lease is not None:
        lease_data = {
            "holder": lease.holder,
            "epoch": lease.epoch,
            "acquired_at": _iso(lease.acquired_at),
            "renewed_at": _iso(lease.renewed_at),
            "expires_at": _iso(lease.expires_at),
            "expires_in_seconds": round((lease.expires_at - record.now).total_seconds(), 3),
            "expired": lease.expired,
        }
    daemons = []
    for d in record.daemons:
        age = (record.now - d.heartbeat_at).total_seconds()
        daemons.append(
            {
                "daemon_id": d.daemon_id,
                "address": d.address,
                "leader": d.daemon_id == leader,
                "started_at": _iso(d.started_at),
                "heartbeat_at": _iso(d.heartbeat_at),
                "heartbeat_age_seconds": round(age, 3),
                "healthy": age < ttl,
            }
        )
    return {"leader": leader, "lease": lease_data, "daemons": daemons, "now": _iso(record.now)}


def _print(data: dict[str, Any]) -> None:
    lease = data["lease"]
    if lease is None:
        click.echo("leader:  none (no daemon with a daemon id has run on this database)")
    elif data["leader"] is None:
        click.echo(
            f"leader:  none (the lease of {lease['holder']}, epoch {lease['epoch']}, expired "
            f"{-lease['expires_in_seconds']:.1f}s ago)"
        )
    else:
        click.echo(
            f"leader:  {lease['holder']} (epoch {lease['epoch']}, since {lease['acquired_at']}, "
            f"lease expires in {lease['expires_in_seconds']:.1f}s)"
        )
    rows = [
        [
            d["daemon_id"],
            d["address"],
            "leader" if d["leader"] else "follower",
            "healthy" if d["healthy"] else "silent",
            f"{d['heartbeat_age_seconds']:.1f}s ago",
            d["started_at"],
        ]
        for d in data["daemons"]
    ]
    columns = ("DAEMON", "ADDRESS", "ROLE", "HEALTH", "HEARTBEAT", "STARTED")
    out.console().print(out.table(columns, rows))
