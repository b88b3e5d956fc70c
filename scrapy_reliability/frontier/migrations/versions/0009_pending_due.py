"""An index for the claim that finds nothing due: each domain's earliest pending row.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_NAME = "ix_reliability_requests_pending_due"


def upgrade() -> None:
    op.create_index(
        _NAME,
        "reliability_requests",
        ["job_id", "domain", "not_before"],
        postgresql_where=sa.text("state = 'pending'"),
        sqlite_where=sa.text("state = 'pending'"),
    )


def downgrade() -> None:
    op.drop_index(_NAME, table_name="reliability_requests")
