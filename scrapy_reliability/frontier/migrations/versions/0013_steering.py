"""Steering from outside: the audit table (what operators did to a job: pause,
resume, limit, add, stop; who, when), the limits an operator set on a domain, and
since when a worker waits for work.

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
    with op.batch_alter_table("reliability_domains") as batch:
        batch.add_column(sa.Column("set_rate", sa.Float(), nullable=True))
        batch.add_column(sa.Column("set_concurrency", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("set_reason", sa.Text(), nullable=True))
    with op.batch_alter_table("reliability_workers") as batch:
        batch.add_column(sa.Column("waiting_since", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reliability_workers") as batch:
        batch.drop_column("waiting_since")
    with op.batch_alter_table("reliability_domains") as batch:
        batch.drop_column("set_reason")
        batch.drop_column("set_concurrency")
        batch.drop_column("set_rate")
    op.drop_index("ix_reliability_audit_job_id", table_name="reliability_audit")
    op.drop_table("reliability_audit")
