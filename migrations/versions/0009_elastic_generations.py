"""Elastic gangs: each job's current generation (its membership's number) and gang size.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26

Both columns default to 0 (a fixed gang, or an elastic one whose first generation has not formed),
so the upgrade rewrites nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("generation", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("gang_size", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    # Not batch mode: on SQLite it copies the jobs table and drops the old one, and the drop
    # cascades to every table that references jobs. Both databases drop a column in place
    # (SQLite since 3.35).
    for column in ("gang_size", "generation"):
        op.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
