"""Where each attempt ran on Mesos: its agent id and executor id (they name its sandbox).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# Attempts recorded before this revision get "": a running one gets its ids with its next status
# update; `peloton task logs` of one that had already ended says its sandbox is unknown.
_TABLES = ("tasks", "task_attempts")
_COLUMNS = ("agent_id", "executor_id")


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            for column in _COLUMNS:
                batch.add_column(
                    sa.Column(column, sa.String(255), nullable=False, server_default="")
                )


def downgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            for column in reversed(_COLUMNS):
                batch.drop_column(column)
