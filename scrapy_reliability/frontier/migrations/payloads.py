"""What the downgrades of a payload format share: every payload of one version in a
table rewritten as the version before, a chunk of rows at a time."""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from alembic import op

_CHUNK = 1000


def rewrite_payloads(table: str, like: str, older: Callable[[str, str], str | None]) -> None:
    """Each payload of ``table`` that matches the LIKE pattern ``like`` written as
    ``older(payload, url)`` returns it (None: left as it is), in id order."""
    conn = op.get_bind()
    last = 0
    select = sa.text(
        f"SELECT id, url, payload FROM {table} WHERE id > :last AND payload LIKE :like "
        "ORDER BY id LIMIT :n"
    )
    write = sa.text(f"UPDATE {table} SET payload = :payload WHERE id = :id")
    while True:
        rows = conn.execute(select, {"last": last, "like": like, "n": _CHUNK}).all()
        if not rows:
            return
        changed = []
        for row_id, url, payload in rows:
            old = older(payload, url)
            if old is not None:
                changed.append({"id": row_id, "payload": old})
        if changed:
            conn.execute(write, changed)
        last = rows[-1][0]
