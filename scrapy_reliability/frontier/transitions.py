"""The write path: new requests, transitions out of ``leased`` (each guarded by
the row's claim token), dead letters and refusals, applied on the caller's
transaction."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from sqlalchemy import Connection, Engine, delete, func, literal, select, update

from scrapy_reliability._crashpoints import crash_point
from scrapy_reliability.frontier import dialect, feeds, item_sink
from scrapy_reliability.frontier.adaptive import AdaptiveState
from scrapy_reliability.frontier.domains import DomainRows
from scrapy_reliability.frontier.hotsql import INSERT_CHUNK, HotSql
from scrapy_reliability.frontier.politeness import Politeness
from scrapy_reliability.frontier.records import (
    DeadItem,
    NewRequest,
    Outcome,
    Refusal,
    Transition,
    WriteBatch,
    storable_text,
)
from scrapy_reliability.frontier.recrawl import Fetched, record_fetches
from scrapy_reliability.frontier.row_urls import full_url_sql, stored_url, verbatim_url
from scrapy_reliability.frontier.schema import (
    DEAD,
    DONE,
    IGNORED,
    LEASED,
    PENDING,
    dead_letters,
    requests,
)

# Settlements that share one statement: the row's final state and nothing else.
_PLAIN = (Outcome.DONE, Outcome.IGNORED)


def cleared_lease(state: str, now: float) -> dict[str, object]:
    """The values that take a row out of ``leased`` into ``state``."""
    return {
        "state": state,
        "lease_token": None,
        "worker_id": None,
        "lease_expires_at": None,
        "updated_at": now,
    }


class WritePath:
    """Applies a :class:`WriteBatch` on an open transaction."""

    def __init__(self, engine: Engine, sql: HotSql, domain_rows: DomainRows):
        self._engine = engine
        self._sql = sql
        self._domains = domain_rows

    def apply(
        self,
        conn: Connection,
        job_id: int,
        batch: WriteBatch,
        now: float,
        policy: Politeness | None = None,
    ) -> tuple[set[str], list[int], list[int], dict[str, tuple[AdaptiveState, AdaptiveState]]]:
        """Insert the batch's new requests, then apply its transitions: a parent's
        ack never commits before the children it yielded; then what they tell
        the domains (``policy``: the limits their adaptive rates learn below).
        Returns (fingerprints inserted, rows settled, rows whose lease was lost,
        adaptive rates changed)."""
        inserted = self._insert_requests(conn, job_id, batch.inserts, now)
        if batch.dead_items:
            self._insert_dead_items(conn, job_id, batch.dead_items, now)
        if batch.refusals:
            record_refusals(conn, self._engine, job_id, batch.refusals, now)
        settled, lost = self.apply_transitions(conn, batch.transitions, now)
        lost_ids = set(lost)
        fetched = [
            Fetched(tr.request_id, tr.content_hash, tr.content_ns, tr.recrawl_interval)
            for tr in batch.transitions
            if tr.content_hash is not None
            and tr.outcome is Outcome.DONE
            and tr.request_id not in lost_ids
        ]
        record_fetches(conn, fetched, now)
        if batch.domain_updates:
            self._domains.apply_updates(conn, job_id, batch.domain_updates, now)
        signals = [
            tr
            for tr in batch.transitions
            if tr.domain and (tr.pause_until or tr.slow_down) and tr.request_id not in lost_ids
        ]
        adapted = self._domains.apply_signals(
            conn,
            job_id,
            signals=signals,
            successes=batch.successes,
            policy=policy or Politeness(adaptive=None),
            now=now,
        )
        if batch.items and batch.items_table:
            # Only with an ack that landed: a lost lease's page is another worker's.
            kept = [i for i in batch.items if i.request_id not in lost_ids]
            if kept:
                item_sink.insert(conn, batch.items_table, job_id, kept, now)
        if batch.feed_positions:
            feeds.record(
                conn,
                job_id,
                {k: feeds.FeedPosition(*v) for k, v in batch.feed_positions.items()},
                now,
            )
        if batch.clear_dead_letters:
            done = [
                tr.request_id
                for tr in batch.transitions
                if tr.outcome is Outcome.DONE and tr.request_id not in lost_ids
            ]
            if done:
                conn.execute(
                    delete(dead_letters).where(
                        dead_letters.c.request_id.in_(done), dead_letters.c.kind == "request"
                    )
                )
        return inserted, settled, lost, adapted

    def settlements_single(
        self, job_id: int, batch: WriteBatch, policy: Politeness | None
    ) -> list[tuple[int, str, str]] | None:
        """(row, claim token, final state) of each transition, when the batch holds
        nothing but new requests and plain settlements (done or ignored, no error,
        nothing for the domains or recrawls to learn): what
        :meth:`HotSql.write_single` writes in one statement. None otherwise: the
        batch takes :meth:`apply` in a transaction."""
        if batch.dead_items or batch.refusals or batch.domain_updates or batch.clear_dead_letters:
            return None
        if batch.successes and self._domains.grown(
            job_id, batch.successes, policy or Politeness(adaptive=None)
        ):
            return None
        settles = []
        for tr in batch.transitions:
            if (
                tr.outcome not in _PLAIN
                or tr.error is not None
                or tr.content_hash is not None
                or tr.pause_until is not None
                or tr.slow_down
            ):
                return None
            # Not ``.value`` (an enum property): per settlement, on the hot path.
            state = DONE if tr.outcome is Outcome.DONE else IGNORED
            settles.append((tr.request_id, tr.token, state))
        return settles

    def _insert_requests(
        self, conn: Connection, job_id: int, rows: Sequence[NewRequest], now: float
    ) -> set[str]:
        inserted: set[str] = set()
        for start in range(0, len(rows), INSERT_CHUNK):
            inserted |= self._sql.insert(conn, job_id, rows[start : start + INSERT_CHUNK], now)
        return inserted

    @staticmethod
    def _insert_dead_items(
        conn: Connection, job_id: int, items: Sequence[DeadItem], now: float
    ) -> None:
        conn.execute(
            dead_letters.insert(),
            [
                {
                    "job_id": job_id,
                    "request_id": it.request_id,
                    "kind": "item",
                    "url": it.url,
                    "domain": it.domain,
                    "error_class": "permanent",
                    "last_status": None,
                    "last_error": storable_text(it.error),
                    "attempts": 1,
                    "payload": None,
                    "item": it.item,
                    "first_failed_at": now,
                    "last_failed_at": now,
                    "passes": 0,
                }
                for it in items
            ],
        )

    def apply_transitions(
        self, conn: Connection, transitions: Iterable[Transition], now: float
    ) -> tuple[list[int], list[int]]:
        """Each transition where its row still holds its claim token; returns (rows
        settled, rows whose lease was lost)."""
        settled: list[int] = []
        lost: list[int] = []
        # Plain settlements share a statement per (outcome, token); the rest go one by one.
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        singles: list[Transition] = []
        for tr in transitions:
            if tr.outcome in _PLAIN and tr.error is None:
                groups[(tr.outcome.value, tr.token)].append(tr.request_id)
            else:
                singles.append(tr)
        for (state, token), ids in groups.items():
            done = self._sql.settle(conn, state, ids, token, now)
            settled.extend(done)
            lost.extend(i for i in ids if i not in done)
        for tr in singles:
            back = tr.outcome in (Outcome.RESCHEDULE, Outcome.RELEASE)
            values = cleared_lease(PENDING if back else tr.outcome.value, now)
            values["attempts"] = requests.c.attempts + tr.attempts_inc
            if tr.outcome is Outcome.RESCHEDULE:
                assert tr.payload is not None and tr.url is not None
                values.update(
                    payload=tr.payload, url=verbatim_url(tr.url), not_before=tr.not_before
                )
                if tr.priority is not None:
                    values["priority"] = tr.priority
                if tr.claim_order is not None:
                    values["claim_order"] = tr.claim_order
            elif tr.outcome is Outcome.RELEASE:
                values["not_before"] = tr.not_before
            if tr.status is not None:
                values["last_status"] = tr.status
            if tr.error is not None:
                values["last_error"] = storable_text(tr.error)
            if tr.error_class is not None:
                values["error_class"] = tr.error_class
                values["first_failed_at"] = func.coalesce(requests.c.first_failed_at, now)
            row = conn.execute(
                update(requests)
                .where(
                    requests.c.id == tr.request_id,
                    requests.c.lease_token == tr.token,
                    requests.c.state == LEASED,
                )
                .values(values)
                .returning(requests.c.id)
            ).first()
            if row is None:
                lost.append(tr.request_id)
                continue
            if tr.outcome is Outcome.DEAD:
                # Fail closed: the dead letter commits with the burial or neither does.
                crash_point("mid_burial")
                self._write_dead_letter(conn, tr, now)
            settled.append(tr.request_id)
        return settled, lost

    @staticmethod
    def _write_dead_letter(conn: Connection, tr: Transition, now: float) -> None:
        """The request's dead letter, from its row: refreshed when it has one (a
        request buried again by a retry pass keeps its first failure and passes),
        inserted otherwise.

        Not ``INSERT ... ON CONFLICT (request_id) WHERE kind = ...``: with the
        predicate as a bound parameter, PostgreSQL cannot match the partial unique
        index once the driver prepares the statement (from its 5th-11th run).
        The burial holds the row's lease, so no other transaction writes this
        dead letter meanwhile."""
        row = requests.c
        refreshed = conn.execute(
            update(dead_letters)
            .where(dead_letters.c.request_id == tr.request_id, dead_letters.c.kind == "request")
            .values(
                error_class=tr.error_class or "permanent",
                last_status=select(row.last_status)
                .where(row.id == tr.request_id)
                .scalar_subquery(),
                last_error=select(func.coalesce(row.last_error, ""))
                .where(row.id == tr.request_id)
                .scalar_subquery(),
                attempts=select(row.attempts).where(row.id == tr.request_id).scalar_subquery(),
                payload=select(row.payload).where(row.id == tr.request_id).scalar_subquery(),
                last_failed_at=now,
            )
        ).rowcount
        if refreshed:
            return
        source = select(
            row.job_id,
            row.id,
            literal("request"),
            full_url_sql(requests),
            row.domain,
            literal(tr.error_class or "permanent"),
            row.last_status,
            func.coalesce(row.last_error, ""),
            row.attempts,
            row.payload,
            func.coalesce(row.first_failed_at, now),
            literal(now),
            literal(0),
        ).where(row.id == tr.request_id)
        columns = [
            "job_id",
            "request_id",
            "kind",
            "url",
            "domain",
            "error_class",
            "last_status",
            "last_error",
            "attempts",
            "payload",
            "first_failed_at",
            "last_failed_at",
            "passes",
        ]
        conn.execute(dead_letters.insert().from_select(columns, source))


def record_refusals(
    conn: Connection, engine: Engine, job_id: int, refusals: Sequence[Refusal], now: float
) -> None:
    """Each refused request as a dead row with its dead letter; a key already
    known (the request was stored before) keeps its row."""
    for ref in refusals:
        request_id = conn.execute(
            dialect.insert_ignore(requests, engine)
            .values(
                job_id=job_id,
                fingerprint=ref.fingerprint,
                state=DEAD,
                priority=ref.priority,
                domain=ref.domain,
                url=stored_url(ref.url, ref.domain),
                payload=ref.payload,
                not_before=0.0,
                attempts=0,
                last_error=storable_text(ref.reason),
                error_class=ref.error_class,
                first_failed_at=now,
                created_at=now,
                updated_at=now,
            )
            .returning(requests.c.id)
        ).scalar()
        if request_id is None:
            continue
        conn.execute(
            dead_letters.insert().values(
                job_id=job_id,
                request_id=request_id,
                kind="request",
                url=ref.url,
                domain=ref.domain,
                error_class=ref.error_class,
                last_status=None,
                last_error=storable_text(ref.reason),
                attempts=0,
                payload=ref.payload,
                item=None,
                first_failed_at=now,
                last_failed_at=now,
                passes=0,
            )
        )
