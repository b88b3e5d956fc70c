"""The limits a job's crawl runs with, and the callbacks each worker's spider has.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # JSON: the per-domain limits the last worker of the job started with, so that
    # `scrapy frontier explain/status` report those rather than their own settings.
    with op.batch_alter_table("reliability_jobs") as batch:
        batch.add_column(sa.Column("limits", sa.Text(), nullable=True))
    # JSON: the spider's callback names, so a worker that lacks a stored callback
    # can tell whether another live worker of the job may have it.
    with op.batch_alter_table("reliability_workers") as batch:
        batch.add_column(sa.Column("callbacks", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reliability_workers") as batch:
        batch.drop_column("callbacks")
    with op.batch_alter_table("reliability_jobs") as batch:
        batch.drop_column("limits")
