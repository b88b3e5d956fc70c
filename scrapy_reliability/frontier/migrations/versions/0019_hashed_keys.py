"""PostgreSQL: the dedup key in a hash index; pending rows by domain, deduplicated.

The unique B-tree of ``(job_id, fingerprint)`` took 65 bytes a request at 30M
queued requests (its keys are random, so its pages stay about 70% full), a sixth of
the frontier's size. On PostgreSQL it gives way to an exclusion constraint over a
hash index of the two as one text, ``job_id || ':' || fingerprint``: an entry holds
a 4-byte hash code, 36 bytes a request at 30M. The insert's ``ON CONFLICT DO NOTHING``
needs no change (it names no constraint). A query that finds rows by key names that
expression (``schema.match_keys``). A plain index of ``job_id`` (deduplicated by
PostgreSQL, a few bytes a row) takes over what the unique key's first column did:
counting a job's rows, finding them to delete or move.

The index of each domain's earliest pending row, (job_id, domain, not_before, state),
becomes (job_id, domain, ``not_before <= 0``) on PostgreSQL: PostgreSQL stores a
B-tree's equal keys once with the list of their rows, but not for a ``float8``
column, so the index took 40 bytes a pending request, and takes 7. A domain with such
a row is due now (a new link's ``not_before`` is 0); the earliest ``not_before`` of
the rows that wait (retries, rows handed back: few) is in a new partial index of
them only, ``ix_reliability_requests_pending_delayed``.

SQLite changes nothing: its unique index and its index of pending rows stay.

On a large table the upgrade builds four indexes while it holds its lock, reading
every row once each (2.7 s for 1M rows, 10% of them pending).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_TABLE = "reliability_requests"
_UNIQUE = "uq_reliability_requests_job_id"
_KEY = "ex_reliability_requests_key"
_JOB = "ix_reliability_requests_job"
_DUE = "ix_reliability_requests_pending_due"
_DELAYED = "ix_reliability_requests_pending_delayed"
_PENDING = sa.text("state = 'pending'")


def _postgresql() -> bool:
    return bool(op.get_bind().dialect.name == "postgresql")


def _due(columns: list[str | sa.TextClause]) -> None:
    op.drop_index(_DUE, table_name=_TABLE)
    op.create_index(_DUE, _TABLE, columns, postgresql_where=_PENDING)


def upgrade() -> None:
    if not _postgresql():
        return
    op.create_index(_JOB, _TABLE, ["job_id"])
    op.execute(
        f"ALTER TABLE {_TABLE} ADD CONSTRAINT {_KEY} "
        "EXCLUDE USING hash ((CAST(job_id AS TEXT) || ':' || fingerprint) WITH =)"
    )
    op.drop_constraint(_UNIQUE, _TABLE, type_="unique")
    _due(["job_id", "domain", sa.text("(not_before <= 0)")])
    op.create_index(
        _DELAYED,
        _TABLE,
        ["job_id", "domain", "not_before"],
        postgresql_where=sa.text("state = 'pending' AND not_before > 0"),
    )


def downgrade() -> None:
    if not _postgresql():
        return
    op.create_unique_constraint(_UNIQUE, _TABLE, ["job_id", "fingerprint"])
    op.execute(f"ALTER TABLE {_TABLE} DROP CONSTRAINT {_KEY}")
    op.drop_index(_JOB, table_name=_TABLE)
    op.drop_index(_DELAYED, table_name=_TABLE)
    _due(["job_id", "domain", "not_before", "state"])
