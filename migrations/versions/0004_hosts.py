"""Hosts (Mesos agents) and the Mesos framework id.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from peloton.storage.models import UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hosts",
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("agent_id", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("cpu", sa.Float(), nullable=False),
        sa.Column("mem_mb", sa.Float(), nullable=False),
        sa.Column("disk_mb", sa.Float(), nullable=False),
        sa.Column("gpu", sa.Float(), nullable=False),
        sa.Column("attributes", sa.Text(), nullable=False),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("hostname", name="pk_hosts"),
    )
    op.create_table(
        "frameworks",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("framework_id", sa.String(255), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_frameworks"),
    )


def downgrade() -> None:
    op.drop_table("frameworks")
    op.drop_table("hosts")
