"""Jobs, their labels, tasks and the append-only event history.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from peloton.storage.models import EventId, UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("pool", sa.String(512), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("instances", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("goal", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("spec", sa.LargeBinary(), nullable=False),
        sa.Column("task_counts", sa.Text(), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.UniqueConstraint("request_id", name="uq_jobs_request_id"),
    )
    op.create_index("ix_jobs_created", "jobs", ["created_at", "id"])
    op.create_index("ix_jobs_state_created", "jobs", ["state", "created_at", "id"])
    op.create_index("ix_jobs_pool_created", "jobs", ["pool", "created_at", "id"])
    op.create_index("ix_jobs_name", "jobs", ["name"])

    op.create_table(
        "job_labels",
        sa.Column("job_id", sa.String(36), nullable=False),
        sa.Column("key", sa.String(63), nullable=False),
        sa.Column("value", sa.String(255), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_labels_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "key", name="pk_job_labels"),
    )
    op.create_index("ix_job_labels_key_value", "job_labels", ["key", "value"])

    op.create_table(
        "tasks",
        sa.Column("job_id", sa.String(36), nullable=False),
        sa.Column("instance_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("goal", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_tasks_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "instance_id", name="pk_tasks"),
    )
    op.create_index("ix_tasks_job_state", "tasks", ["job_id", "state"])

    op.create_table(
        "job_events",
        sa.Column("id", EventId, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(36), nullable=False),
        sa.Column("instance_id", sa.Integer(), nullable=True),
        sa.Column("time", UTCDateTime(), nullable=False),
        sa.Column("from_state", sa.String(16), nullable=False),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("attempt_id", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_events_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_job_events"),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id"])
    op.create_index("ix_job_events_job_instance", "job_events", ["job_id", "instance_id", "id"])


def downgrade() -> None:
    op.drop_table("job_events")
    op.drop_table("tasks")
    op.drop_table("job_labels")
    op.drop_table("jobs")
