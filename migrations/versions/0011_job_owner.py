"""Job owners: who created each job (per-pool permissions let an owner stop its own jobs).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27

The column defaults to "" (a job created without authentication, as every earlier job was), so
the upgrade rewrites nothing. Pool grants live in the pools' JSON config and need no column.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("owner", sa.String(255), nullable=False, server_default=""))


def downgrade() -> None:
    # Not batch mode: on SQLite it copies the jobs table and drops the old one, and the drop
    # cascades to every table that references jobs. Both databases drop a column in place
    # (SQLite since 3.35).
    op.execute("ALTER TABLE jobs DROP COLUMN owner")
