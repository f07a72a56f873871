"""Host repository: the ``hosts`` and ``frameworks`` tables (a HostStore for the host manager)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime

from sqlalchemy import delete, select, tuple_

from peloton.core.hosts import HostRecord, HostState
from peloton.core.records import attempt_id
from peloton.core.resources import Resources
from peloton.core.states import TaskState
from peloton.storage.db import Database
from peloton.storage.jobs import spec_from_bytes
from peloton.storage.models import FrameworkRow, HostRow, JobRow, TaskRow

_KEYS_PER_QUERY = 1000


def host_record(row: HostRow) -> HostRecord:
    return HostRecord(
        hostname=row.hostname,
        agent_id=row.agent_id,
        state=HostState(row.state),
        total=Resources(row.cpu, row.mem_mb, row.disk_mb, row.gpu),
        attributes=json.loads(row.attributes),
        address=row.address,
        updated_at=row.updated_at,
    )


def _values(host: HostRecord) -> dict[str, object]:
    return {
        "agent_id": host.agent_id,
        "hostname": host.hostname,
        "state": host.state.value,
        "cpu": host.total.cpu,
        "mem_mb": host.total.mem_mb,
        "disk_mb": host.total.disk_mb,
        "gpu": host.total.gpu,
        "attributes": json.dumps(dict(host.attributes), sort_keys=True),
        "address": host.address,
        "updated_at": host.updated_at,
    }


class SqlHostStore:
    """HostStore on the peloton database (SQLite or PostgreSQL)."""

    def __init__(self, db: Database, clock: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self._db = db
        self._clock = clock

    def load_hosts(self) -> list[HostRecord]:
        with self._db.reading() as session:
            rows = session.scalars(select(HostRow).order_by(HostRow.hostname, HostRow.agent_id))
            return [host_record(r) for r in rows]

    def save_hosts(self, hosts: Sequence[HostRecord], remove: Sequence[str] = ()) -> None:
        with self._db.writing() as session:
            if remove:
                session.execute(delete(HostRow).where(HostRow.agent_id.in_(remove)))
            existing = {
                row.agent_id: row
                for row in session.scalars(
                    select(HostRow).where(HostRow.agent_id.in_([h.agent_id for h in hosts]))
                )
            }
            for host in hosts:
                values = _values(host)
                row = existing.get(host.agent_id)
                if row is None:
                    session.add(HostRow(**values))
                else:
                    for key, value in values.items():
                        setattr(row, key, value)

    def load_framework_id(self, name: str) -> str:
        with self._db.reading() as session:
            row = session.get(FrameworkRow, name)
            return row.framework_id if row is not None else ""

    def save_framework_id(self, name: str, framework_id: str) -> None:
        with self._db.writing() as session:
            row = session.get(FrameworkRow, name)
            if row is None:
                session.add(
                    FrameworkRow(name=name, framework_id=framework_id, updated_at=self._clock())
                )
            else:
                row.framework_id, row.updated_at = framework_id, self._clock()

    def active_attempts(self, states: Iterable[TaskState]) -> list[str]:
        with self._db.reading() as session:
            rows = session.execute(
                select(TaskRow.job_id, TaskRow.instance_id, TaskRow.attempt).where(
                    TaskRow.state.in_([s.value for s in states])
                )
            )
            return [attempt_id(j, i, a) for j, i, a in rows]

    def held(self, states: Iterable[TaskState]) -> list[tuple[str, str, Resources]]:
        with self._db.reading() as session:
            rows = list(
                session.execute(
                    select(TaskRow.job_id, TaskRow.instance_id, TaskRow.attempt, TaskRow.agent_id)
                    .where(TaskRow.state.in_([s.value for s in states]), TaskRow.agent_id != "")
                    .order_by(TaskRow.job_id, TaskRow.instance_id)
                )
            )
            jobs = sorted({job_id for job_id, _, _, _ in rows})
            per_task: dict[str, Resources] = {}
            for i in range(0, len(jobs), _KEYS_PER_QUERY):
                chunk = jobs[i : i + _KEYS_PER_QUERY]
                for job_id, spec in session.execute(
                    select(JobRow.id, JobRow.spec).where(JobRow.id.in_(chunk))
                ):
                    per_task[job_id] = Resources.from_proto(spec_from_bytes(spec).task.resources)
        return [
            (attempt_id(j, i, a), agent, per_task[j]) for j, i, a, agent in rows if j in per_task
        ]

    def current_attempts(
        self, tasks: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[int, TaskState, str]]:
        keys = sorted(set(tasks))
        out: dict[tuple[str, int], tuple[int, TaskState, str]] = {}
        if not keys:
            return out
        # A few queries for a whole batch of status updates (a gang starting is one burst), in
        # chunks that stay below SQLite's limit on parameters.
        with self._db.reading() as session:
            for i in range(0, len(keys), _KEYS_PER_QUERY):
                rows = session.execute(
                    select(
                        TaskRow.job_id,
                        TaskRow.instance_id,
                        TaskRow.attempt,
                        TaskRow.state,
                        TaskRow.host,
                    ).where(
                        tuple_(TaskRow.job_id, TaskRow.instance_id).in_(
                            keys[i : i + _KEYS_PER_QUERY]
                        )
                    )
                )
                for job_id, instance_id, attempt, state, host in rows:
                    out[(job_id, instance_id)] = (int(attempt), TaskState(state), host)
        return out
