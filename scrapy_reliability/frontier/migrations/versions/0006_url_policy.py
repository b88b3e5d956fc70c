"""The canonical URL policy a job's dedup keys were computed under.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL for existing jobs: they were keyed by a fingerprinter without a policy
    # (Scrapy's own), and keep it until `scrapy frontier rekey` moves them.
    with op.batch_alter_table("reliability_jobs") as batch:
        batch.add_column(sa.Column("url_policy", sa.String(40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reliability_jobs") as batch:
        batch.drop_column("url_policy")
