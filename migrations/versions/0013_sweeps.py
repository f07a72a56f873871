"""Hyperparameter sweeps: sweeps, their trials, and the metrics the trials report per step.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27

New tables only, empty until a sweep is submitted; nothing existing is rewritten. Their names
keep clear of Optuna's own tables (``studies``, ``trials``, ...), which an Optuna-backed sweep
creates in the same database.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from peloton.storage.models import UTCDateTime

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("pool", sa.String(512), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("spec", sa.LargeBinary(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("reallocations", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sweeps"),
    )
    op.create_index("ix_sweeps_state", "sweeps", ["state"])
    op.create_table(
        "sweep_trials",
        sa.Column("sweep_id", sa.String(36), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(36), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("params", sa.Text(), nullable=False),
        sa.Column("token", sa.String(64), nullable=False),
        sa.Column("ref", sa.Integer(), nullable=False),
        sa.Column("size", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["sweep_id"], ["sweeps.id"], name="fk_sweep_trials_sweep_id_sweeps"
        ),
        sa.PrimaryKeyConstraint("sweep_id", "index", name="pk_sweep_trials"),
        sa.UniqueConstraint("job_id", name="uq_sweep_trials_job_id"),
    )
    op.create_table(
        "sweep_metrics",
        sa.Column("sweep_id", sa.String(36), nullable=False),
        sa.Column("trial", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("reported_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("sweep_id", "trial", "step", "name", name="pk_sweep_metrics"),
    )


def downgrade() -> None:
    op.drop_table("sweep_metrics")
    op.drop_table("sweep_trials")
    op.drop_index("ix_sweeps_state", table_name="sweeps")
    op.drop_table("sweeps")
