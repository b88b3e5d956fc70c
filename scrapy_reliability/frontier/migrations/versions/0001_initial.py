"""The initial frontier: jobs, workers, requests and standalone fingerprints.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "reliability_jobs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("dedup_scheme", sa.String(255), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_reliability_jobs"),
        sa.UniqueConstraint("name", "generation", name="uq_reliability_jobs_name"),
        sa.CheckConstraint(
            "state IN ('running', 'finished')", name=op.f("ck_reliability_jobs_state")
        ),
    )
    op.create_table(
        "reliability_workers",
        sa.Column("id", sa.String(80), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("heartbeat_at", sa.Float(), nullable=False),
        sa.Column("stopped_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_reliability_workers"),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["reliability_jobs.id"],
            name="fk_reliability_workers_job_id_reliability_jobs",
        ),
    )
    op.create_index(
        "ix_reliability_workers_job_live", "reliability_workers", ["job_id", "stopped_at"]
    )
    op.create_table(
        "reliability_requests",
        sa.Column("id", _BigId, nullable=False, autoincrement=True),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(96), nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("domain", sa.String(255), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("not_before", sa.Float(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_token", sa.String(32), nullable=True),
        sa.Column("worker_id", sa.String(80), nullable=True),
        sa.Column("lease_expires_at", sa.Float(), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_reliability_requests"),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["reliability_jobs.id"],
            name="fk_reliability_requests_job_id_reliability_jobs",
        ),
        sa.UniqueConstraint("job_id", "fingerprint", name="uq_reliability_requests_job_id"),
        sa.CheckConstraint(
            "state IN ('pending', 'leased', 'done', 'ignored', 'dead')",
            name=op.f("ck_reliability_requests_state"),
        ),
        sa.CheckConstraint(
            "state <> 'leased' OR (lease_token IS NOT NULL AND worker_id IS NOT NULL"
            " AND lease_expires_at IS NOT NULL)",
            name=op.f("ck_reliability_requests_lease_complete"),
        ),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_reliability_requests_attempts")),
    )
    op.create_index(
        "ix_reliability_requests_claim",
        "reliability_requests",
        ["job_id", sa.text("priority DESC"), "id"],
        postgresql_where=sa.text("state = 'pending'"),
        sqlite_where=sa.text("state = 'pending'"),
    )
    op.create_index(
        "ix_reliability_requests_leases",
        "reliability_requests",
        ["worker_id"],
        postgresql_where=sa.text("state = 'leased'"),
        sqlite_where=sa.text("state = 'leased'"),
    )
    op.create_index(
        "ix_reliability_requests_expiry",
        "reliability_requests",
        ["job_id", "lease_expires_at"],
        postgresql_where=sa.text("state = 'leased'"),
        sqlite_where=sa.text("state = 'leased'"),
    )
    op.create_index(
        "ix_reliability_requests_job_state", "reliability_requests", ["job_id", "state"]
    )
    op.create_table(
        "reliability_fingerprints",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(96), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "fingerprint", name="pk_reliability_fingerprints"),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["reliability_jobs.id"],
            name="fk_reliability_fingerprints_job_id_reliability_jobs",
        ),
    )


def downgrade() -> None:
    op.drop_table("reliability_fingerprints")
    op.drop_table("reliability_requests")
    op.drop_table("reliability_workers")
    op.drop_table("reliability_jobs")
