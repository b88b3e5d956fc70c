"""Payloads of version 3: a JSON array, ``[3, ref, callback, depth, rest]``.

The fields most requests have (a link's Referer path, its callback, the depth
Scrapy's DepthMiddleware set last in its meta) are stored by position, the others by
their version 2 names in a last object: a link's payload takes about 20 characters
instead of 60. No table changes: the revision marks the format, so that a worker of
an older release, which reads versions 1 and 2 only, is refused by the schema check
instead of burying every new row as corrupt. Rows written before keep their payloads
of version 1 or 2, which this release reads.

The downgrade writes every version 3 payload back as version 2, in the requests and
the dead-letter tables.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06
"""

from __future__ import annotations

import json
from typing import Any

from scrapy_reliability.frontier.migrations.payloads import rewrite_payloads

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def _as_version_2(payload: str, url: str) -> str | None:
    """The version 2 payload of a version 3 one; None when it is not one."""
    try:
        data: Any = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, list) or not data or data[0] != 3 or len(data) > 5:
        return None
    rest = data[4] if len(data) == 5 else {}
    if not isinstance(rest, dict):
        return None
    out: dict[str, Any] = {"v": 2}
    for key, value in zip(("ref", "callback"), data[1:3], strict=False):
        if value is not None:
            out[key] = value
    out.update((k, v) for k, v in rest.items() if k not in ("v", "ref", "callback"))
    depth = data[3] if len(data) > 3 else None
    if depth is not None:
        meta = out.get("meta")
        out["meta"] = {**(meta if isinstance(meta, dict) else {}), "depth": depth}
    return json.dumps(out, separators=(",", ":"), ensure_ascii=True)


def downgrade() -> None:
    rewrite_payloads("reliability_requests", "[3%", _as_version_2)
    rewrite_payloads("reliability_dead_letters", "[3%", _as_version_2)
