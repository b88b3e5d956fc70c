"""Re-keying a job: every row's dedup key computed anew (under a new canonical URL
policy or fingerprinter), rows that now share a key merged, in one transaction.

The keys come from the caller (``key_of(payload, url)``, in the job's new key format;
a key that cannot be computed again, of an unreadable or adopted row, is converted to
that format by ``schema.convert_key``): this module knows the key formats only as
strings. ``s:<fp>[:n]`` (a start request, the n-th copy of one run)
keeps its form, numbered again in row order; ``u:<uuid>`` (a ``dont_filter``
request) is never shared and stays; any other key is a fingerprint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, bindparam, delete, select, update

from scrapy_reliability.frontier.row_urls import full_url_sql
from scrapy_reliability.frontier.schema import (
    ADOPTED_URL,
    DEAD,
    DONE,
    IGNORED,
    LEASED,
    PENDING,
    convert_key,
    dead_letters,
    jobs,
    requests,
)

#: The most advanced state survives a merge: a page fetched is not fetched again.
_RANK = {DONE: 4, DEAD: 3, IGNORED: 2, LEASED: 1, PENDING: 0}
#: Rows read, and rows written, per statement.
CHUNK = 1000
#: Merges the result names by URL (the count is always complete).
EXAMPLES = 10


@dataclass
class RekeyResult:
    rows: int = 0
    #: Rows whose key changed (merged rows not counted).
    changed: int = 0
    #: Rows deleted because another row of the same page is kept.
    merged: int = 0
    #: Their dead letters, deleted with them.
    dead_letters: int = 0
    #: Rows whose stored request could not be read: their keys were kept (in the new
    #: key format).
    unreadable: int = 0
    #: Fingerprints adopted from Scrapy's requests.seen (no request stored): kept (in
    #: the new key format).
    adopted: int = 0
    #: States of the merged rows, and of the rows kept in their place.
    merged_states: dict[str, int] = field(default_factory=dict)
    #: (URL of a merged row, its state, URL of the row kept, its state).
    examples: list[tuple[str, str, str, str]] = field(default_factory=list)


@dataclass
class _Row:
    id: int
    old: str
    new: str
    state: str
    #: Whether the new key came from ``key_of`` (a start row is then numbered again).
    read: bool = True


def rekey_job(
    engine: Engine,
    job_id: int,
    key_of: Callable[[str, str], str | None],
    *,
    dedup_scheme: str,
    url_policy: str | None,
    key_formats: tuple[str | None, str | None],
    check_no_worker: Callable[[Connection], None],
    dry_run: bool = False,
) -> RekeyResult:
    """Recompute every row's key with ``key_of`` (None: the payload cannot be read;
    the row keeps its key), merge rows that now share one (the most advanced state
    is kept: done, dead, ignored, leased, pending; the oldest row among equals),
    store ``dedup_scheme``, ``url_policy`` and the new key format on the job
    (``key_formats``: the job's, and the one ``key_of`` computes; a key kept is
    converted). One transaction; ``check_no_worker`` runs first and again before the
    commit and raises when a worker of the job is live. ``dry_run`` rolls everything
    back."""
    result = RekeyResult()
    with engine.connect() as conn, conn.begin() as tx:
        check_no_worker(conn)
        rows = _read(conn, job_id, key_of, key_formats, result)
        keep, gone = _merge(rows, result)
        _examples(conn, gone, keep, result)
        _apply(conn, job_id, keep, gone, result)
        conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values(dedup_scheme=dedup_scheme, url_policy=url_policy, key_format=key_formats[1])
        )
        check_no_worker(conn)
        if dry_run:
            tx.rollback()
    return result


def _read(
    conn: Connection,
    job_id: int,
    key_of: Callable[[str, str], str | None],
    key_formats: tuple[str | None, str | None],
    result: RekeyResult,
) -> list[_Row]:
    rows: list[_Row] = []
    last = 0
    while True:
        chunk = conn.execute(
            select(
                requests.c.id,
                requests.c.fingerprint,
                requests.c.state,
                requests.c.payload,
                full_url_sql(requests).label("url"),
            )
            .where(requests.c.job_id == job_id, requests.c.id > last)
            .order_by(requests.c.id)
            .limit(CHUNK)
        ).all()
        if not chunk:
            return rows
        for row in chunk:
            old = str(row.fingerprint)
            new, read = convert_key(old, *key_formats), False
            if row.payload == ADOPTED_URL:
                result.adopted += 1
            elif not old.startswith("u:"):
                fingerprint = key_of(row.payload, row.url)
                if fingerprint is None:
                    result.unreadable += 1
                else:
                    new = f"s:{fingerprint}" if old.startswith("s:") else fingerprint
                    read = True
            rows.append(_Row(int(row.id), old, new, str(row.state), read))
        result.rows += len(chunk)
        last = int(chunk[-1].id)


def _merge(rows: list[_Row], result: RekeyResult) -> tuple[list[_Row], list[tuple[_Row, _Row]]]:
    """The rows kept (with their new keys) and the (merged, kept instead) pairs."""
    keep: list[_Row] = []
    gone: list[tuple[_Row, _Row]] = []
    starts: dict[str, int] = {}
    best: dict[str, _Row] = {}
    # Keys not computed again (unreadable rows): numbered start keys skip them.
    fixed = {row.new for row in rows if not row.read}
    for row in rows:  # in id order
        if row.read and row.new.startswith("s:"):
            # Start requests are copies by design: number them as a new run would.
            base = row.new.split(":")[1]
            n = starts.get(base, 0)
            key = f"s:{base}" if n == 0 else f"s:{base}:{n}"
            while key in fixed:
                n += 1
                key = f"s:{base}:{n}"
            starts[base] = n + 1
            row.new = key
            keep.append(row)
            continue
        held = best.get(row.new)
        if held is None:
            best[row.new] = row
        elif _RANK.get(row.state, 0) > _RANK.get(held.state, 0):
            best[row.new] = row
            gone.append((held, row))
        else:
            gone.append((row, held))
    keep.extend(best.values())
    # A pair's "kept" row may itself have been beaten later: name the final one.
    for i, (lost, kept) in enumerate(gone):
        gone[i] = (lost, best.get(kept.new, kept))
        key = f"{lost.state}->{gone[i][1].state}"
        result.merged_states[key] = result.merged_states.get(key, 0) + 1
    result.merged = len(gone)
    result.changed = sum(1 for row in keep if row.new != row.old)
    return keep, gone


def _examples(
    conn: Connection, gone: list[tuple[_Row, _Row]], keep: list[_Row], result: RekeyResult
) -> None:
    pairs = gone[:EXAMPLES]
    ids = {r.id for pair in pairs for r in pair}
    if not ids:
        return
    query = select(requests.c.id, full_url_sql(requests)).where(requests.c.id.in_(ids))
    urls: dict[int, str] = dict(conn.execute(query).all())
    result.examples = [
        (str(urls.get(lost.id, "?")), lost.state, str(urls.get(kept.id, "?")), kept.state)
        for lost, kept in pairs
    ]


def _apply(
    conn: Connection,
    job_id: int,
    keep: list[_Row],
    gone: list[tuple[_Row, _Row]],
    result: RekeyResult,
) -> None:
    lost = [row.id for row, _ in gone]
    for i in range(0, len(lost), CHUNK):
        ids = lost[i : i + CHUNK]
        result.dead_letters += conn.execute(
            delete(dead_letters).where(
                dead_letters.c.job_id == job_id,
                dead_letters.c.kind == "request",
                dead_letters.c.request_id.in_(ids),
            )
        ).rowcount
        conn.execute(delete(requests).where(requests.c.id.in_(ids)))
    moved = [row for row in keep if row.new != row.old]
    statement = (
        update(requests)
        .where(requests.c.id == bindparam("row_id"))
        .values(fingerprint=bindparam("new_key"))
    )
    # First out of the way (a row's new key may be another's old one), then in place.
    # "r:" is no key the scheduler writes.
    for final in (False, True):
        for i in range(0, len(moved), CHUNK):
            params = [
                {"row_id": row.id, "new_key": row.new if final else f"r:{row.id}"}
                for row in moved[i : i + CHUNK]
            ]
            conn.execute(statement, params)
