"""Incremental recrawls: what each request row's last fetch found.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# NULL for existing rows: never fetched under RELIABILITY_RECRAWL_AFTER. A recrawl
# takes their updated_at as the time of their last fetch.
_COLUMNS = (
    ("fetched_at", sa.Float()),
    ("content_hash", sa.String(64)),
    ("content_ns", sa.String(64)),
    ("recrawl_interval", sa.Float()),
    ("recrawl", sa.String(8)),
)


def upgrade() -> None:
    with op.batch_alter_table("reliability_requests") as batch:
        for name, type_ in _COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reliability_requests") as batch:
        for name, _type in reversed(_COLUMNS):
            batch.drop_column(name)
