"""Named errors of the frontier. Each message says what went wrong and what to do next."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, OperationalError


class FrontierError(Exception):
    """Base class of every error raised by the frontier."""


class LeaseLost(FrontierError):
    """A transition out of ``leased`` matched no row: the lease expired and the
    row went back to pending (and may have been re-claimed under another token).

    The work done under the old lease is not recorded; the request is (or was)
    fetched again by its new holder, so nothing is lost.
    """

    def __init__(self, request_ids: list[int]):
        self.request_ids = request_ids
        super().__init__(
            f"lease lost for frontier request(s) {request_ids[:10]}"
            f"{'...' if len(request_ids) > 10 else ''}: the lease expired before this "
            "worker's result was written (the row went back to pending, and may have been "
            "claimed again), so the result was not recorded and the request is fetched "
            "again. If this happens often, raise RELIABILITY_LEASE_SECONDS or look for "
            "callbacks that block the reactor."
        )


class SchemaError(FrontierError):
    """The database schema is not the one this version of scrapy-reliability uses."""


class SchemaOutdated(SchemaError):
    def __init__(self, url: str, current: str | None, head: str):
        super().__init__(
            f"The frontier database {url} is at schema version {current!r}, but this "
            f"version of scrapy-reliability needs {head!r}. Upgrade it with "
            "`scrapy frontier migrate` (inside the project, with the same settings), "
            "or set RELIABILITY_AUTO_MIGRATE = True to upgrade when the crawl starts."
        )


class SchemaTooNew(SchemaError):
    def __init__(self, url: str, current: str):
        super().__init__(
            f"The frontier database {url} is at schema version {current!r}, which this "
            "version of scrapy-reliability does not know: it was written by a newer "
            "release. Upgrade scrapy-reliability; the database was left untouched."
        )


class WorkersRunning(SchemaError):
    """An upgrade refused because workers still run on the database: started with the
    older schema, they would misread what the new one writes. Nothing was changed."""

    def __init__(
        self,
        url: str,
        current: str,
        head: str,
        running: list[tuple[str, int, float]],
        within: float,
    ):
        self.running = running
        shown = "; ".join(f"{host} pid {pid}, {age:.0f} s ago" for host, pid, age in running[:5])
        more = f"; and {len(running) - 5} more" if len(running) > 5 else ""
        count = (
            "1 worker still beats" if len(running) == 1 else f"{len(running)} workers still beat"
        )
        super().__init__(
            f"Not upgrading the frontier database {url} from schema version {current!r} "
            f"to {head!r}: {count} on it ({shown}{more}), and a "
            "worker of the older release would misread what the new schema writes. Stop "
            "them, then upgrade; nothing was changed. A worker that was killed stops "
            f"counting {within:g} s after its last beat."
        )


class FrontierUnavailable(FrontierError):
    """The database cannot be reached or opened."""


class StorageLost(FrontierUnavailable):
    """The frontier's storage went away mid-job (its SQLite file deleted or
    replaced); the crawl stops rather than starting over in a new file."""

    @classmethod
    def deleted(cls, path: str) -> StorageLost:
        return cls(
            f"The SQLite frontier {path} was deleted while the crawl ran; stopping "
            "rather than starting the job again in a new empty file. Restore the file "
            "(or start a new job) and run the same command again."
        )


class FrontierLocked(FrontierError):
    """Another process holds the SQLite frontier."""


class JobMismatch(FrontierError):
    """The stored job was created with settings that cannot change mid-job."""


class JobFinished(FrontierError):
    """The job's last run finished: a worker that joins it has nothing to do."""

    def __init__(self, name: str, generation: int, finished_at: float | None, *, fleet: int = 0):
        self.name = name
        self.generation = generation
        self.finished_at = finished_at
        if fleet:
            super().__init__(
                f"Job {name!r} (run {generation}) was just finished by a fleet of {fleet} "
                "workers: this worker came late for that run and crawls nothing. "
                "RELIABILITY_RESTART_FINISHED = True starts the next run now."
            )
            return
        super().__init__(
            f"Job {name!r} (run {generation}) already finished and "
            "RELIABILITY_RESTART_FINISHED is False: nothing is crawled. Unset it (a finished "
            "job's next crawl is then a new run), or start another job (another JOBDIR or "
            "RELIABILITY_JOB)."
        )


class WouldWait(Exception):
    """Raised by a call run inline that would have to wait (a lock held elsewhere):
    it changed nothing, and runs on the database thread instead.

    Defined here, not next to the database thread that catches it, so that the
    frontier raises it without importing Twisted."""


def first_line(exc: BaseException) -> str:
    """The first line of what ``exc`` says, stripped: of the driver's error when
    ``exc`` is a SQLAlchemy error wrapping one (its ``orig``; SQLAlchemy's own
    text goes on with the statement and its parameters, which can be megabytes
    and are a request's data). "" when it says nothing: each caller names the
    error its own way then."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else ""


def _ends_the_session(sqlstate: str | None) -> bool:
    """PostgreSQL ended the connection: a connection exception (class 08), the
    server shutting down or refusing connections (57P01-57P03), or a session timeout
    (idle in transaction, 25P03; idle, 57P05)."""
    if not sqlstate:
        return False
    return sqlstate.startswith("08") or sqlstate in {"25P03", "57P01", "57P02", "57P03", "57P05"}


def is_storage_failure(exc: BaseException) -> bool:
    """Whether a failed statement says the database itself is unusable (server
    gone, disk full, file lost, read-only, locked), as opposed to refusing one
    of the values written. The first is waited out, up to a limit; the second
    is isolated to the row that carries the value."""
    if isinstance(exc, (StorageLost, OSError)):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if _ends_the_session(getattr(getattr(exc, "orig", None), "sqlstate", None)):
        return True
    if isinstance(exc, OperationalError):
        return True
    message = str(getattr(exc, "orig", None) or exc).lower()
    return any(
        marker in message
        for marker in (
            "no such table",
            "does not exist",
            "readonly",
            "read-only",
            "closed",
            "permission denied",
        )
    )
