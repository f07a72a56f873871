"""Several daemons on one database: the leader lease and the daemons' heartbeats.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26

Two new tables, empty until a daemon runs with a daemon id; nothing existing is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from peloton.storage.models import UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leader_leases",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at", UTCDateTime(), nullable=False),
        sa.Column("renewed_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_leader_leases"),
    )
    op.create_table(
        "daemons",
        sa.Column("id", sa.String(255), nullable=False),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("heartbeat_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_daemons"),
    )


def downgrade() -> None:
    op.drop_table("daemons")
    op.drop_table("leader_leases")
