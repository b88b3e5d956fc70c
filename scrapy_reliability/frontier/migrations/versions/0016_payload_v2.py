"""Payloads of version 2: the URL lives in its column only.

A stored request's payload no longer repeats the row's ``url``, and a Referer on the
request's own origin (what Scrapy's RefererMiddleware sets on a link of the same
site) is stored as its path, ``ref``. No table changes: the revision marks the
format, so that a worker of an older release, which reads only version 1, is refused
by the schema check instead of burying every new row as corrupt. Rows written before
keep their version 1 payloads, which this release reads.

The downgrade writes every version 2 payload back as version 1 (the URL from the
row's column, the Referer expanded), in the requests and the dead-letter tables.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_CHUNK = 1000


def upgrade() -> None:
    pass


def _origin(url: str) -> str:
    start = url.find("://")
    end = url.find("/", start + 3) if start >= 0 else -1
    return url if end < 0 else url[:end]


def _as_version_1(payload: str, url: str) -> str | None:
    """The version 1 payload of a version 2 one; None when it is not one."""
    try:
        data: Any = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("v") != 2:
        return None
    out: dict[str, Any] = {"v": 1, "url": data.get("url", url)}
    ref = data.get("ref")
    for key, value in data.items():
        if key not in ("v", "url", "ref"):
            out[key] = value
    if isinstance(ref, str) and isinstance(out["url"], str):
        headers = out.get("headers")
        headers = [*headers] if isinstance(headers, list) else []
        headers.append(["Referer", [_origin(out["url"]) + ref]])
        out["headers"] = headers
    return json.dumps(out, separators=(",", ":"), ensure_ascii=True)


def _rewrite(table: str) -> None:
    conn = op.get_bind()
    last = 0
    select = sa.text(
        f"SELECT id, url, payload FROM {table} WHERE id > :last AND payload LIKE :v2 "
        "ORDER BY id LIMIT :n"
    )
    write = sa.text(f"UPDATE {table} SET payload = :payload WHERE id = :id")
    while True:
        rows = conn.execute(select, {"last": last, "v2": '{"v":2%', "n": _CHUNK}).all()
        if not rows:
            return
        changed = []
        for row_id, url, payload in rows:
            old = _as_version_1(payload, url)
            if old is not None:
                changed.append({"id": row_id, "payload": old})
        if changed:
            conn.execute(write, changed)
        last = rows[-1][0]


def downgrade() -> None:
    _rewrite("reliability_requests")
    _rewrite("reliability_dead_letters")
