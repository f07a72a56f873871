"""Hosts keyed by Mesos agent id: several agents may share a hostname.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts", recreate="always") as batch:
        batch.drop_constraint("pk_hosts", type_="primary")
        batch.create_primary_key("pk_hosts", ["agent_id"])
    op.create_index("ix_hosts_hostname", "hosts", ["hostname"])


def downgrade() -> None:
    # Of agents sharing a hostname, the downgraded table keeps one (the newest record).
    op.execute(
        "DELETE FROM hosts WHERE EXISTS (SELECT 1 FROM hosts AS h WHERE h.hostname = hosts.hostname"
        " AND (h.updated_at > hosts.updated_at OR (h.updated_at = hosts.updated_at"
        " AND h.agent_id > hosts.agent_id)))"
    )
    op.drop_index("ix_hosts_hostname", "hosts")
    with op.batch_alter_table("hosts", recreate="always") as batch:
        batch.drop_constraint("pk_hosts", type_="primary")
        batch.create_primary_key("pk_hosts", ["hostname"])
