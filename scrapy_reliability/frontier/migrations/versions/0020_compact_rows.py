"""Compact rows: URLs without what the domain holds; payloads of version 4.

A row's ``domain`` holds its URL's host. A new row's URL that is ``http://`` or
``https://`` and that host (then a port, a path, a query, a fragment or nothing) is
stored without both, behind a mark: ``!`` for ``http://<domain>``, ``~`` for
``https://<domain>`` (frontier/row_urls.py). A URL stored whole that begins with a
mark gets a ``\\`` in front. Rows written before keep their full URLs: the upgrade
only escapes those that begin with a mark (a URL Scrapy takes needs only a ``://``),
reading every row once. A payload of version 4, ``[4, ref, depth, callback, rest]``,
leaves out the callback ``parse`` (a spider's default, named by most requests):
``[4,"/p/3",2]`` for version 3's ``[3,"/p/3","parse",2]``. Together about 25 bytes
less per request.

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
    """The version 3 payload, ``[3, ref, callback, depth, rest]``, of a version 4 one,
    ``[4, ref, depth, callback, rest]`` (no callback: ``parse``); None when it is not one."""
    try:
        data: Any = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, list) or not data or data[0] != 4 or len(data) > 5:
        return None
    ref, depth = [*data[1:3], None, None][:2]
    callback = data[3] if len(data) > 3 else "parse"
    out = [3, ref, callback, depth, *data[4:]]
    if len(out) == 4:
        while out[-1] is None:
            out.pop()
    return json.dumps(out, separators=(",", ":"), ensure_ascii=True)


def downgrade() -> None:
    op.execute(
        "UPDATE reliability_requests SET url = CASE substr(url, 1, 1) "
        "WHEN '!' THEN 'http://' || domain || substr(url, 2) "
        "WHEN '~' THEN 'https://' || domain || substr(url, 2) "
        f"ELSE substr(url, 2) END WHERE {_MARKED}"
    )
    rewrite_payloads("reliability_requests", "[4%", _as_version_3)
    rewrite_payloads("reliability_dead_letters", "[4%", _as_version_3)
