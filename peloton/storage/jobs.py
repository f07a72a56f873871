"""Job repository: every SQL statement about jobs, tasks, attempts and events.

Functions take an open Session and never commit: the job manager decides transaction bounds, so a
state change and its event row always land together. Bulk operations (create, kill, restart of a
whole job) are set-based statements, so a 100,000-task job costs a few statements, not 100,000.
"""

from __future__ import annotations

import base64
import functools
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeAlias

import orjson
from sqlalchemy import (
    Integer,
    Select,
    String,
    Table,
    Update,
    and_,
    bindparam,
    cast,
    delete,
    event,
    func,
    insert,
    literal,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import CursorResult, Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import ORMExecuteState, Session
from sqlalchemy.types import TypeEngine

from peloton.core.records import (
    AttemptRecord,
    EventRecord,
    JobFilter,
    JobRecord,
    TaskRecord,
    attempt_id,
)
from peloton.core.states import JOB_TERMINAL, Goal, JobState, TaskState
from peloton.errors import InvalidArgument
from peloton.storage.models import (
    JobEventRow,
    JobLabelRow,
    JobMessageRow,
    JobRow,
    TaskAttemptRow,
    TaskRow,
)
from peloton.v1 import job_pb2

# The mapped tables, for Core INSERTs: the same SQL as the ORM bulk path with less overhead.
_JOBS = JobRow.metadata.tables[JobRow.__tablename__]
_LABELS = JobLabelRow.metadata.tables[JobLabelRow.__tablename__]
_TASKS = TaskRow.metadata.tables[TaskRow.__tablename__]
_EVENTS = JobEventRow.metadata.tables[JobEventRow.__tablename__]
_MESSAGES = JobMessageRow.metadata.tables[JobMessageRow.__tablename__]
# Ids per IN (...) of a read by many ids: below SQLite's limit on parameters.
_IDS_PER_QUERY = 1000
# Where a session keeps the task changes set_task has not written yet.
_TASK_WRITES = "peloton_task_writes"
# Where a write session keeps the ids of the messages it stored, by (job id, text).
_SHARED_MESSAGES = "peloton_shared_messages"
# Where a new attempt has run: nowhere yet.
UNPLACED: Mapping[str, str] = {"host": "", "agent_id": "", "executor_id": ""}
# The columns of an attempt, the same in tasks (the current one) and task_attempts (ended ones).
_ATTEMPT_COLUMNS = (
    "job_id",
    "instance_id",
    "attempt",
    "state",
    "host",
    "agent_id",
    "executor_id",
    "reason",
    "message",
    "message_id",
    "started_at",
    "ended_at",
)

# The transaction the functions here run in: callers (the job manager's unit of work) only pass
# it through, so the type is named here and they need not know what it is.
Tx: TypeAlias = Session


class RequestIdTaken(Exception):
    """:func:`insert_job`: another job already holds the request id (a concurrent request with
    the same id committed first)."""


# ---------------------------------------------------------------------------- conversions


def spec_to_bytes(spec: job_pb2.JobSpec) -> bytes:
    """The stored form of a spec: protobuf binary, deterministic so equal specs compare equal.
    (Parsing it is ~100x faster than protobuf JSON, which ListJobs would pay per job.)"""
    return spec.SerializeToString(deterministic=True)


def spec_from_bytes(data: bytes) -> job_pb2.JobSpec:
    spec = job_pb2.JobSpec()
    spec.ParseFromString(bytes(data))
    return spec


def counts_to_json(counts: Mapping[TaskState, int]) -> str:
    return json.dumps({s.value: n for s, n in sorted(counts.items()) if n > 0})


def counts_of(row: JobRow | Row[Any]) -> dict[TaskState, int]:
    """A job's materialized task-state counts."""
    return {TaskState(s): n for s, n in json.loads(row.task_counts).items()}


def job_record(row: JobRow | Row[Any]) -> JobRecord:
    """The record of a job row, mapped or plain (its task counts come from the row itself)."""
    return JobRecord(
        id=row.id,
        spec=spec_from_bytes(row.spec),
        state=JobState(row.state),
        goal=Goal(row.goal),
        reason=row.reason,
        message=row.message,
        created_at=row.created_at,
        updated_at=row.updated_at,
        version=row.version,
        task_counts=counts_of(row),
        gang_failures=row.gang_failures or 0,
        not_before=row.not_before,
        generation=row.generation or 0,
        gang_size=row.gang_size or 0,
        owner=row.owner,
    )


# The texts of shared messages by id (:func:`message_texts`).
Texts = Mapping[int, str]


def _text(row: TaskRow | TaskAttemptRow | JobEventRow, texts: Texts) -> str:
    """A row's message: its own, or the shared one it names."""
    return row.message if row.message_id is None else texts.get(row.message_id, "")


def _attempt_record(row: TaskRow | TaskAttemptRow, texts: Texts) -> AttemptRecord:
    """The attempt a row holds: a task's current one, or an ended one."""
    return AttemptRecord(
        job_id=row.job_id,
        instance_id=row.instance_id,
        attempt=row.attempt,
        state=TaskState(row.state),
        host=row.host,
        reason=row.reason,
        message=_text(row, texts),
        started_at=row.started_at,
        ended_at=row.ended_at,
        agent_id=row.agent_id,
        executor_id=row.executor_id,
    )


def _task_record(row: TaskRow, texts: Texts, history: Sequence[AttemptRecord] = ()) -> TaskRecord:
    return TaskRecord(
        job_id=row.job_id,
        instance_id=row.instance_id,
        state=TaskState(row.state),
        goal=Goal(row.goal),
        current=_attempt_record(row, texts),
        failures=row.failures,
        version=row.version,
        history=tuple(history),
    )


def _event_record(row: JobEventRow, texts: Texts) -> EventRecord:
    return EventRecord(
        sequence=row.id,
        job_id=row.job_id,
        instance_id=row.instance_id,
        time=row.time,
        from_state=row.from_state,
        to_state=row.to_state,
        reason=row.reason,
        message=_text(row, texts),
        host=row.host,
        attempt_id=row.attempt_id,
    )


# ---------------------------------------------------------------------------- shared messages


def shared_message(session: Session, job_id: str, text: str) -> int:
    """The id of a stored message of ``job_id`` with ``text``, for rows that name it instead of
    holding a copy: stored now, or earlier in this transaction (a kill moves unlaunched and
    running tasks in two statements, one text)."""
    stored: dict[tuple[str, str], int] = session.info.setdefault(_SHARED_MESSAGES, {})
    key = (job_id, text)
    if key not in stored:
        result = session.execute(insert(_MESSAGES).values(job_id=job_id, text=text))
        assert isinstance(result, CursorResult) and result.inserted_primary_key is not None
        stored[key] = int(result.inserted_primary_key[0])
    return stored[key]


def shared_messages(session: Session, messages: Sequence[tuple[str, str]]) -> list[int]:
    """:func:`shared_message` for several ``(job_id, text)`` at once: those not stored yet in
    this transaction go in with one statement."""
    stored: dict[tuple[str, str], int] = session.info.setdefault(_SHARED_MESSAGES, {})
    new = list(dict.fromkeys(m for m in messages if m not in stored))
    if new:
        ids = session.scalars(
            insert(_MESSAGES).returning(_MESSAGES.c.id, sort_by_parameter_order=True),
            [{"job_id": job_id, "text": text} for job_id, text in new],
        )
        stored.update(zip(new, (int(i) for i in ids), strict=True))
    return [stored[m] for m in messages]


def message_texts(session: Session, ids: Iterable[int | None]) -> dict[int, str]:
    """The texts of the shared messages of ``ids`` (None: a row with its own message), in one
    query per thousand distinct ids: a page of tasks or events names a few."""
    wanted = sorted({i for i in ids if i is not None})
    texts: dict[int, str] = {}
    for start in range(0, len(wanted), _IDS_PER_QUERY):
        chunk = wanted[start : start + _IDS_PER_QUERY]
        texts.update(
            (int(i), t)
            for i, t in session.execute(
                select(_MESSAGES.c.id, _MESSAGES.c.text).where(_MESSAGES.c.id.in_(chunk))
            )
        )
    return texts


def task_message(session: Session, row: TaskRow) -> str:
    """The message of a task's current attempt, its own or shared."""
    return _text(row, message_texts(session, [row.message_id]))


def _attempt_id_sql(next_attempt: bool = False) -> Any:
    """SQL for :func:`~peloton.core.records.attempt_id` of a task's current attempt (or of its
    next): '<job_id>-<instance_id>-<attempt>' (|| on every backend)."""
    attempt = TaskRow.attempt + 1 if next_attempt else TaskRow.attempt
    return TaskRow.job_id + "-" + cast(TaskRow.instance_id, String) + "-" + cast(attempt, String)


# ---------------------------------------------------------------------------- jobs


def insert_job(
    session: Session,
    *,
    job_id: str,
    spec: job_pb2.JobSpec,
    request_id: str | None,
    now: datetime,
    task_state: TaskState,
    job_state: JobState,
    owner: str = "",
) -> JobRecord:
    """Write a job (created by ``owner``), its labels, one row per task, and the creation event.

    Returns the job as written, as :func:`get_job` would read it back in this transaction (so
    the caller need not re-read it: the spec goes through the same JSON as the stored one)."""
    spec_data = spec_to_bytes(spec)
    job = {
        "id": job_id,
        "name": spec.name,
        "pool": spec.pool,
        "priority": spec.priority,
        "instances": spec.instances,
        "state": job_state.value,
        "goal": Goal.RUN.value,
        "reason": "",
        "message": "",
        "spec": spec_data,
        "task_counts": counts_to_json({task_state: spec.instances}),
        "request_id": request_id,
        "created_at": now,
        "updated_at": now,
        "version": 1,
        "owner": owner,
    }
    labels = [{"job_id": job_id, "key": k, "value": v} for k, v in spec.labels.items()]
    event = {
        "job_id": job_id,
        "instance_id": None,
        "time": now,
        "from_state": "",
        "to_state": job_state.value,
        "reason": "created",
        "message": f"{spec.instances} tasks in pool {spec.pool}",
        "host": "",
        "attempt_id": "",
    }
    try:
        session.execute(insert(_JOBS), [job])
    except IntegrityError as exc:
        if request_id is None:
            raise
        raise RequestIdTaken(request_id) from exc
    if labels:
        session.execute(insert(_LABELS), labels)
    _insert_tasks(session, job_id, spec.instances, task_state, now)
    session.execute(insert(_EVENTS), [event])
    written = now.astimezone(UTC)  # what the UTCDateTime columns store and give back
    return JobRecord(
        id=job_id,
        spec=spec_from_bytes(spec_data),
        state=job_state,
        goal=Goal.RUN,
        reason="",
        message="",
        created_at=written,
        updated_at=written,
        version=1,
        task_counts={task_state: spec.instances},
        owner=owner,
    )


def _task_row(job_id: str, instance_id: int, state: TaskState, now: datetime) -> dict[str, Any]:
    """The row of a new task: attempt 1, nothing run yet."""
    return {
        "job_id": job_id,
        "instance_id": instance_id,
        "state": state.value,
        "goal": Goal.RUN.value,
        "attempt": 1,
        **UNPLACED,
        "reason": "",
        "message": "",
        "failures": 0,
        "updated_at": now,
        "version": 1,
    }


def _insert_tasks(
    session: Session, job_id: str, instances: int, state: TaskState, now: datetime
) -> None:
    """One new task row per instance id 0..instances-1, made by the database with one INSERT ...
    SELECT over a generated series: no per-row work in the interpreter (sent rows cost it
    ~40 us each, a third of CreateJob), no huge statements (100,000 tasks in about a second)."""
    table = _TASKS
    values = _task_row(job_id, 0, state, now)
    del values["instance_id"]  # made by the database below
    # WITH RECURSIVE: portable to SQLite, which has no generate_series.
    ids = select(literal(0).label("i")).cte("instance_ids", recursive=True)
    ids = ids.union_all(select((ids.c.i + 1).label("i")).where(ids.c.i < instances - 1))
    session.execute(
        insert(table).from_select(
            [*values, "instance_id"],
            select(*(literal(v, table.c[k].type) for k, v in values.items()), ids.c.i),
        )
    )


def job_id_for_request(session: Session, request_id: str) -> str | None:
    return session.scalar(select(JobRow.id).where(JobRow.request_id == request_id))


def lock_job(session: Session, job_id: str) -> JobRow | None:
    """Read a job for change. On PostgreSQL the row stays locked until the transaction ends, so
    writers of one job queue up; SQLite write transactions are already exclusive."""
    return session.scalar(_LOCK_JOB, {"job_id": job_id})


def lock_jobs(session: Session, job_ids: Iterable[str]) -> dict[str, JobRow]:
    """:func:`lock_job` for several jobs in one statement (locked in id order, as every writer
    of several jobs does: no deadlock); a job that does not exist is left out."""
    rows = session.scalars(_LOCK_JOBS, {"job_ids": sorted(set(job_ids))})
    return {row.id: row for row in rows}


def tasks_in(
    session: Session, job_ids: Iterable[str], state: TaskState
) -> dict[str, list[tuple[int, int, str]]]:
    """``(instance id, attempt, host)`` of the jobs' tasks in ``state``, by job, lowest
    instance id first."""
    out: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    rows = session.execute(_TASKS_IN, {"job_ids": sorted(set(job_ids)), "state": state.value})
    for job_id, instance_id, attempt, host in rows:
        out[job_id].append((int(instance_id), int(attempt), host))
    return out


def change_tasks(session: Session, tasks: Iterable[tuple[str, int]], **values: Any) -> None:
    """:func:`set_task` for tasks, ``(job_id, instance_id)``, this session has not loaded (a
    loaded one would keep its old values): written with the session's next statement, each
    changed set of columns in one statement."""
    pending: dict[tuple[str, int], _TaskWrite] = session.info.setdefault(_TASK_WRITES, {})
    for key in tasks:
        write = pending.setdefault(key, _TaskWrite())
        write.values.update(values)
        write.bumps += 1


# Statements run for every job change, built once: building and keying one costs more than
# running it.
_LOCK_JOB = select(JobRow).where(JobRow.id == bindparam("job_id")).with_for_update()
_LOCK_JOBS = (
    select(JobRow)
    .where(JobRow.id.in_(bindparam("job_ids", expanding=True)))
    .order_by(JobRow.id)
    .with_for_update()
)
_TASKS_IN = (
    select(TaskRow.job_id, TaskRow.instance_id, TaskRow.attempt, TaskRow.host)
    .where(
        TaskRow.job_id.in_(bindparam("job_ids", expanding=True)),
        TaskRow.state == bindparam("state"),
    )
    .order_by(TaskRow.job_id, TaskRow.instance_id)
)
# What the record of a task's progress needs of its row (see jobmgr TaskUpdates.record_progress).
PROGRESS_COLUMNS = tuple(
    c for c in _ATTEMPT_COLUMNS if c not in ("job_id", "instance_id", "ended_at")
)
_TASKS_OF = select(
    TaskRow.job_id, TaskRow.instance_id, *(getattr(TaskRow, c) for c in PROGRESS_COLUMNS)
).where(TaskRow.job_id.in_(bindparam("job_ids", expanding=True)))
_TASK_ROWS = select(TaskRow).where(
    TaskRow.job_id == bindparam("job_id"),
    TaskRow.instance_id.in_(bindparam("instance_ids", expanding=True)),
)


def get_job(session: Session, job_id: str) -> JobRecord | None:
    row = session.get(JobRow, job_id)
    if row is None:
        return None
    return job_record(row)


def get_jobs(session: Session, job_ids: Iterable[str]) -> list[JobRecord]:
    """The records of the jobs of ``job_ids`` that exist. Plain rows, not ORM objects: the
    resource manager re-reads every changed job each cycle, and loading them into the session
    cost three times the query."""
    ids = sorted(set(job_ids))
    return [
        job_record(row)
        for i in range(0, len(ids), _IDS_PER_QUERY)
        for row in session.execute(select(_JOBS).where(_JOBS.c.id.in_(ids[i : i + _IDS_PER_QUERY])))
    ]


def job_exists(session: Session, job_id: str) -> bool:
    return session.get(JobRow, job_id) is not None


def note_job(row: JobRow, **values: Any) -> None:
    """Change a locked job row without bumping its version: not a change of its state or spec
    (its task counts, why it waits, its restart bookkeeping). Written with the transaction."""
    for key, value in values.items():
        setattr(row, key, value)


def update_job(session: Session, row: JobRow, *, flush: bool = True, **values: Any) -> None:
    """Change a locked job row and bump its version; written at once, or with the session's
    next flush (``flush=False``: several jobs' changes in one statement)."""
    for key, value in values.items():
        setattr(row, key, value)
    row.version += 1
    if flush:
        session.flush()


def delete_job(session: Session, job_id: str) -> None:
    # Children first: correct even where the database does not enforce ON DELETE CASCADE.
    # Shared messages after the rows that name them.
    for model in (JobEventRow, TaskAttemptRow, TaskRow, JobMessageRow, JobLabelRow):
        session.execute(delete(model).where(model.job_id == job_id))
    session.execute(delete(JobRow).where(JobRow.id == job_id))


def unfinished_jobs(session: Session) -> list[JobRecord]:
    """Every job that has not ended, oldest first."""
    rows = session.scalars(
        select(JobRow)
        .where(JobRow.state.not_in(sorted(s.value for s in JOB_TERMINAL)))
        .order_by(JobRow.created_at, JobRow.id)
    )
    return [job_record(row) for row in rows]


def expired_jobs(session: Session, now: datetime) -> list[tuple[str, int]]:
    """(id, max_runtime_seconds) of every unfinished job past its deadline and not yet being
    killed."""
    rows = session.execute(
        select(JobRow.id, JobRow.spec).where(
            JobRow.deadline_at <= now,
            JobRow.goal != Goal.KILL.value,
            JobRow.state.not_in(sorted(s.value for s in JOB_TERMINAL)),
        )
    )
    return [(job_id, spec_from_bytes(spec).max_runtime_seconds) for job_id, spec in rows]


def instances_in(
    session: Session, job_id: str, states: Iterable[TaskState], limit: int
) -> tuple[int, ...]:
    """The ``limit`` lowest instance ids of a job's tasks in ``states``."""
    rows = session.scalars(
        select(TaskRow.instance_id)
        .where(TaskRow.job_id == job_id, TaskRow.state.in_(sorted(s.value for s in states)))
        .order_by(TaskRow.instance_id)
        .limit(limit)
    )
    return tuple(rows)


def attempts_in(session: Session, job_id: str, states: Iterable[TaskState]) -> dict[int, int]:
    """The current attempt of each of a job's tasks in ``states``, by instance id."""
    rows = session.execute(
        select(TaskRow.instance_id, TaskRow.attempt).where(
            TaskRow.job_id == job_id, TaskRow.state.in_(sorted(s.value for s in states))
        )
    )
    return {int(i): int(a) for i, a in rows}


def jobs_with_tasks_in(session: Session, states: Iterable[TaskState]) -> list[str]:
    rows = session.scalars(
        select(TaskRow.job_id)
        .where(TaskRow.state.in_(sorted(s.value for s in states)))
        .distinct()
        .order_by(TaskRow.job_id)
    )
    return list(rows)


def count_jobs_by_state(session: Session) -> dict[str, int]:
    return {
        s: n for s, n in session.execute(select(JobRow.state, func.count()).group_by(JobRow.state))
    }


def count_tasks_by_state(session: Session) -> dict[str, int]:
    return {
        s: n
        for s, n in session.execute(select(TaskRow.state, func.count()).group_by(TaskRow.state))
    }


# ---------------------------------------------------------------------------- listing jobs


def encode_token(values: Sequence[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(values)).encode()).decode()


def decode_token(token: str, field: str = "page_token") -> list[Any]:
    try:
        values = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(field, "is not a token returned by this server") from exc
    if not isinstance(values, list):
        raise InvalidArgument(field, "is not a token returned by this server")
    return values


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def list_jobs(
    session: Session, flt: JobFilter, page_size: int, page_token: str
) -> tuple[list[JobRecord], str]:
    """Jobs newest first, keyset-paged on (created_at, id)."""
    query = select(JobRow)
    if flt.states:
        query = query.where(JobRow.state.in_(sorted(s.value for s in flt.states)))
    if flt.pool:
        query = query.where(JobRow.pool == flt.pool)
    if flt.pools is not None:
        if not flt.pools:
            return [], ""  # the caller may view no pool
        # In the query, so that a page holds page_size jobs the caller may see (the index on
        # (pool, created_at, id) serves it).
        query = query.where(JobRow.pool.in_(sorted(flt.pools)))
    if flt.name_prefix:
        # LIKE is case-insensitive on SQLite; the substr test keeps the match exact everywhere.
        query = query.where(
            JobRow.name.like(_escape_like(flt.name_prefix) + "%", escape="\\"),
            func.substr(JobRow.name, 1, len(flt.name_prefix)) == flt.name_prefix,
        )
    if flt.labels:
        query = query.where(JobRow.id.in_(_jobs_with_labels(flt.labels)))
    if page_token:
        created_iso, last_id = _job_cursor(page_token)
        created = datetime.fromisoformat(created_iso)
        query = query.where(
            or_(
                JobRow.created_at < created,
                and_(JobRow.created_at == created, JobRow.id < last_id),
            )
        )
    rows = list(
        session.scalars(
            query.order_by(JobRow.created_at.desc(), JobRow.id.desc()).limit(page_size + 1)
        )
    )
    more = len(rows) > page_size
    rows = rows[:page_size]
    jobs = [job_record(r) for r in rows]
    token = encode_token([rows[-1].created_at.isoformat(), rows[-1].id]) if more else ""
    return jobs, token


def _jobs_with_labels(labels: Mapping[str, str]) -> Select[str]:
    """The ids of jobs that carry every one of ``labels``, as one grouped scan of the matching
    label rows: a job has each key once, so matching all is matching as many rows as labels.
    (One EXISTS per label made the planner's work grow steeply: 200 labels took 36 s.)"""
    pairs = sorted(labels.items())
    return (
        select(JobLabelRow.job_id)
        .where(tuple_(JobLabelRow.key, JobLabelRow.value).in_(pairs))
        .group_by(JobLabelRow.job_id)
        .having(func.count() == len(pairs))
    )


def _job_cursor(token: str) -> tuple[str, str]:
    values = decode_token(token)
    if len(values) != 2 or not all(isinstance(v, str) for v in values):
        raise InvalidArgument("page_token", "is not a token returned by this server")
    try:
        created = datetime.fromisoformat(values[0])
    except ValueError as exc:
        raise InvalidArgument("page_token", "is not a token returned by this server") from exc
    if created.tzinfo is None:
        # Tokens carry UTC times; a naive one was not made here (and cannot be compared).
        raise InvalidArgument("page_token", "is not a token returned by this server")
    return values[0], values[1]


# ---------------------------------------------------------------------------- tasks


def get_task_row(session: Session, job_id: str, instance_id: int) -> TaskRow | None:
    return session.get(TaskRow, (job_id, instance_id))


def task_values(session: Session, job_ids: Iterable[str]) -> dict[tuple[str, int], dict[str, Any]]:
    """The :data:`PROGRESS_COLUMNS` of every task of the jobs, by (job id, instance id): plain
    values in one statement, where loading the tasks as rows cost most of a status update."""
    rows = session.execute(_TASKS_OF, {"job_ids": sorted(set(job_ids))})
    return {
        (job_id, int(instance_id)): dict(zip(PROGRESS_COLUMNS, values, strict=True))
        for job_id, instance_id, *values in rows
    }


def task_rows(session: Session, job_id: str, instance_ids: Iterable[int]) -> dict[int, TaskRow]:
    ids = sorted(set(instance_ids))
    rows = session.scalars(_TASK_ROWS, {"job_id": job_id, "instance_ids": ids})
    return {r.instance_id: r for r in rows}


def first_failed_task(session: Session, job_id: str) -> TaskRow | None:
    """The job's FAILED or LOST task that ended first (the lowest instance id on a tie)."""
    first = session.scalar(
        select(TaskRow.instance_id)
        .where(
            TaskRow.job_id == job_id,
            TaskRow.state.in_([TaskState.FAILED.value, TaskState.LOST.value]),
        )
        .order_by(TaskRow.ended_at, TaskRow.instance_id)
        .limit(1)
    )
    if first is None:
        return None
    return session.get(TaskRow, (job_id, first))


def history(
    session: Session, job_id: str, instance_ids: Sequence[int]
) -> dict[int, list[AttemptRecord]]:
    """Ended attempts of the given tasks, oldest first."""
    out: dict[int, list[AttemptRecord]] = defaultdict(list)
    if not instance_ids:
        return out
    rows = list(
        session.scalars(
            select(TaskAttemptRow)
            .where(TaskAttemptRow.job_id == job_id, TaskAttemptRow.instance_id.in_(instance_ids))
            .order_by(TaskAttemptRow.instance_id, TaskAttemptRow.attempt)
        )
    )
    texts = message_texts(session, (r.message_id for r in rows))
    for r in rows:
        out[r.instance_id].append(_attempt_record(r, texts))
    return out


def task_record(session: Session, row: TaskRow) -> TaskRecord:
    return _task_record(
        row,
        message_texts(session, [row.message_id]),
        history(session, row.job_id, [row.instance_id]).get(row.instance_id, []),
    )


def list_tasks(
    session: Session,
    job_id: str,
    states: frozenset[TaskState],
    page_size: int,
    page_token: str,
) -> tuple[list[TaskRecord], str]:
    """Tasks by instance id, with their attempt history, keyset-paged on instance id."""
    query = select(TaskRow).where(TaskRow.job_id == job_id)
    if states:
        query = query.where(TaskRow.state.in_(sorted(s.value for s in states)))
    if page_token:
        values = decode_token(page_token)
        if len(values) != 1 or not isinstance(values[0], int):
            raise InvalidArgument("page_token", "is not a token returned by this server")
        query = query.where(TaskRow.instance_id > values[0])
    rows = list(session.scalars(query.order_by(TaskRow.instance_id).limit(page_size + 1)))
    more = len(rows) > page_size
    rows = rows[:page_size]
    past = history(session, job_id, [r.instance_id for r in rows])
    texts = message_texts(session, (r.message_id for r in rows))
    tasks = [_task_record(r, texts, past.get(r.instance_id, [])) for r in rows]
    return tasks, encode_token([rows[-1].instance_id]) if more else ""


def set_task(session: Session, row: TaskRow, **values: Any) -> None:
    """Change a task and bump its version.

    The row object changes at once; the database gets the change before the session's next
    statement or its commit (so every statement sees it), written set-based: tasks changed
    meanwhile that end up with the same values share one UPDATE. A gang's tasks moving through
    several states on one host are then one statement, where the ORM's flush wrote each task
    and each state (on psycopg2, one round trip per row)."""
    if "message" in values and "message_id" not in values:
        values = {**values, "message_id": None}  # its own message replaces a shared one
    pending: dict[tuple[str, int], _TaskWrite] = session.info.setdefault(_TASK_WRITES, {})
    write = pending.setdefault((row.job_id, row.instance_id), _TaskWrite())
    state = vars(row)
    # A value the row already has needs no writing (a status update repeats the host), and
    # leaving it out lets tasks that differ only there share a statement.
    write.values.update(
        (k, v) for k, v in values.items() if k in write.values or k not in state or state[k] != v
    )
    write.bumps += 1
    # Straight into the loaded instance's state, as set_committed_value would put it (no
    # history: the ORM has nothing to flush) at a tenth of its cost; rows come loaded.
    state.update(values)
    state["version"] = row.version + 1


class _TaskWrite:
    """What one transaction changed of one task: the final values, and how many changes."""

    __slots__ = ("bumps", "values")

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.bumps = 0


def _write_tasks(session: Session) -> None:
    """Write the task changes :func:`set_task` recorded, one UPDATE per job and set of values."""
    pending: dict[tuple[str, int], _TaskWrite] | None = session.info.pop(_TASK_WRITES, None)
    if not pending:
        return
    if session.get_bind().dialect.driver == "psycopg2":
        _write_tasks_from_values(session, pending)
        return
    groups: dict[tuple[str, int, tuple[tuple[str, Any], ...]], list[int]] = defaultdict(list)
    for (job_id, instance_id), write in pending.items():
        groups[(job_id, write.bumps, tuple(sorted(write.values.items())))].append(instance_id)
    # On the connection: a statement through the session would come back here.
    conn = session.connection()
    for (job_id, bumps, values), instances in groups.items():
        params = {f"v_{k}": v for k, v in values}
        conn.execute(
            _task_update(tuple(k for k, _ in values)),
            {**params, "b_job_id": job_id, "b_instances": instances, "b_bumps": bumps},
        )


def _write_tasks_from_values(
    session: Session, pending: Mapping[tuple[str, int], _TaskWrite]
) -> None:
    """:func:`_write_tasks` on PostgreSQL: one UPDATE per set of columns changed, whatever the
    values (a launch gives every task its own attempt id and host, which grouped by values was
    a statement per task), the rows shipped as :func:`_json_rows`."""
    groups: dict[tuple[str, ...], list[tuple[Any, ...]]] = defaultdict(list)
    for (job_id, instance_id), write in pending.items():
        columns = tuple(sorted(write.values))
        row = (job_id, instance_id, write.bumps, *(write.values[c] for c in columns))
        groups[columns].append(row)
    cursor = session.connection().connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        for columns, rows in groups.items():
            cursor.execute(_tasks_from_rows(columns), (_json_rows(rows),))
    finally:
        cursor.close()


def _json_rows(rows: Sequence[Sequence[Any]]) -> str:
    """``rows`` as one JSON array of arrays, for a statement that unpacks it with
    :func:`_json_columns`. The driver renders a parameter value by value (~2 us each, most of
    the launch path's CPU when a multi-row VALUES carried the events and task changes), while
    this is one string built in C (~0.1 us a value). A transaction's rows mostly share one
    time, converted once."""
    times: dict[datetime, str] = {}

    def json_value(value: Any) -> str:
        if not isinstance(value, datetime):
            raise TypeError(f"no JSON form for a {type(value).__name__} in a row")
        text = times.get(value)
        if text is None:
            text = times[value] = value.astimezone(UTC).isoformat()
        return text

    # orjson: ~5x the json module's speed here; its own datetime form is left unused (a naive
    # time would go without an offset).
    return orjson.dumps(rows, default=json_value, option=orjson.OPT_PASSTHROUGH_DATETIME).decode()


def _json_columns(columns: Sequence[tuple[str, TypeEngine[Any]]]) -> str:
    """A SELECT of ``columns`` (name, type) from the rows of one :func:`_json_rows` parameter:
    the i-th value of a row is column i, cast to its type."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    items = [
        f"(r->>{i})::{type_.compile(dialect=dialect)} AS {name}"
        for i, (name, type_) in enumerate(columns)
    ]
    return f"SELECT {', '.join(items)} FROM json_array_elements(%s::json) AS x(r)"


def _typed(table: Table, columns: Sequence[str]) -> list[tuple[str, TypeEngine[Any]]]:
    return [(c, table.c[c].type) for c in columns]


@functools.cache
def _tasks_from_rows(columns: tuple[str, ...]) -> str:
    """The UPDATE of :func:`_write_tasks_from_values` for ``columns`` (each value cast to its
    column's type; ``bumps`` is how many versions the task moves on)."""
    sets = [f"{c} = v.{c}" for c in columns]
    key = _typed(_TASKS, ("job_id", "instance_id"))
    rows = _json_columns([*key, ("bumps", Integer()), *_typed(_TASKS, columns)])
    return (
        f"UPDATE {_TASKS.name} AS t SET {', '.join(sets)}, version = t.version + v.bumps "
        f"FROM ({rows}) AS v WHERE t.job_id = v.job_id AND t.instance_id = v.instance_id"
    )


@functools.cache
def _task_update(columns: tuple[str, ...]) -> Update:
    """UPDATE of ``columns`` of a job's tasks, built once per set of columns (building and
    keying a statement costs more than running it)."""
    return (
        update(_TASKS)
        .where(
            _TASKS.c.job_id == bindparam("b_job_id"),
            _TASKS.c.instance_id.in_(bindparam("b_instances", expanding=True)),
        )
        .values(
            {
                **{c: bindparam(f"v_{c}", type_=_TASKS.c[c].type) for c in columns},
                "version": _TASKS.c.version + bindparam("b_bumps"),
            }
        )
    )


@event.listens_for(Session, "do_orm_execute")
def _before_statement(state: ORMExecuteState) -> None:
    _write_tasks(state.session)


@event.listens_for(Session, "before_commit")
def _before_commit(session: Session) -> None:
    _write_tasks(session)


@event.listens_for(Session, "after_rollback")
def _after_rollback(session: Session) -> None:
    session.info.pop(_TASK_WRITES, None)
    session.info.pop(_SHARED_MESSAGES, None)


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    session.info.pop(_SHARED_MESSAGES, None)


def archive_attempt(session: Session, row: TaskRow) -> None:
    """Copy a task's ended attempt to the history before it starts a new one."""
    session.add(TaskAttemptRow(**{c: getattr(row, c) for c in _ATTEMPT_COLUMNS}))


def _moved_by_state(session: Session, where: Any) -> dict[TaskState, int]:
    """How many of the tasks matching ``where`` are in each state (before a bulk move)."""
    rows = session.execute(select(TaskRow.state, func.count()).where(where).group_by(TaskRow.state))
    return {TaskState(state): n for state, n in rows}


def _insert_task_events(
    session: Session,
    where: Any,
    *,
    to_state: TaskState,
    now: datetime,
    reason: str,
    message: str,
    message_id: int | None,
    host: Any,
    attempt: Any,
) -> None:
    """One event per task matching ``where``, from its current state to ``to_state``."""
    session.execute(
        insert(JobEventRow).from_select(
            [
                "job_id",
                "instance_id",
                "time",
                "from_state",
                "to_state",
                "reason",
                "message",
                "message_id",
                "host",
                "attempt_id",
            ],
            select(
                TaskRow.job_id,
                TaskRow.instance_id,
                literal(now, JobEventRow.time.type),
                TaskRow.state,
                literal(to_state.value),
                literal(reason),
                literal(message),
                literal(message_id, JobEventRow.message_id.type),
                host,
                attempt,
            ).where(where),
        )
    )


def _message_of_many(
    session: Session, job_id: str, message: str, moved: Mapping[TaskState, int]
) -> tuple[str, int | None]:
    """(message, message_id) for the rows of the tasks in ``moved``: a text that more than one
    task gets is stored once and named; a single task holds its own."""
    if not message or sum(moved.values()) < 2:
        return message, None
    return "", shared_message(session, job_id, message)


def _moving(
    session: Session,
    job_id: str,
    from_states: Iterable[TaskState],
    instances: Sequence[int] | None,
) -> tuple[Any, dict[TaskState, int]]:
    """The condition selecting a job's tasks in ``from_states`` (and, if given, in
    ``instances``), and how many tasks it selects in each state."""
    sources = sorted(s.value for s in from_states)
    where = and_(TaskRow.job_id == job_id, TaskRow.state.in_(sources))
    if instances is not None:
        where = and_(where, TaskRow.instance_id.in_(list(instances)))
    return where, _moved_by_state(session, where)


def bulk_transition(
    session: Session,
    job_id: str,
    from_states: Iterable[TaskState],
    to_state: TaskState,
    *,
    now: datetime,
    reason: str,
    message: str,
    goal: Goal,
    ended: bool,
    instances: Sequence[int] | None = None,
) -> dict[TaskState, int]:
    """Move every task of a job in ``from_states`` (and, if given, in ``instances``) to
    ``to_state``, with one event per task.

    Returns how many tasks left each state. The caller holds the job lock, so the set of tasks
    cannot change between the statements.
    """
    where, moved = _moving(session, job_id, from_states, instances)
    if not moved:
        return moved
    message, message_id = _message_of_many(session, job_id, message, moved)
    _insert_task_events(
        session,
        where,
        to_state=to_state,
        now=now,
        reason=reason,
        message=message,
        message_id=message_id,
        host=TaskRow.host,
        attempt=_attempt_id_sql(),
    )
    values: dict[str, Any] = {
        "state": to_state.value,
        "goal": goal.value,
        "reason": reason,
        "message": message,
        "message_id": message_id,
        "updated_at": now,
        "version": TaskRow.version + 1,
    }
    if ended:
        values["ended_at"] = now
    session.execute(update(TaskRow).where(where).values(**values))
    return moved


def set_goal(
    session: Session, job_id: str, states: Iterable[TaskState], goal: Goal, *, now: datetime
) -> int:
    """Change the goal of every task of a job in ``states`` without changing their state."""
    where = and_(TaskRow.job_id == job_id, TaskRow.state.in_(sorted(s.value for s in states)))
    result = session.execute(
        update(TaskRow)
        .where(where, TaskRow.goal != goal.value)
        .values(goal=goal.value, updated_at=now, version=TaskRow.version + 1)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def bulk_new_attempt(
    session: Session,
    job_id: str,
    from_states: Iterable[TaskState],
    *,
    now: datetime,
    reason: str,
    message: str,
    reset_failures: bool,
    instances: Sequence[int] | None = None,
) -> dict[TaskState, int]:
    """Start a new attempt, PENDING, for every task of a job in the (ended) ``from_states``
    (and, if given, in ``instances``).

    Returns how many tasks left each state.
    """
    where, moved = _moving(session, job_id, from_states, instances)
    if not moved:
        return moved
    message, message_id = _message_of_many(session, job_id, message, moved)
    session.execute(
        insert(TaskAttemptRow).from_select(
            list(_ATTEMPT_COLUMNS), select(*(_TASKS.c[c] for c in _ATTEMPT_COLUMNS)).where(where)
        )
    )
    _insert_task_events(
        session,
        where,
        to_state=TaskState.PENDING,
        now=now,
        reason=reason,
        message=message,
        message_id=message_id,
        host=literal(""),
        attempt=_attempt_id_sql(next_attempt=True),
    )
    values: dict[str, Any] = {
        "state": TaskState.PENDING.value,
        "goal": Goal.RUN.value,
        "attempt": TaskRow.attempt + 1,
        **UNPLACED,
        "reason": reason,
        "message": message,
        "message_id": message_id,
        "started_at": None,
        "ended_at": None,
        "updated_at": now,
        "version": TaskRow.version + 1,
    }
    if reset_failures:
        values["failures"] = 0
    session.execute(update(TaskRow).where(where).values(**values))
    return moved


# ---------------------------------------------------------------------------- events


_EVENT_DEFAULTS: Mapping[str, Any] = {
    "reason": "",
    "message": "",
    "message_id": None,
    "host": "",
    "attempt_id": "",
}
_EVENT_COLUMNS = ("job_id", "instance_id", "time", "from_state", "to_state", *_EVENT_DEFAULTS)
_EVENTS_FROM_ROWS = f"INSERT INTO {_EVENTS.name} ({', '.join(_EVENT_COLUMNS)}) " + _json_columns(
    _typed(_EVENTS, _EVENT_COLUMNS)
)


def task_event(
    job_id: str,
    instance_id: int,
    attempt: int,
    time: datetime,
    src: TaskState,
    dst: TaskState,
    *,
    reason: str,
    message: str,
    host: str,
    message_id: int | None = None,
) -> dict[str, Any]:
    """The row :func:`insert_events` takes for a change of one task's attempt (``message_id``
    names a shared message; ``message`` is then "")."""
    return {
        "job_id": job_id,
        "instance_id": instance_id,
        "time": time,
        "from_state": src.value,
        "to_state": dst.value,
        "reason": reason,
        "message": message,
        "message_id": message_id,
        "host": host,
        "attempt_id": attempt_id(job_id, instance_id, attempt),
    }


def insert_events(session: Session, events: Sequence[Mapping[str, Any]]) -> None:
    """Append ``events`` (each: the columns of ``job_events`` but its id; reason, message,
    message_id, host and attempt_id may be left out) to the history."""
    if not events:
        return
    if session.get_bind().dialect.driver != "psycopg2":
        session.execute(insert(_EVENTS), [{**_EVENT_DEFAULTS, **e} for e in events])
        return
    # The history's bulk (six events per task) as one parameter (see _json_rows): SQLAlchemy's
    # own render of a multi-row INSERT costs its interpreter ~40 us a row.
    _write_tasks(session)  # what SQLAlchemy would flush before any statement of the session
    rows = [tuple(e[c] if c in e else _EVENT_DEFAULTS[c] for c in _EVENT_COLUMNS) for e in events]
    cursor = session.connection().connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(_EVENTS_FROM_ROWS, (_json_rows(rows),))
    finally:
        cursor.close()


def events(
    session: Session,
    job_id: str,
    *,
    after: int = 0,
    instance_id: int | None = None,
    limit: int = 1000,
) -> list[EventRecord]:
    query = select(JobEventRow).where(JobEventRow.job_id == job_id, JobEventRow.id > after)
    if instance_id is not None:
        query = query.where(JobEventRow.instance_id == instance_id)
    rows = list(session.scalars(query.order_by(JobEventRow.id).limit(limit)))
    texts = message_texts(session, (r.message_id for r in rows))
    return [_event_record(r, texts) for r in rows]


def newest_task_events(
    session: Session, job_id: str, instance_id: int, limit: int
) -> tuple[list[EventRecord], int]:
    """The newest ``limit`` events of a task, oldest first, and how many older ones there are
    besides."""
    where = and_(JobEventRow.job_id == job_id, JobEventRow.instance_id == instance_id)
    rows = list(
        session.scalars(
            select(JobEventRow).where(where).order_by(JobEventRow.id.desc()).limit(limit)
        )
    )
    rows.reverse()
    older = 0
    if len(rows) == limit:
        older = int(
            session.scalar(
                select(func.count())
                .select_from(JobEventRow)
                .where(where, JobEventRow.id < rows[0].id)
            )
            or 0
        )
    texts = message_texts(session, (r.message_id for r in rows))
    return [_event_record(r, texts) for r in rows], older


def jobs_with_events_after(session: Session, after: int) -> dict[str, int]:
    """The jobs with events newer than ``after``, each with its newest event's sequence: one
    query however many jobs are watched."""
    rows = session.execute(
        select(JobEventRow.job_id, func.max(JobEventRow.id))
        .where(JobEventRow.id > after)
        .group_by(JobEventRow.job_id)
    ).all()
    return {job_id: int(newest) for job_id, newest in rows}


def newest_event(session: Session) -> int:
    """The sequence of the newest event of any job (0: none)."""
    return session.scalar(select(func.coalesce(func.max(JobEventRow.id), 0))) or 0
