"""Compact request keys: ``reliability_jobs.key_format``.

A job created from this revision on writes the fingerprint part of its request keys
as base64url (27 characters for a SHA-1) instead of hex (40): about 30 bytes less per
request, in the table and in its unique index. Existing jobs get NULL, which means
hex, and keep it until ``scrapy frontier rekey`` rewrites their keys: the upgrade
rewrites no row, and a resumed crawl, a retry pass and a recrawl find every key where
it was. The column also marks the format for
an older release's workers, which the schema check refuses.

The downgrade writes every compact key of the requests and fingerprints tables back
as hex, which is what an older release computes.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

from __future__ import annotations

import base64

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_CHUNK = 1000


def upgrade() -> None:
    with op.batch_alter_table("reliability_jobs") as batch:
        batch.add_column(sa.Column("key_format", sa.String(16), nullable=True))


def _decoded(digest: str) -> str:
    return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()


def _hex(key: str) -> str:
    """The hex form of a compact key (``s:`` start keys and their copies included);
    any other key (``u:``, ``r:``, a mark, one that does not decode) as it is."""
    try:
        if key.startswith("s:"):
            digest, colon, copy = key[2:].partition(":")
            return f"s:{_decoded(digest)}{colon}{copy}"
        return key if ":" in key else _decoded(key)
    except ValueError:
        return key


def _rewrite_requests(job_id: int) -> None:
    """The job's request keys, ``_CHUNK`` rows at a time in id order."""
    conn = op.get_bind()
    read = sa.text(
        "SELECT id, fingerprint FROM reliability_requests WHERE job_id = :job AND id > :last "
        "ORDER BY id LIMIT :n"
    )
    write = sa.text("UPDATE reliability_requests SET fingerprint = :new WHERE id = :id")
    last = 0
    while rows := conn.execute(read, {"job": job_id, "last": last, "n": _CHUNK}).all():
        changed = [{"id": i, "new": new} for i, k in rows if (new := _hex(k)) != k]
        if changed:
            conn.execute(write, changed)
        last = rows[-1][0]


def _rewrite_seen(job_id: int) -> None:
    """The job's keys in the fingerprints table (read first: a rewritten key would
    sort among those still to read)."""
    conn = op.get_bind()
    keys = (
        conn.execute(
            sa.text("SELECT fingerprint FROM reliability_fingerprints WHERE job_id = :job"),
            {"job": job_id},
        )
        .scalars()
        .all()
    )
    changed = [{"job": job_id, "old": k, "new": new} for k in keys if (new := _hex(k)) != k]
    for start in range(0, len(changed), _CHUNK):
        conn.execute(
            sa.text(
                "UPDATE reliability_fingerprints SET fingerprint = :new "
                "WHERE job_id = :job AND fingerprint = :old"
            ),
            changed[start : start + _CHUNK],
        )


def downgrade() -> None:
    # A release before 0017 computes hex keys: every compact key is written back as
    # hex, or a job resumed by it would store and fetch each known page again.
    compact = [
        row[0]
        for row in op.get_bind().execute(
            sa.text("SELECT id FROM reliability_jobs WHERE key_format IS NOT NULL")
        )
    ]
    for job_id in compact:
        _rewrite_requests(job_id)
        _rewrite_seen(job_id)
    with op.batch_alter_table("reliability_jobs") as batch:
        batch.drop_column("key_format")
