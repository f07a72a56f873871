"""Resource pools.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from peloton.storage.models import UTCDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pools",
        sa.Column("path", sa.String(512), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("config", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("path", name="pk_pools"),
    )


def downgrade() -> None:
    op.drop_table("pools")
