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

from scrapy_reliability.frontier.migrations.payloads import rewrite_payloads

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


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


def downgrade() -> None:
    rewrite_payloads("reliability_requests", '{"v":2%', _as_version_1)
    rewrite_payloads("reliability_dead_letters", '{"v":2%', _as_version_1)
