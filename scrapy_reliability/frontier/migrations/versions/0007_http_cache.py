"""The HTTP cache in the frontier's database (scrapy_reliability.HttpCacheStorage).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reliability_http_cache",
        sa.Column("scope", sa.String(255), nullable=False),
        sa.Column("fingerprint", sa.String(96), nullable=False),
        sa.Column("namespace", sa.String(64), nullable=False),
        sa.Column("domain", sa.String(255), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("response_url", sa.Text(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("headers", sa.Text(), nullable=False),
        sa.Column("content_type", sa.String(255), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("body_size", sa.BigInteger(), nullable=False),
        sa.Column("stored_size", sa.BigInteger(), nullable=False),
        sa.Column("body_sha256", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("stored_at", sa.Float(), nullable=False),
        sa.Column("used_at", sa.Float(), nullable=False),
        sa.CheckConstraint(
            "body_size >= 0 AND stored_size >= 0", name=op.f("ck_reliability_http_cache_sizes")
        ),
        sa.PrimaryKeyConstraint("scope", "fingerprint", name=op.f("pk_reliability_http_cache")),
    )
    op.create_index(
        op.f("ix_reliability_http_cache_used_at"), "reliability_http_cache", ["used_at"]
    )
    op.create_index(
        op.f("ix_reliability_http_cache_domain"), "reliability_http_cache", ["scope", "domain"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_reliability_http_cache_domain"), table_name="reliability_http_cache")
    op.drop_index(op.f("ix_reliability_http_cache_used_at"), table_name="reliability_http_cache")
    op.drop_table("reliability_http_cache")
