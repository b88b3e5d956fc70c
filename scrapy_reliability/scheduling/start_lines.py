"""The lines a run starts with: which run this is and why (a first run, a new run
after a finished one, a resumed one, an incremental recrawl), when the previous
run ended, and what the job's domains learned that this run applies or forgot.

Pure text from the records the job's opening returned; the session logs them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from scrapy_reliability.frontier import Job
from scrapy_reliability.frontier.records import LearnedReview, Pause, SetLimit

#: Domains named one by one in the learned-limits line; the rest are counted.
NAMED = 10


def when(at: float | None) -> str:
    """A time stamp in the log's local time, or "at an unknown time"."""
    if not at:
        return "at an unknown time"
    return "at " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _thousands(n: int) -> str:
    return f"{n:,}"


def new_run_line(job: Job, url: str, *, cached: bool, pruned: tuple[int, int]) -> str:
    """A finished job crawled again from its start requests."""
    refetch = (
        "every page is requested again (HTTPCACHE_ENABLED: answered or revalidated through "
        "the HTTP cache where its policy allows)"
        if cached
        else "every page is fetched again"
    )
    line = (
        f"New run {job.generation} of job {job.name} on the frontier {url}: run "
        f"{job.generation - 1} finished {when(job.previous_ended_at)}, so this run starts "
        f"from the start requests and {refetch}. RELIABILITY_RECRAWL_AFTER fetches only the "
        "pages due; RELIABILITY_RESTART_FINISHED = False crawls nothing after a finished run"
    )
    runs, rows = pruned
    if runs:
        line += (
            f"; the rows of {runs} older run{'s' if runs != 1 else ''} were deleted "
            f"({_thousands(rows)} rows; RELIABILITY_KEEP_RUNS)"
        )
    return line


def resumed_line(job: Job, counts: dict[str, int], recovered: int) -> str:
    """An interrupted run taken up again."""
    interrupted = (
        f", interrupted {when(job.previous_ended_at)} (its last worker's last sign of life)"
        if job.previous_ended_at
        else ""  # no worker ever ran it: a job adopted from a stock JOBDIR
    )
    return (
        f"Resuming job {job.name} (run {job.generation}){interrupted}: "
        f"{_thousands(counts.get('pending', 0) + counts.get('leased', 0))} pending, "
        f"{_thousands(counts.get('done', 0))} done, {recovered} leases of a dead worker "
        "taken back"
    )


def recrawl_line(job: Job, *, age: str, namespace: str | None) -> str:
    """A finished run crawled again for its due pages (RELIABILITY_RECRAWL_AFTER)."""
    return (
        f"Incremental recrawl of job {job.name} (run {job.generation}, finished "
        f"{when(job.previous_ended_at)}): {_thousands(job.recrawl_due)} pages due again "
        f"(older than {age}), {_thousands(job.recrawl_parse)} to parse again under cache "
        f"namespace {namespace}; the other done pages are not fetched"
    )


def frontier_command(spider: str, chosen: Sequence[str], verb: str, *rest: str) -> str:
    """``scrapy frontier VERB SPIDER ...`` for this crawl's job: ``chosen`` are the ``-s``
    options that chose its database and job (``_jobs.chosen_on_command_line``)."""
    return " ".join(["scrapy", "frontier", verb, spider or "SPIDER", *chosen, *rest])


def learned_line(
    review: LearnedReview, *, new_run: bool, command: Callable[..., str]
) -> str | None:
    """The learned domain limits this run applies and those it forgot, or None when
    the job's domains learned nothing."""
    if not review.applied and not review.forgotten:
        return None
    parts = []
    if review.applied:
        shown = []
        for item in review.applied[:NAMED]:
            age = "" if item.age is None else f", confirmed {_ago(item.age)} ago"
            shown.append(
                f"{item.domain} {item.rate:.3g}/s (limit {item.limit:.3g}/s of "
                f"{item.ceiling:g}/s configured, {item.throttles} throttles{age})"
            )
        lead = (
            "Learned limits carried over from the previous run"
            if new_run
            else "Learned limits of this run in force"
        )
        parts.append(f"{lead}: {', '.join(shown)}{_more(len(review.applied))}")
    if review.forgotten:
        shown = [
            f"{item.domain} (limit {item.limit:.3g}/s: {item.reason})"
            for item in review.forgotten[:NAMED]
        ]
        lead = "learned limits reset" if parts else "Learned limits reset"
        parts.append(
            f"{lead}, these domains probe from their configured rate: "
            f"{', '.join(shown)}{_more(len(review.forgotten))}"
        )
    return "; ".join(parts) + f". `{command('domains')}` shows them; `--forget` forgets them"


def set_limits_line(limits: tuple[SetLimit, ...], *, command: Callable[..., str]) -> str | None:
    """The limits an operator set that hold in this run, or None."""
    if not limits:
        return None
    shown = "; ".join(limit.text() for limit in limits[:NAMED])
    return (
        f"Limits an operator set hold for every worker: {shown}{_more(len(limits))}. "
        f"`{command('limit', '--domain', 'D', '--reset')}` removes one"
    )


def pauses_line(pauses: tuple[Pause, ...], *, command: Callable[..., str]) -> str | None:
    """The pauses the run before left in force, which this new run keeps, or None."""
    if not pauses:
        return None
    shown = "; ".join(pause.text() for pause in pauses[:NAMED])
    return (
        f"Pauses kept from the run before: {shown}{_more(len(pauses))}. "
        f"`{command('resume', '--domain', pauses[0].domain)}` ends one"
    )


def _more(total: int) -> str:
    return f" and {total - NAMED} more" if total > NAMED else ""


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"
