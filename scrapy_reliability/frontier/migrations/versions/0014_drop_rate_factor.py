"""The domain rows' old rate factor goes: the adaptive rate (0005) replaced it, and
no worker of this release writes or reads it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reliability_domains") as batch:
        batch.drop_constraint(op.f("ck_reliability_domains_rate_factor"), type_="check")
        batch.drop_column("rate_factor")


def downgrade() -> None:
    with op.batch_alter_table("reliability_domains") as batch:
        batch.add_column(
            sa.Column("rate_factor", sa.Float(), nullable=False, server_default=sa.text("1"))
        )
        batch.create_check_constraint(
            op.f("ck_reliability_domains_rate_factor"), "rate_factor > 0 AND rate_factor <= 1"
        )
