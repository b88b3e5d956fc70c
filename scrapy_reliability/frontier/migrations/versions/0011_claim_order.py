"""Crawl order as Scrapy's queues give it: each row's place among the pending rows of
its priority (``claim_order``), and the claim's index in that order.

Scrapy's default queues are LIFO, start requests FIFO after the others; the claim
took pending rows oldest first (``ORDER BY priority DESC, id``). Newest first by id
cannot be served by the old index in both directions at once (a backward scan also
reverses the priorities), and start requests need an order of their own, so the
writer sets the order and the claim follows it: ``ORDER BY priority DESC,
claim_order, id``, one forward index scan whatever the order.

Rows written before this revision get 0: among themselves they keep their id order
(oldest first, as they were claimed).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_INDEX = "ix_reliability_requests_claim"
_PENDING = sa.text("state = 'pending'")


def upgrade() -> None:
    with op.batch_alter_table("reliability_requests") as batch:
        batch.add_column(
            sa.Column("claim_order", sa.BigInteger(), nullable=False, server_default=sa.text("0"))
        )
    op.drop_index(_INDEX, table_name="reliability_requests")
    op.create_index(
        _INDEX,
        "reliability_requests",
        ["job_id", sa.text("priority DESC"), "claim_order", "id"],
        postgresql_where=_PENDING,
        sqlite_where=_PENDING,
    )


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="reliability_requests")
    op.create_index(
        _INDEX,
        "reliability_requests",
        ["job_id", sa.text("priority DESC"), "id"],
        postgresql_where=_PENDING,
        sqlite_where=_PENDING,
    )
    with op.batch_alter_table("reliability_requests") as batch:
        batch.drop_column("claim_order")
