"""What each domain's adaptive rate has learned, shared by every worker.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# All zero is a domain that never throttled us: existing rows need no data migration.
_COLUMNS = ("adaptive_rate", "learned_limit", "probe_interval", "next_probe_at")


def upgrade() -> None:
    # The state of scrapy_reliability/frontier/adaptive.py (AdaptiveState), with the
    # existing last_decrease_at. rate_factor stays for workers of the previous version
    # that may still run during an upgrade; this version no longer reads it.
    with op.batch_alter_table("reliability_domains") as batch:
        for name in _COLUMNS:
            batch.add_column(
                sa.Column(name, sa.Float(), nullable=False, server_default=sa.text("0"))
            )


def downgrade() -> None:
    with op.batch_alter_table("reliability_domains") as batch:
        for name in reversed(_COLUMNS):
            batch.drop_column(name)
