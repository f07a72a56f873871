"""Pool repository: pool configurations in the ``pools`` table."""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from peloton.core.access import Grant, Permission, Principal
from peloton.core.pools import KindConfig, Policy, PoolConfig, QueuePolicy
from peloton.core.states import JOB_TERMINAL
from peloton.storage.db import Database
from peloton.storage.models import JobRow, PoolRow


def config_to_json(config: PoolConfig) -> str:
    kinds: dict[str, dict[str, Any]] = {}
    for kind, kc in sorted(config.kinds.items()):
        entry: dict[str, Any] = {
            "reservation": kc.reservation,
            "share": kc.share,
            "policy": kc.policy.value,
        }
        if not math.isinf(kc.limit):  # JSON has no infinity: unlimited is a missing limit
            entry["limit"] = kc.limit
        kinds[kind] = entry
    data: dict[str, Any] = {"kinds": kinds, "queue_policy": config.queue_policy.value}
    if config.grants:
        data["grants"] = [
            {g.principal.kind: g.principal.name, "permission": str(g.permission)}
            for g in config.grants
        ]
    return json.dumps(data, sort_keys=True)


def _grant_of(data: dict[str, str]) -> Grant:
    permission = Permission[data.pop("permission").upper()]
    ((kind, name),) = data.items()
    return Grant(Principal(kind, name), permission)


def config_of(row: PoolRow) -> PoolConfig:
    data = json.loads(row.config)
    kinds = {
        kind: KindConfig(
            reservation=float(v["reservation"]),
            limit=float(v.get("limit", math.inf)),
            share=float(v["share"]),
            policy=Policy(v["policy"]),
        )
        for kind, v in data["kinds"].items()
    }
    return PoolConfig(
        path=row.path,
        owner=row.owner,
        kinds=kinds,
        queue_policy=QueuePolicy(data["queue_policy"]),
        # Pools stored before grants existed have none.
        grants=tuple(_grant_of(g) for g in data.get("grants", ())),
    )


def all_pools(session: Session) -> list[PoolConfig]:
    return [config_of(row) for row in session.scalars(select(PoolRow).order_by(PoolRow.path))]


def insert_pool(session: Session, config: PoolConfig, now: datetime) -> None:
    session.add(
        PoolRow(
            path=config.path,
            owner=config.owner,
            config=config_to_json(config),
            created_at=now,
            updated_at=now,
        )
    )


def update_pool(session: Session, config: PoolConfig, now: datetime) -> None:
    row = session.get(PoolRow, config.path, with_for_update=True)
    assert row is not None, config.path
    row.owner = config.owner
    row.config = config_to_json(config)
    row.updated_at = now


def delete_pool(session: Session, path: str) -> None:
    session.execute(delete(PoolRow).where(PoolRow.path == path))


def unfinished_jobs_by_pool(session: Session) -> dict[str, int]:
    """How many jobs that have not ended each pool holds."""
    rows = session.execute(
        select(JobRow.pool, func.count())
        .where(JobRow.state.not_in(sorted(s.value for s in JOB_TERMINAL)))
        .group_by(JobRow.pool)
    )
    return {pool: int(n) for pool, n in rows}


def pool_times(session: Session) -> dict[str, tuple[datetime, datetime]]:
    rows = session.execute(select(PoolRow.path, PoolRow.created_at, PoolRow.updated_at))
    return {path: (created, updated) for path, created, updated in rows}


class SqlPoolStore:
    """PoolStore (:mod:`peloton.core.ledger`) on the peloton database: one transaction per
    call."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def all_pools(self) -> list[PoolConfig]:
        with self._db.reading() as session:
            return all_pools(session)

    def insert_pool(self, config: PoolConfig, now: datetime) -> None:
        with self._db.writing() as session:
            insert_pool(session, config, now)

    def update_pool(self, config: PoolConfig, now: datetime) -> None:
        with self._db.writing() as session:
            update_pool(session, config, now)

    def delete_pool(self, path: str) -> None:
        with self._db.writing() as session:
            delete_pool(session, path)

    def unfinished_jobs_by_pool(self) -> dict[str, int]:
        with self._db.reading() as session:
            return unfinished_jobs_by_pool(session)
