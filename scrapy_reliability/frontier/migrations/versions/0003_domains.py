"""Per-domain politeness state: token bucket, pauses, Crawl-delay, adaptive rate.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reliability_domains",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("domain", sa.String(255), nullable=False),
        sa.Column("tat", sa.Float(), nullable=False),
        sa.Column("paused_until", sa.Float(), nullable=False),
        sa.Column("pause_reason", sa.Text(), nullable=True),
        sa.Column("crawl_delay", sa.Float(), nullable=True),
        sa.Column("rate_factor", sa.Float(), nullable=False),
        sa.Column("last_decrease_at", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "domain", name="pk_reliability_domains"),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["reliability_jobs.id"],
            name="fk_reliability_domains_job_id_reliability_jobs",
        ),
        sa.CheckConstraint(
            "rate_factor > 0 AND rate_factor <= 1",
            name=op.f("ck_reliability_domains_rate_factor"),
        ),
    )
    # The claim looks up leased rows per domain for concurrency caps.
    op.create_index(
        "ix_reliability_requests_domain_leased",
        "reliability_requests",
        ["job_id", "domain"],
        postgresql_where=sa.text("state = 'leased'"),
        sqlite_where=sa.text("state = 'leased'"),
    )


def downgrade() -> None:
    op.drop_index("ix_reliability_requests_domain_leased", "reliability_requests")
    op.drop_table("reliability_domains")
