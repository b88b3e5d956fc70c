"""The audit table: what operators did to a job from outside (pause, resume, stop),
who did it and when.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reliability_audit",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("who", sa.String(length=255), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["reliability_jobs.id"],
            name="fk_reliability_audit_job_id_reliability_jobs",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_reliability_audit"),
    )
    op.create_index("ix_reliability_audit_job_id", "reliability_audit", ["job_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_reliability_audit_job_id", table_name="reliability_audit")
    op.drop_table("reliability_audit")
