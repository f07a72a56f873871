"""Alembic migrations: they build exactly the models' schema, keep old data, and are enforced."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from google.protobuf import json_format
from sqlalchemy import Engine, inspect, text

from peloton.core.records import JobFilter, TaskUpdate
from peloton.core.states import Goal, JobState, TaskState
from peloton.errors import FailedPrecondition
from peloton.jobmgr.manager import JobManager
from peloton.storage import migrate
from peloton.storage.db import Database, make_engine
from peloton.storage.models import Base
from peloton.v1 import job_pb2

PREVIOUS = "0001"
TABLES = {
    "jobs",
    "job_labels",
    "tasks",
    "task_attempts",
    "job_events",
    "job_messages",
    "pools",
    "hosts",
    "frameworks",
    "leader_leases",
    "daemons",
    "audit_records",
    "sweeps",
    "sweep_trials",
    "sweep_metrics",
}
# The tables of revision PREVIOUS.
PREVIOUS_TABLES = {"jobs", "job_labels", "tasks", "job_events"}


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database with no schema at all, of each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'empty.db'}"
    return str(request.getfixturevalue("pg_empty_url"))


@pytest.fixture
def engine(empty_url: str) -> Iterator[Engine]:
    eng = make_engine(empty_url)
    yield eng
    eng.dispose()


def schema_differences(engine: Engine) -> list[object]:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, Base.metadata))


def tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names()) - {"alembic_version"}


def test_head_is_the_newest_revision() -> None:
    # Revision files are numbered; the chain's single head must be the highest-numbered one.
    newest = max(p.name.split("_")[0] for p in (migrate.MIGRATIONS_DIR / "versions").glob("0*.py"))
    assert migrate.head_revision() == newest


def test_upgrade_empty_database_matches_the_models(engine: Engine) -> None:
    assert migrate.current_revision(engine) is None
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    assert tables(engine) == TABLES
    assert schema_differences(engine) == []
    # Upgrading a current database is a no-op.
    migrate.upgrade(engine)
    assert schema_differences(engine) == []


def test_compare_would_notice_a_missing_table(engine: Engine) -> None:
    # The comparison above can fail: at the previous revision a table is missing.
    migrate.upgrade(engine, PREVIOUS)
    assert tables(engine) == PREVIOUS_TABLES
    diffs = schema_differences(engine)
    assert any(d[0] == "add_table" and d[1].name == "task_attempts" for d in diffs)  # type: ignore[index]


def _downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    cfg = migrate.alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def test_downgrade_and_upgrade_again(engine: Engine) -> None:
    migrate.upgrade(engine)
    _downgrade(engine, PREVIOUS)
    assert migrate.current_revision(engine) == PREVIOUS
    assert "task_attempts" not in tables(engine)
    migrate.upgrade(engine)
    assert schema_differences(engine) == []


def _insert_old_job(engine: Engine, job_id: str) -> None:
    """A job as peloton at revision 0001 wrote it, in plain SQL."""
    spec = {
        "name": "old-job",
        "pool": "/legacy",
        "priority": 5,
        "labels": {"team": "old"},
        "instances": 2,
        "gang": {"min_instances": 2},
        "task": {"command": "sleep 1", "resources": {"cpu": 1.0, "mem_mb": 64.0}},
        "restart": {"max_failures": 3, "backoff_seconds": 30},
        "preemption": {"kill_grace_seconds": 30},
    }
    if engine.dialect.name == "sqlite":
        created, updated = "2025-06-01 10:00:00.000000", "2025-06-01 10:05:00.000000"
    else:
        created, updated = "2025-06-01 10:00:00+00", "2025-06-01 10:05:00+00"
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (id, name, pool, priority, instances, state, goal, reason,"
                " message, spec, task_counts, request_id, created_at, updated_at, version)"
                " VALUES (:id, 'old-job', '/legacy', 5, 2, 'RUNNING', 'RUN', '', '', :spec,"
                " :counts, 'old-req', :created, :updated, 2)"
            ),
            {
                "id": job_id,
                "spec": json_format.ParseDict(spec, job_pb2.JobSpec()).SerializeToString(),
                "counts": json.dumps({"RUNNING": 1, "SUCCEEDED": 1}),
                "created": created,
                "updated": updated,
            },
        )
        conn.execute(
            text("INSERT INTO job_labels (job_id, key, value) VALUES (:id, 'team', 'old')"),
            {"id": job_id},
        )
        for instance, state in ((0, "RUNNING"), (1, "SUCCEEDED")):
            ended = updated if state == "SUCCEEDED" else None
            conn.execute(
                text(
                    "INSERT INTO tasks (job_id, instance_id, state, goal, attempt, host, reason,"
                    " message, failures, started_at, ended_at, updated_at, version) VALUES"
                    " (:id, :i, :state, 'RUN', 1, 'oldhost', '', '', 0, :created, :ended,"
                    " :updated, 3)"
                ),
                {
                    "id": job_id,
                    "i": instance,
                    "state": state,
                    "created": created,
                    "ended": ended,
                    "updated": updated,
                },
            )
        conn.execute(
            text(
                "INSERT INTO job_events (job_id, instance_id, time, from_state, to_state, reason,"
                " message, host, attempt_id) VALUES"
                " (:id, NULL, :created, '', 'PENDING', 'created', '2 tasks', '', ''),"
                " (:id, NULL, :updated, 'PENDING', 'RUNNING', '', '', '', '')"
            ),
            {"id": job_id, "created": created, "updated": updated},
        )


def test_upgrade_from_previous_revision_keeps_jobs(empty_url: str, engine: Engine) -> None:
    migrate.upgrade(engine, PREVIOUS)
    assert migrate.current_revision(engine) == PREVIOUS
    job_id = "11111111-2222-3333-4444-555555555555"
    _insert_old_job(engine, job_id)

    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    assert schema_differences(engine) == []

    db = Database.from_url(empty_url)
    try:
        manager = JobManager(db)
        job = manager.get_job(job_id)
        assert job.state == JobState.RUNNING
        assert job.goal == Goal.RUN
        assert job.version == 2
        assert job.spec.name == "old-job" and job.spec.instances == 2
        assert job.created_at == datetime(2025, 6, 1, 10, 0, tzinfo=UTC)
        assert dict(job.task_counts) == {TaskState.RUNNING: 1, TaskState.SUCCEEDED: 1}
        jobs, _ = manager.list_jobs(JobFilter(labels={"team": "old"}, name_prefix="old"))
        assert [j.id for j in jobs] == [job_id]
        task, events = manager.get_task(job_id, 1)
        assert (task.state, task.current.host, task.history) == (TaskState.SUCCEEDED, "oldhost", ())
        assert events == []
        assert len(manager.job_events(job_id)) == 2
        # The same request id finds it.
        again, created = manager.create_job(job.spec, request_id="old-req")
        assert (again.id, created) == (job_id, False)
        # It lives on under the new schema: a restart archives attempt 1 in task_attempts.
        manager.update_tasks(job_id, [TaskUpdate(0, 1, TaskState.SUCCEEDED)])
        assert manager.get_job(job_id).state == JobState.SUCCEEDED
        restarted = manager.restart_job(job_id)
        assert restarted.state == JobState.PENDING
        task, _ = manager.get_task(job_id, 1)
        assert task.current.attempt == 2
        assert [(h.attempt, h.state, h.host) for h in task.history] == [
            (1, TaskState.SUCCEEDED, "oldhost")
        ]
    finally:
        db.dispose()


def test_ensure_current(engine: Engine, empty_url: str) -> None:
    with pytest.raises(FailedPrecondition) as info:
        migrate.ensure_current(engine, empty_url)
    message = str(info.value)
    assert "peloton db upgrade" in message
    assert "has no peloton schema" in message
    assert empty_url in message

    migrate.upgrade(engine, PREVIOUS)
    with pytest.raises(FailedPrecondition) as info:
        migrate.ensure_current(engine, "URL")
    message = str(info.value)
    assert "peloton db upgrade --db-url URL" in message
    assert f"at revision {PREVIOUS}" in message
    assert migrate.head_revision() in message

    migrate.upgrade(engine)
    migrate.ensure_current(engine, empty_url)


def _places(engine: Engine, table: str) -> list[tuple[object, ...]]:
    """(instance, attempt, host, agent id, executor id) of every attempt row in ``table``."""
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    f"SELECT instance_id, attempt, host, agent_id, executor_id FROM {table}"
                    " ORDER BY instance_id, attempt"
                )
            )
        ]


def test_0007_records_where_attempts_ran_and_downgrades_keeping_them(engine: Engine) -> None:
    migrate.upgrade(engine, "0006")
    job_id = "11111111-2222-3333-4444-555555555555"
    _insert_old_job(engine, job_id)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO task_attempts (job_id, instance_id, attempt, state, host, reason,"
                " message) VALUES (:id, 0, 0, 'FAILED', 'oldhost', '', '')"
            ),
            {"id": job_id},
        )
    migrate.upgrade(engine, "0007")
    # Attempts from before the revision name no agent or executor.
    assert _places(engine, "task_attempts") == [(0, 0, "oldhost", "", "")]
    assert _places(engine, "tasks") == [(0, 1, "oldhost", "", ""), (1, 1, "oldhost", "", "")]
    with engine.begin() as conn:
        conn.execute(text("UPDATE tasks SET agent_id = 'a1', executor_id = 'e1'"))
    assert _places(engine, "tasks")[0] == (0, 1, "oldhost", "a1", "e1")

    _downgrade(engine, "0006")
    columns = {
        t: {c["name"] for c in inspect(engine).get_columns(t)} for t in ("tasks", "task_attempts")
    }
    assert all({"agent_id", "executor_id"}.isdisjoint(c) and "host" in c for c in columns.values())
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tasks")).scalar() == 2
        assert conn.execute(text("SELECT count(*) FROM task_attempts")).scalar() == 1
    migrate.upgrade(engine)
    assert schema_differences(engine) == []


def _messages(engine: Engine, table: str) -> list[tuple[object, ...]]:
    """(instance, message) of every row of ``table`` with an instance, as stored."""
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    f"SELECT instance_id, message FROM {table} WHERE instance_id IS NOT NULL"
                    " ORDER BY instance_id"
                )
            )
        ]


def test_0008_keeps_old_messages_readable_and_downgrades_inlining_the_shared_ones(
    engine: Engine, empty_url: str
) -> None:
    migrate.upgrade(engine, "0007")
    job_id = "11111111-2222-3333-4444-555555555555"
    _insert_old_job(engine, job_id)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE tasks SET state = 'RUNNING', ended_at = NULL,"
                " message = 'own ' || CAST(instance_id AS TEXT)"
            )
        )
        conn.execute(text("""UPDATE jobs SET task_counts = '{"RUNNING": 2}'"""))
    migrate.upgrade(engine, migrate.head_revision())  # 0008 and after
    assert schema_differences(engine) == []

    kill, restart = "kill " * 8, "restart " * 8
    db = Database.from_url(empty_url)
    try:
        manager = JobManager(db)
        # Rows from before the revision hold their own message.
        assert [t.current.message for t in manager.list_tasks(job_id)[0]] == ["own 0", "own 1"]
        # Both tasks share a job-wide action's message, stored once.
        manager.kill_job(job_id, kill)
        manager.update_tasks(job_id, [TaskUpdate(i, 1, TaskState.KILLED) for i in (0, 1)])
        assert [t.current.message for t in manager.list_tasks(job_id)[0]] == [kill, kill]
        manager.restart_job(job_id, restart)
        tasks, _ = manager.list_tasks(job_id)
        assert [(t.current.message, t.history[-1].message) for t in tasks] == [
            (restart, kill),
            (restart, kill),
        ]
    finally:
        db.dispose()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_messages")).scalar() == 2
    assert _messages(engine, "tasks") == [(0, ""), (1, "")]

    _downgrade(engine, "0007")
    assert "job_messages" not in tables(engine)
    assert _messages(engine, "tasks") == [(0, restart), (1, restart)]
    assert _messages(engine, "task_attempts") == [(0, kill), (1, kill)]
    # Per task: KILLING and KILLED (Mesos said nothing), then the new attempt.
    events = sorted(_messages(engine, "job_events"), key=lambda r: str(r[1]))
    assert [m for _, m in events] == ["", "", kill, kill, restart, restart]
    migrate.upgrade(engine)
    assert schema_differences(engine) == []
