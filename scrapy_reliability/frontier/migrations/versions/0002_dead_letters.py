"""Dead letters, and the failure class and first failure time of each request.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("reliability_requests") as batch:
        batch.add_column(sa.Column("error_class", sa.String(16), nullable=True))
        batch.add_column(sa.Column("first_failed_at", sa.Float(), nullable=True))
    op.create_table(
        "reliability_dead_letters",
        sa.Column("id", _BigId, nullable=False, autoincrement=True),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.BigInteger(), nullable=True),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("domain", sa.String(255), nullable=False),
        sa.Column("error_class", sa.String(16), nullable=False),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=True),
        sa.Column("item", sa.Text(), nullable=True),
        sa.Column("first_failed_at", sa.Float(), nullable=False),
        sa.Column("last_failed_at", sa.Float(), nullable=False),
        sa.Column("passes", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_reliability_dead_letters"),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["reliability_jobs.id"],
            name="fk_reliability_dead_letters_job_id_reliability_jobs",
        ),
        sa.CheckConstraint(
            "kind IN ('request', 'item')", name=op.f("ck_reliability_dead_letters_kind")
        ),
    )
    op.create_index(
        "ix_reliability_dead_letters_request",
        "reliability_dead_letters",
        ["request_id"],
        unique=True,
        postgresql_where=sa.text("kind = 'request'"),
        sqlite_where=sa.text("kind = 'request'"),
    )
    op.create_index(
        "ix_reliability_dead_letters_job",
        "reliability_dead_letters",
        ["job_id", "kind", "error_class"],
    )


def downgrade() -> None:
    op.drop_table("reliability_dead_letters")
    with op.batch_alter_table("reliability_requests") as batch:
        batch.drop_column("first_failed_at")
        batch.drop_column("error_class")
