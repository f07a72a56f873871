"""SQLAlchemy 2.0 typed models: the database is the source of truth for jobs and tasks.

Design notes:
- A task row holds its *current* attempt; earlier attempts move to ``task_attempts`` when a new
  one starts, so creating a 100,000-task job writes one row per task and nothing more.
- ``job_events`` is append-only: every state change writes one row in the same transaction.
- ``version`` columns give optimistic concurrency: every UPDATE names the version it read.
- A message that many tasks share (a KillJob's, a restart's, a preemption's) is stored once, in
  ``job_messages``; the task rows, ended attempts and events it applies to name it by
  ``message_id`` and leave their own ``message`` empty. Reads resolve the ids of a page in one
  query (``peloton.storage.jobs``), so the API shows each its text as if it held it.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Stable constraint names so Alembic migrations are the same on SQLite and PostgreSQL.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend (SQLite stores naive text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# SQLite autoincrements only an INTEGER PRIMARY KEY; PostgreSQL gets a 64-bit identity.
EventId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    pool: Mapped[str] = mapped_column(String(512))
    priority: Mapped[int] = mapped_column(Integer)
    instances: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    goal: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    # The full spec, a serialized peloton.v1.JobSpec (`peloton job get ID -o yaml` shows it).
    spec: Mapped[bytes] = mapped_column(LargeBinary)
    # How many tasks are in each state, as JSON {"PENDING": 4}: kept in step with the tasks in
    # every transaction that changes them (under the job lock), so reading a job or deriving its
    # state never scans its tasks.
    task_counts: Mapped[str] = mapped_column(Text)
    request_id: Mapped[str | None] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    version: Mapped[int] = mapped_column(Integer)
    # Failures of the job's gang so far (restart.max_failures bounds them); reset by RestartJob.
    gang_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # A restarted gang's new attempts wait until then (restart.backoff_seconds).
    not_before: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # When the job must be stopped (first start + max_runtime_seconds); None: no limit.
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # Elastic gangs: the generation of the gang's membership and the number of ranks in it
    # (0 and 0 until the first generation forms, and for fixed gangs).
    generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    gang_size: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Who created the job (the caller's name; "" on a daemon without authentication): it may
    # kill, restart and delete the job with submit on its pool.
    owner: Mapped[str] = mapped_column(String(255), default="", server_default="")

    __table_args__ = (
        Index("ix_jobs_created", "created_at", "id"),
        Index("ix_jobs_state_created", "state", "created_at", "id"),
        Index("ix_jobs_pool_created", "pool", "created_at", "id"),
        Index("ix_jobs_name", "name"),
        Index("ix_jobs_deadline", "deadline_at"),
    )


class JobLabelRow(Base):
    __tablename__ = "job_labels"

    job_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(63), primary_key=True)
    value: Mapped[str] = mapped_column(String(255))

    __table_args__ = (Index("ix_job_labels_key_value", "key", "value"),)


class TaskRow(Base):
    __tablename__ = "tasks"

    job_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    instance_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    goal: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(255), default="")
    # The Mesos agent and executor the attempt was launched on: they name its sandbox, read by
    # `peloton task logs` (after it ended too, and by a daemon started after that).
    agent_id: Mapped[str] = mapped_column(String(255), default="", server_default="")
    executor_id: Mapped[str] = mapped_column(String(255), default="", server_default="")
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    # Set: the message is job_messages' row of that id (``message`` is then "").
    message_id: Mapped[int | None] = mapped_column(EventId, nullable=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    version: Mapped[int] = mapped_column(Integer)

    __table_args__ = (Index("ix_tasks_job_state", "job_id", "state"),)


class TaskAttemptRow(Base):
    """An attempt that has ended and been replaced by a newer one."""

    __tablename__ = "task_attempts"

    job_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    instance_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    host: Mapped[str] = mapped_column(String(255), default="")
    # As in TaskRow: where the attempt's sandbox is.
    agent_id: Mapped[str] = mapped_column(String(255), default="", server_default="")
    executor_id: Mapped[str] = mapped_column(String(255), default="", server_default="")
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    # Set: the message is job_messages' row of that id (``message`` is then "").
    message_id: Mapped[int | None] = mapped_column(EventId, nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class JobEventRow(Base):
    """Append-only history of every job and task state change."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(EventId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    # NULL for job-level events.
    instance_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    time: Mapped[datetime] = mapped_column(UTCDateTime)
    from_state: Mapped[str] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    # Set: the message is job_messages' row of that id (``message`` is then "").
    message_id: Mapped[int | None] = mapped_column(EventId, nullable=True)
    host: Mapped[str] = mapped_column(String(255), default="")
    attempt_id: Mapped[str] = mapped_column(String(64), default="")

    __table_args__ = (Index("ix_job_events_job_instance", "job_id", "instance_id", "id"),)


class JobMessageRow(Base):
    """A message that many of a job's tasks share, stored once: a job-wide action's (KillJob,
    RestartJob, a preemption, a gang restart) instead of a copy in every task row and event.

    Referenced by ``message_id`` of tasks, task_attempts and job_events, with no foreign key:
    PostgreSQL would check every reference of a deleted row by scanning those tables (the
    references are not indexed). The rows go with their job (ON DELETE CASCADE, or
    ``delete_job``), after the rows that name them.
    """

    __tablename__ = "job_messages"

    id: Mapped[int] = mapped_column(EventId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    text: Mapped[str] = mapped_column(Text)


class PoolRow(Base):
    """A resource pool's configuration (the root / is implicit: the cluster)."""

    __tablename__ = "pools"

    path: Mapped[str] = mapped_column(String(512), primary_key=True)
    owner: Mapped[str] = mapped_column(String(128), default="")
    # Per-kind settings and the queue policy, as JSON (see peloton.storage.pools).
    config: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class HostRow(Base):
    """A Mesos agent peloton has seen: its estimated total, attributes and drain state."""

    __tablename__ = "hosts"

    # Mesos registers several agents under one hostname: the agent id is the key.
    agent_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255), index=True)
    # UP, DRAINING or DOWN (peloton.core.hosts.HostState).
    state: Mapped[str] = mapped_column(String(16))
    cpu: Mapped[float] = mapped_column(Float)
    mem_mb: Mapped[float] = mapped_column(Float)
    disk_mb: Mapped[float] = mapped_column(Float)
    gpu: Mapped[float] = mapped_column(Float)
    # Attributes (rack, gpu_model…) as a JSON object of strings.
    attributes: Mapped[str] = mapped_column(Text)
    # The agent's HTTP address host:port (sandbox files are read there).
    address: Mapped[str] = mapped_column(String(255))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class FrameworkRow(Base):
    """The Mesos framework id peloton subscribed with, reused on every resubscription."""

    __tablename__ = "frameworks"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    framework_id: Mapped[str] = mapped_column(String(255))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class LeaderLeaseRow(Base):
    """The lease that makes one of several daemons on this database the leader (the one that
    schedules). Times are the database's own (``now()``); see :mod:`peloton.storage.leases`."""

    __tablename__ = "leader_leases"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    # The daemon id (``--daemon-id``) that holds or last held the lease.
    holder: Mapped[str] = mapped_column(String(255))
    # Raised by every takeover: the fencing token of the holder's term.
    epoch: Mapped[int] = mapped_column(BigInteger)
    # When the holder acquired it (the start of its term) and last renewed it.
    acquired_at: Mapped[datetime] = mapped_column(UTCDateTime)
    renewed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # Past this, any daemon may take the lease over.
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DaemonRow(Base):
    """A daemon that runs with a daemon id, and when it last asked for the lease (its
    heartbeat, on the database's clock)."""

    __tablename__ = "daemons"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    # Where its gRPC API listens (host:port).
    address: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime)


class AuditRecordRow(Base):
    """One mutating RPC, as the audit trail keeps it: who called, what about, how it ended.

    Append-only: the repository (:mod:`peloton.storage.audit`) only inserts and reads, and the
    migration adds triggers that refuse UPDATE and DELETE on both backends. Nothing refers to
    another table: a record outlives the job, pool or host it names."""

    __tablename__ = "audit_records"

    id: Mapped[int] = mapped_column(EventId, primary_key=True, autoincrement=True)
    # When the RPC began (the daemon's clock).
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    # The caller: its user name ("" for the anonymous caller), groups (a JSON list) and how it
    # proved them (peloton.core.access.Caller.via).
    user_name: Mapped[str] = mapped_column(String(255))
    groups: Mapped[str] = mapped_column(Text)
    via: Mapped[str] = mapped_column(String(32))
    # The full method name (/peloton.v1.JobService/KillJob).
    method: Mapped[str] = mapped_column(String(255))
    # What the call was about: a job id, pool path or hostname ("" when the request named none).
    target: Mapped[str] = mapped_column(String(512))
    # The client's address as gRPC gives it (ipv4:10.0.0.5:51234).
    peer: Mapped[str] = mapped_column(String(255))
    # The status code's name (OK, PERMISSION_DENIED, ...) and its details.
    code: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    # The daemon that served the call (its daemon id; "" for the only daemon).
    daemon: Mapped[str] = mapped_column(String(255))

    __table_args__ = (
        # Newest first, and the filters that narrow the most, each newest first.
        Index("ix_audit_records_at", "at", "id"),
        Index("ix_audit_records_user_name", "user_name", "at"),
        Index("ix_audit_records_target", "target", "at"),
    )


# ---------------------------------------------------------------- sweeps (README "Sweeps")


class SweepRow(Base):
    """A hyperparameter sweep: its spec and where it stands. Its trials are jobs of their own,
    named by ``sweep_trials``; what they reported is in ``sweep_metrics``."""

    __tablename__ = "sweeps"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    pool: Mapped[str] = mapped_column(String(512))
    owner: Mapped[str] = mapped_column(String(255))
    # A serialized peloton.v1.SweepSpec.
    spec: Mapped[bytes] = mapped_column(LargeBinary)
    # RUNNING, SUCCEEDED, FAILED or KILLED; reason says why it ended.
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    # Times freed GPUs grew a leading trial.
    reallocations: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (Index("ix_sweeps_state", "state"),)


class SweepTrialRow(Base):
    """One trial of a sweep: its parameters and the job that runs them."""

    __tablename__ = "sweep_trials"

    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id"), primary_key=True)
    # 0, 1, ... in the order the trials were created.
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    # Its job; None until the job is created (the row is written first, so that a daemon that
    # restarts in between creates the same job: the request id and the token are the row's).
    job_id: Mapped[str | None] = mapped_column(String(36), unique=True, nullable=True)
    # RUNNING, SUCCEEDED, STOPPED, FAILED or KILLED; reason says why it ended.
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    # The parameters, as JSON {"lr": 0.1}.
    params: Mapped[str] = mapped_column(Text)
    # The token its tasks report metrics with (in its job's spec too, as PELOTON_SWEEP_TOKEN).
    token: Mapped[str] = mapped_column(String(64))
    # The search algorithm's id of the trial (Optuna's trial number; -1: none).
    ref: Mapped[int] = mapped_column(Integer, default=-1)
    # The elastic gang size it may grow to now (0: its gang's maximum, not held back).
    size: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SweepMetricRow(Base):
    """One metric a trial reported at one step (a value that is not a number is NULL)."""

    __tablename__ = "sweep_metrics"

    sweep_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    trial: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    reported_at: Mapped[datetime] = mapped_column(UTCDateTime)
