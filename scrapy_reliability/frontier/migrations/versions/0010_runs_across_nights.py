"""A job's life across runs: where a moved job went, and how old and how sure a
learned domain limit is.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A tombstone per job name moved away by `scrapy frontier move`: the source keeps
    # it, so the job has one home. Not keyed by a job id: it outlives the job's rows.
    op.create_table(
        "reliability_moves",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("moved_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_reliability_moves")),
    )
    # All zero for limits learned before this revision: their age and the configured
    # rate they were learned under are unknown.
    with op.batch_alter_table("reliability_domains") as batch:
        batch.add_column(
            sa.Column("learned_ceiling", sa.Float(), nullable=False, server_default=sa.text("0"))
        )
        batch.add_column(
            sa.Column("learned_at", sa.Float(), nullable=False, server_default=sa.text("0"))
        )
        batch.add_column(
            sa.Column("throttles", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )


def downgrade() -> None:
    with op.batch_alter_table("reliability_domains") as batch:
        batch.drop_column("throttles")
        batch.drop_column("learned_at")
        batch.drop_column("learned_ceiling")
    op.drop_table("reliability_moves")
