"""Feed positions: where each local feed file of a run stands as of its last committed
ack, so a resumed run cuts the file back to it and no item is written twice.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reliability_feed_positions",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("feed", sa.String(length=1024), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("items", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["reliability_jobs.id"],
            name="fk_reliability_feed_positions_job_id_reliability_jobs",
        ),
        sa.PrimaryKeyConstraint("job_id", "feed", name="pk_reliability_feed_positions"),
    )


def downgrade() -> None:
    op.drop_table("reliability_feed_positions")
