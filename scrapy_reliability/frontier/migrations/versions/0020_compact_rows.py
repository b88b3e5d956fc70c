"""Compact rows: URLs without what the domain holds; payloads of version 4.

A row's ``domain`` holds its URL's host. A new row's URL that is ``http://`` or
``https://`` and that host (then a port, a path, a query, a fragment or nothing) is
stored without both, behind a mark: ``!`` for ``http://<domain>``, ``~`` for
``https://<domain>`` (frontier/row_urls.py). A URL stored whole that begins with a
mark gets a ``\\`` in front. Rows written before keep their full URLs: the upgrade
only escapes those that begin with a mark (a URL Scrapy takes needs only a ``://``),
reading every row once. A payload of version 4 is one of version 3 whose callback
``parse`` is written ``0``. Together about 20 bytes less per request.

The downgrade writes every stored URL whole again and every version 4 payload back
as version 3, in the requests and the dead-letter tables (dead letters hold whole
URLs already).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07
"""

from __future__ import annotations

import json
from typing import Any

from alembic import op

from scrapy_reliability.frontier.migrations.payloads import rewrite_payloads

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None
_MARKED = "substr(url, 1, 1) IN ('!', '~', '\\')"


def upgrade() -> None:
    op.execute(f"UPDATE reliability_requests SET url = '\\' || url WHERE {_MARKED}")


def _as_version_3(payload: str, url: str) -> str | None:
    """The version 3 payload of a version 4 one; None when it is not one."""
    try:
        data: Any = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, list) or not data or data[0] != 4 or len(data) > 5:
        return None
    data[0] = 3
    if len(data) > 2 and data[2] == 0 and type(data[2]) is int:
        data[2] = "parse"
    return json.dumps(data, separators=(",", ":"), ensure_ascii=True)


def downgrade() -> None:
    op.execute(
        "UPDATE reliability_requests SET url = CASE substr(url, 1, 1) "
        "WHEN '!' THEN 'http://' || domain || substr(url, 2) "
        "WHEN '~' THEN 'https://' || domain || substr(url, 2) "
        f"ELSE substr(url, 2) END WHERE {_MARKED}"
    )
    rewrite_payloads("reliability_requests", "[4%", _as_version_3)
    rewrite_payloads("reliability_dead_letters", "[4%", _as_version_3)
