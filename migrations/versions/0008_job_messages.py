"""Messages shared by many tasks stored once: job_messages, named by message_id from tasks,
task_attempts and job_events (a 10,000-task job killed with a 1 KiB message stored it 20,000
times).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26

Rows written before this revision keep their own message (message_id NULL) and read as before:
the upgrade only adds a table and nullable columns (no rewrite of a large table). The
downgrade copies each shared message back into the rows that name it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from peloton.storage.models import EventId

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_TABLES = ("tasks", "task_attempts", "job_events")


def upgrade() -> None:
    op.create_table(
        "job_messages",
        sa.Column("id", EventId, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(36), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_messages_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_job_messages"),
    )
    op.create_index("ix_job_messages_job_id", "job_messages", ["job_id"])
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("message_id", EventId, nullable=True))


def downgrade() -> None:
    for table in _TABLES:
        op.execute(
            f"UPDATE {table} SET message = (SELECT m.text FROM job_messages AS m"
            f" WHERE m.id = {table}.message_id) WHERE message_id IS NOT NULL"
        )
        with op.batch_alter_table(table) as batch:
            batch.drop_column("message_id")
    op.drop_index("ix_job_messages_job_id", "job_messages")
    op.drop_table("job_messages")
