"""Copy a job's frontier from one database to another (``scrapy frontier move``).

Generic over ``schema.metadata``: the job's rows of ``reliability_jobs`` (every
generation) and every row of every table keyed by a job (a foreign key to
``reliability_jobs.id``), every column of each, so a column or a table added
later is carried without naming it here. Surrogate ids (an autoincrement primary
key) are given by the target; a column referring to one (a declared foreign key,
or one of :data:`UNDECLARED`) is mapped through the referred table's natural key
(its unique constraint), a chunk at a time, so memory stays bounded whatever the
size of the job.

Leased rows (their workers are dead: a move with a live worker is refused) go
back to pending in the copy, as lease recovery would do.

The copy runs in one transaction on the target, reads one snapshot of the
source, and checks the counts per table and state before it commits: all or
nothing; it removes the job's tombstone from the target (the job came back).
Only once the committed copy is counted again does the source change, in one
transaction (:func:`leave_source`): the job's tombstone
(:mod:`~scrapy_reliability.frontier.tombstone`), and with ``--delete-source`` the
deletion of its rows, both only if the source still holds what was copied.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Table,
    UniqueConstraint,
    delete,
    func,
    insert,
    select,
    tuple_,
)
from sqlalchemy.exc import OperationalError
from sqlalchemy.sql.elements import ColumnElement

from scrapy_reliability.frontier import migrate, tombstone
from scrapy_reliability.frontier.connections import reading
from scrapy_reliability.frontier.dialect import redact
from scrapy_reliability.frontier.errors import FrontierError, SchemaTooNew
from scrapy_reliability.frontier.schema import (
    LEASED,
    PENDING,
    jobs,
    match_keys,
    metadata,
    requests,
    workers,
)

#: Rows per read and per insert (bound parameters per statement stay far below
#: SQLite's limit: at most a few dozen columns a row).
CHUNK = 500

#: References the schema does not declare as foreign keys: (table, column) -> the
#: table whose surrogate id the column holds.
UNDECLARED: dict[tuple[str, str], str] = {
    ("reliability_dead_letters", "request_id"): "reliability_requests",
}

#: What lease recovery writes into a leased row of a dead worker.
RECOVERED_LEASE: dict[str, Any] = {
    "state": PENDING,
    "lease_token": None,
    "worker_id": None,
    "lease_expires_at": None,
}

#: The count of a table without a ``state`` column.
ROWS = "rows"

# table name -> state (or ROWS) -> rows
Counts = dict[str, dict[str, int]]


class MoveRefused(FrontierError):
    """The move cannot run as asked; nothing was written."""


class SourceChanged(FrontierError):
    """The source's rows of the job changed after the copy was read: it keeps the
    job (no tombstone written, nothing deleted)."""


class MoveMismatch(FrontierError):
    """The copy's counts differ from the source's: rolled back, nothing written."""

    def __init__(self, message: str, result: MoveResult):
        super().__init__(message)
        self.result = result


@dataclass
class MoveResult:
    """What a move copied: rows per table and state on the source, as expected
    on the target (leases back to pending), and as found there."""

    names: list[str]
    generations: int = 0
    source: Counts = field(default_factory=dict)
    expected: Counts = field(default_factory=dict)
    target: Counts = field(default_factory=dict)
    recovered_leases: int = 0
    unmapped: dict[str, int] = field(default_factory=dict)
    #: The target's tombstone of the job, removed by the copy: the job came back.
    came_back: tombstone.Tombstone | None = None

    def mismatches(self) -> list[str]:
        """``table state: expected N, found M`` for each count that differs."""
        return differences(self.expected, self.target, ("expected", "found"))


def differences(a: Counts, b: Counts, words: tuple[str, str]) -> list[str]:
    """``table state: <words[0]> N, <words[1]> M`` for each count that differs."""
    found = []
    for table in sorted(set(a) | set(b)):
        want, got = a.get(table, {}), b.get(table, {})
        for state in sorted(set(want) | set(got)):
            if want.get(state, 0) != got.get(state, 0):
                found.append(
                    f"{table} {state}: {words[0]} {want.get(state, 0)}, "
                    f"{words[1]} {got.get(state, 0)}"
                )
    return found


# -- the tables of a job ------------------------------------------------------------------------


def job_column(table: Table) -> Column[Any] | None:
    """The column of ``table`` that names its job (a foreign key to the job id)."""
    for column in table.columns:
        if any(fk.column is jobs.c.id for fk in column.foreign_keys):
            return column
    return None


def references(table: Table) -> dict[str, Table]:
    """Column name -> the table whose surrogate id it holds (declared or not)."""
    found: dict[str, Table] = {}
    for column in table.columns:
        for fk in column.foreign_keys:
            found[column.name] = fk.column.table
        undeclared = UNDECLARED.get((table.name, column.name))
        if undeclared is not None:
            found[column.name] = metadata.tables[undeclared]
    return {name: ref for name, ref in found.items() if surrogate(ref) is not None}


def surrogate(table: Table) -> Column[Any] | None:
    """The id the database gives a row of ``table`` (an autoincrement key), if any."""
    column = table.autoincrement_column
    return column if column is not None and len(table.primary_key.columns) == 1 else None


def natural_key(table: Table) -> list[Column[Any]]:
    """The columns that identify a row of ``table`` apart from its surrogate id."""
    for constraint in sorted(table.constraints, key=lambda c: str(c.name)):
        if isinstance(constraint, UniqueConstraint):
            return list(constraint.columns)
    raise FrontierError(f"{table.name} has a surrogate id but no unique key to map it by")


def job_tables() -> list[Table]:
    """The jobs table, then every table keyed by a job, each after the tables it
    refers to."""
    keyed = [t for t in metadata.sorted_tables if t is jobs or job_column(t) is not None]
    ordered: list[Table] = []
    pending = list(keyed)
    while pending:
        for table in pending:
            needs = set(references(table).values()) - {table}
            if all(need in ordered or need not in keyed for need in needs):
                ordered.append(table)
                pending.remove(table)
                break
        else:
            raise FrontierError("the frontier tables refer to each other in a cycle")
    return ordered


# -- counts -------------------------------------------------------------------------------------


def _where(table: Table, job_ids: Sequence[int]) -> ColumnElement[bool]:
    if table is jobs:
        return jobs.c.id.in_(list(job_ids))
    column = job_column(table)
    assert column is not None
    return column.in_(list(job_ids))


def count_job(conn: Connection, job_ids: Sequence[int]) -> Counts:
    """Rows of the jobs ``job_ids`` per table, and per state where a table has one."""
    counts: Counts = {}
    for table in job_tables():
        if "state" in table.c:
            rows = conn.execute(
                select(table.c.state, func.count())
                .where(_where(table, job_ids))
                .group_by(table.c.state)
            ).all()
            counts[table.name] = {str(state): int(n) for state, n in rows}
        else:
            n = conn.execute(
                select(func.count()).select_from(table).where(_where(table, job_ids))
            ).scalar_one()
            counts[table.name] = {ROWS: int(n)}
    return counts


def expected_counts(source: Counts) -> Counts:
    """The source's counts as the copy must have them: leases back to pending."""
    expected = {table: dict(states) for table, states in source.items()}
    rows = expected.get(requests.name, {})
    leased = rows.pop(LEASED, 0)
    if leased:
        rows[PENDING] = rows.get(PENDING, 0) + leased
    return expected


def job_ids(conn: Connection, names: Sequence[str]) -> list[int]:
    return [
        int(i)
        for i in conn.execute(
            select(jobs.c.id).where(jobs.c.name.in_(list(names))).order_by(jobs.c.id)
        ).scalars()
    ]


def live_workers(conn: Connection, names: Sequence[str], *, since: float) -> list[Any]:
    """Workers of the jobs ``names`` not stopped and heard from since ``since``."""
    return list(
        conn.execute(
            select(workers.c.id, workers.c.hostname, workers.c.pid)
            .join(jobs, jobs.c.id == workers.c.job_id)
            .where(
                jobs.c.name.in_(list(names)),
                workers.c.stopped_at.is_(None),
                workers.c.heartbeat_at >= since,
            )
        ).all()
    )


# -- the copy -----------------------------------------------------------------------------------


def _chunks(conn: Connection, table: Table, where: ColumnElement[bool]) -> Iterator[list[Any]]:
    """The rows of ``table`` that ``where`` selects, CHUNK at a time in primary-key
    order (keyset pagination: no offset, no cursor held between chunks)."""
    key = list(table.primary_key.columns)
    last: tuple[Any, ...] | None = None
    while True:
        query = select(table).where(where)
        if last is not None:
            query = query.where(key[0] > last[0] if len(key) == 1 else tuple_(*key) > tuple_(*last))
        rows = list(conn.execute(query.order_by(*key).limit(CHUNK)).all())
        if not rows:
            return
        yield rows
        last = tuple(getattr(rows[-1], c.name) for c in key)


class _Copy:
    """One move: the source snapshot, the target transaction, the id maps."""

    def __init__(self, source: Connection, target: Connection, result: MoveResult):
        self.source = source
        self.target = target
        self.result = result
        self.job_map: dict[int, int] = {}

    def run(self, old_jobs: list[int]) -> None:
        for table in job_tables():
            where = _where(table, old_jobs)
            for rows in _chunks(self.source, table, where):
                self._copy_chunk(table, [dict(r._mapping) for r in rows])

    def _copy_chunk(self, table: Table, rows: list[dict[str, Any]]) -> None:
        refs = references(table)
        for column, referred in refs.items():
            mapping = self._map(referred, [r[column] for r in rows if r[column] is not None])
            for row in rows:
                old = row[column]
                if old is not None:
                    row[column] = mapping.get(old)
                    if row[column] is None:
                        self.result.unmapped[table.name] = (
                            self.result.unmapped.get(table.name, 0) + 1
                        )
        if table is requests:
            for row in rows:
                if row["state"] == LEASED:
                    row.update(RECOVERED_LEASE)
                    self.result.recovered_leases += 1
        own = surrogate(table)
        if table is jobs:
            assert own is not None
            for row in rows:
                old_id = row.pop(own.name)
                new_id = self.target.execute(insert(jobs).returning(jobs.c.id), row).scalar_one()
                self.job_map[int(old_id)] = int(new_id)
            return
        if own is not None:
            for row in rows:
                del row[own.name]
        self.target.execute(insert(table), rows)

    def _map(self, referred: Table, old_ids: list[Any]) -> Mapping[Any, Any]:
        """Source ids of ``referred`` -> their ids on the target, by natural key."""
        if referred is jobs:
            return self.job_map
        own = surrogate(referred)
        assert own is not None
        key = natural_key(referred)
        key_refs = references(referred)
        found: dict[Any, Any] = {}
        wanted = sorted(set(old_ids))
        for start in range(0, len(wanted), CHUNK):
            part = wanted[start : start + CHUNK]
            by_key: dict[tuple[Any, ...], Any] = {}
            for row in self.source.execute(select(own, *key).where(own.in_(part))):
                values = []
                for column in key:
                    value = getattr(row, column.name)
                    if column.name in key_refs:
                        value = self._map(key_refs[column.name], [value]).get(value)
                    values.append(value)
                by_key[tuple(values)] = getattr(row, own.name)
            if not by_key:
                continue
            where: ColumnElement[bool] = tuple_(*key).in_(list(by_key))
            if referred is requests:  # through the dedup key's index
                where = match_keys(self.target.dialect.name, list(by_key))
            for row in self.target.execute(select(own, *key).where(where)):
                old = by_key.get(tuple(getattr(row, c.name) for c in key))
                if old is not None:
                    found[old] = getattr(row, own.name)
        return found


def move_job(source: Engine, target: Engine, names: Sequence[str]) -> MoveResult:
    """Copy every run of the jobs ``names`` (a job and its companions) from
    ``source`` to ``target`` (schema at head) in one transaction on the target.

    Raises :class:`MoveRefused` when the target already has one of the jobs, and
    :class:`MoveMismatch` (after rolling back) when the copy's counts differ from
    the source's.
    """
    result = MoveResult(names=list(names))
    with reading(source) as src:
        old_jobs = job_ids(src, names)
        if not old_jobs:
            raise MoveRefused(f"no job {names[0]!r} in the source database")
        result.generations = int(
            src.execute(
                select(func.count()).where(jobs.c.name == names[0], jobs.c.id.in_(old_jobs))
            ).scalar_one()
        )
        result.source = count_job(src, old_jobs)
        result.expected = expected_counts(result.source)
        with target.begin() as dst:
            refuse_existing(dst, names)
            result.came_back = tombstone.find(dst, names[0])
            tombstone.clear(dst, names)
            copy = _Copy(src, dst, result)
            copy.run(old_jobs)
            result.target = count_job(dst, list(copy.job_map.values()))
            problems = result.mismatches()
            if result.unmapped:
                problems += [f"{t}: {n} references not found" for t, n in result.unmapped.items()]
            if problems:
                raise MoveMismatch(
                    "the copy does not match the source (" + "; ".join(problems) + "); "
                    "rolled back, nothing was written to the target",
                    result,
                )
    return result


def refuse_existing(conn: Connection, names: Sequence[str]) -> None:
    """Refuse a target that already holds one of the jobs ``names``."""
    present = sorted(
        str(n)
        for n in conn.execute(select(jobs.c.name).where(jobs.c.name.in_(list(names)))).scalars()
    )
    if present:
        raise MoveRefused(
            f"the target already has job {present[0]!r}: move it elsewhere, or remove it "
            "there first (scrapy frontier purge --whole-job --yes --database-url TARGET)"
        )


def verify(target: Engine, names: Sequence[str], result: MoveResult) -> list[str]:
    """Count the committed copy again; the mismatches (none: all is there)."""
    with reading(target) as conn:
        result.target = count_job(conn, job_ids(conn, names))
    return result.mismatches()


def leave_source(
    source: Engine,
    names: Sequence[str],
    target: str,
    result: MoveResult,
    *,
    delete_rows: bool,
    now: float,
) -> dict[str, int] | None:
    """Once the copy is committed and verified, mark the source in one transaction:
    the tombstone of the jobs ``names`` (pointing at ``target``, its password
    masked), and with ``delete_rows`` every row of every run of the jobs in every
    table keyed by a job. Both only if the source still counts what was copied
    (``result.source``): else :class:`SourceChanged`, and nothing is written.
    Returns the rows deleted per table (None without ``delete_rows``)."""
    with source.begin() as conn:
        tombstone.leave(conn, names, target, now=now)
        old_jobs = job_ids(conn, names)
        changed = differences(result.source, count_job(conn, old_jobs), ("copied", "now"))
        if changed:
            raise SourceChanged(
                f"the source's rows of job {names[0]!r} changed after they were copied ("
                + "; ".join(changed)
                + "): a worker ran during the move. The source keeps the job (no tombstone, "
                "nothing deleted); remove the target's copy (scrapy frontier purge "
                "--whole-job --yes --database-url TARGET) and move again once no worker runs"
            )
        if not delete_rows:
            return None
        # Rows that refer to others first, the job rows last.
        return {
            table.name: int(conn.execute(delete(table).where(_where(table, old_jobs))).rowcount)
            for table in reversed(job_tables())
        }


# -- the target ---------------------------------------------------------------------------------


def target_is_fresh(engine: Engine, *, given_by: str) -> bool:
    """Whether ``engine``'s database holds no frontier yet (it is then created at
    head, like a fresh database); raises :class:`MoveRefused` or
    :class:`SchemaTooNew` for a frontier at another schema version. Errors name its
    URL as ``given_by`` (the command's option)."""
    try:
        current = migrate.current_revision(engine)
    except OperationalError as exc:
        raise migrate.unavailable(engine.url, exc, given_by=given_by) from None
    head = migrate.head_revision()
    if current == head:
        return False
    if current is None:
        return True
    if current not in migrate.known_revisions():
        raise SchemaTooNew(redact(engine.url), current)
    raise MoveRefused(
        f"the target {redact(engine.url)} is at schema version {current!r}, older than this "
        f"release's {head!r}: run `scrapy frontier migrate --database-url TARGET` first"
    )


def create_target(engine: Engine, *, given_by: str) -> None:
    """Create the frontier schema at head on a fresh target."""
    migrate.upgrade(engine, create_only=True, given_by=given_by)
