"""Gang lifecycle on jobs: gang failures, restart backoff, max runtime deadline.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from peloton.storage.models import UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("gang_failures", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("not_before", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("deadline_at", UTCDateTime(), nullable=True))
    op.create_index("ix_jobs_deadline", "jobs", ["deadline_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_deadline", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("deadline_at")
        batch.drop_column("not_before")
        batch.drop_column("gang_failures")
