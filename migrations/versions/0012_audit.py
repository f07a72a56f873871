"""The audit trail: one row per mutating RPC, append-only.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27

A new table, empty until a daemon serves a mutating call; nothing existing is rewritten. Triggers
refuse UPDATE and DELETE of its rows (and, on PostgreSQL, TRUNCATE), so that not even a bug in
peloton, or a client of the database that is not peloton, edits the trail unnoticed: only
dropping the triggers does, which takes the table's owner.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from peloton.storage.models import EventId, UTCDateTime

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_REFUSAL = "audit_records is append-only"

_POSTGRES_UP = (
    f"""
    CREATE FUNCTION peloton_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION '{_REFUSAL}' USING ERRCODE = 'insufficient_privilege';
    END
    $$
    """,
    """
    CREATE TRIGGER audit_records_append_only BEFORE UPDATE OR DELETE ON audit_records
    FOR EACH ROW EXECUTE FUNCTION peloton_audit_append_only()
    """,
    """
    CREATE TRIGGER audit_records_no_truncate BEFORE TRUNCATE ON audit_records
    FOR EACH STATEMENT EXECUTE FUNCTION peloton_audit_append_only()
    """,
)
_SQLITE_UP = tuple(
    f"""
    CREATE TRIGGER audit_records_no_{what.lower()} BEFORE {what} ON audit_records
    BEGIN SELECT RAISE(ABORT, '{_REFUSAL}'); END
    """
    for what in ("UPDATE", "DELETE")
)


def upgrade() -> None:
    op.create_table(
        "audit_records",
        sa.Column("id", EventId, autoincrement=True, nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("groups", sa.Text(), nullable=False),
        sa.Column("via", sa.String(32), nullable=False),
        sa.Column("method", sa.String(255), nullable=False),
        sa.Column("target", sa.String(512), nullable=False),
        sa.Column("peer", sa.String(255), nullable=False),
        sa.Column("code", sa.String(32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("daemon", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_records"),
    )
    op.create_index("ix_audit_records_at", "audit_records", ["at", "id"])
    op.create_index("ix_audit_records_user_name", "audit_records", ["user_name", "at"])
    op.create_index("ix_audit_records_target", "audit_records", ["target", "at"])
    postgres = op.get_bind().dialect.name == "postgresql"
    for statement in _POSTGRES_UP if postgres else _SQLITE_UP:
        op.execute(statement)


def downgrade() -> None:
    # Dropping the table drops its triggers and indexes with it.
    op.drop_table("audit_records")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION peloton_audit_append_only()")
