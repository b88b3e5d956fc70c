"""Scrapy's feed exports, as the frontier needs them (the one module that touches the
internals of Scrapy's FeedExporter, its slots and its exporters).

The frontier acks a request only after its items reached the feed file: these helpers
flush the open feeds before every ack batch, and repair a line-based feed whose last
line a kill -9 cut in half. For the local feeds that can be resumed exactly
(:func:`exact_feeds`), :func:`resume_slot` continues a file cut back to its last
committed position as if the run had never stopped: a JSON array or an XML document
is not opened twice, a CSV file gets no second header.
"""

from __future__ import annotations

import csv
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

LINE_FORMATS = frozenset({"jsonlines", "jl", "jsonl", "csv"})


def feed_exporters(crawler: Crawler) -> list[Any]:
    from scrapy.extensions.feedexport import FeedExporter

    extensions = getattr(crawler, "extensions", None)
    middlewares = getattr(extensions, "middlewares", ()) if extensions else ()
    return [ext for ext in middlewares if isinstance(ext, FeedExporter)]


def flush_feeds(exporters: list[Any]) -> None:
    """Push buffered feed output to the operating system (enough for kill -9)."""
    for exporter in exporters:
        for slot in getattr(exporter, "slots", ()):
            stream = getattr(getattr(slot, "exporter", None), "stream", None)
            if stream is not None and hasattr(stream, "flush"):
                stream.flush()
            file = getattr(slot, "file", None)
            if file is not None and hasattr(file, "flush") and not file.closed:
                file.flush()


def repair_line_feeds(feeds: dict[str, Any]) -> list[Path]:
    """Cut a trailing partial line from appended local line-based feeds."""
    repaired: list[Path] = []
    for uri, raw_options in feeds.items():
        options = raw_options or {}
        if options.get("overwrite", False) or options.get("format") not in LINE_FORMATS:
            continue
        path = _local_path(str(uri))
        if path is None or not path.is_file():
            continue
        size = path.stat().st_size
        if size == 0:
            continue
        with path.open("rb+") as fh:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) == b"\n":
                continue
            keep = _last_newline_end(fh, size)
            fh.truncate(keep)
        logger.warning(
            "Feed %s ended with a partial line (the previous run was killed while "
            "writing it); cut %d bytes. Their item belongs to a request that was not "
            "acked, so it is fetched and exported again.",
            path,
            size - keep,
        )
        repaired.append(path)
    return repaired


def _local_path(uri: str) -> Path | None:
    if "%(" in uri:
        return None
    if uri.startswith("file://"):
        return Path(uri[len("file://") :])
    scheme = urlparse(uri).scheme
    if len(scheme) > 1:  # s3://, ftp://, stdout: (one letter: a Windows drive)
        return None
    return Path(uri)


def _last_newline_end(fh: IO[bytes], size: int) -> int:
    block = 65536
    pos = size
    while pos > 0:
        start = max(0, pos - block)
        fh.seek(start)
        chunk = fh.read(pos - start)
        idx = chunk.rfind(b"\n")
        if idx >= 0:
            return int(start + idx + 1)
        pos = start
    return 0


#: Formats whose output can be cut back and continued (Scrapy's own exporters).
EXACT_FORMATS = frozenset({"jsonlines", "jl", "jsonl", "json", "csv", "xml"})


@dataclass(frozen=True)
class ExactFeed:
    """A local feed file whose output is written once (``scheduling/feed_output.py``)."""

    #: The FEEDS key (the exporter's name for the feed).
    uri: str
    path: Path
    #: "host:absolute path": the feed's row in the frontier.
    key: str
    exporter: Any
    #: The project asked for the file to be overwritten (``-O``) at a new run.
    overwrite: bool


def exact_feeds(exporters: list[Any], hostname: str) -> tuple[list[ExactFeed], dict[str, str]]:
    """The feeds of ``exporters`` that can be written exactly once, and why each
    other one cannot (by FEEDS key)."""
    exact: list[ExactFeed] = []
    other: dict[str, str] = {}
    for exporter in exporters:
        for uri, options in getattr(exporter, "feeds", {}).items():
            why = _why_not_exact(exporter, uri, options)
            if why:
                other[uri] = why
                continue
            path = _local_path(uri)
            assert path is not None
            path = path.absolute()
            key = f"{hostname}:{path}"
            exact.append(ExactFeed(uri, path, key, exporter, bool(options.get("overwrite"))))
    return exact, other


def _why_not_exact(exporter: Any, uri: str, options: dict[str, Any]) -> str:
    if _local_path(uri) is None:
        if "%(" in uri:
            return "its URI changes from run to run (%(...)s parameters)"
        return "it is not a local file"
    fmt = options.get("format")
    if fmt not in EXACT_FORMATS:
        return f"format {fmt!r} cannot be resumed (one of {', '.join(sorted(EXACT_FORMATS))} can)"
    cls = getattr(exporter, "exporters", {}).get(fmt)
    if cls is None or not str(getattr(cls, "__module__", "")).startswith("scrapy."):
        return f"its exporter for {fmt!r} is the project's own, not Scrapy's"
    storage = getattr(exporter, "storages", {}).get("file" if uri.startswith("file:") else "")
    if storage is None or not str(getattr(storage, "__module__", "")).startswith("scrapy."):
        return "its FEED_STORAGES entry is the project's own, not Scrapy's"
    if options.get("batch_item_count"):
        return "it is written in batches (batch_item_count)"
    if options.get("postprocessing"):
        return "it is post-processed (postprocessing)"
    return ""


def exact_slot(feed: ExactFeed) -> Any | None:
    """The exporter's slot writing ``feed`` (once the spider is open)."""
    for slot in getattr(feed.exporter, "slots", ()):
        if getattr(slot, "uri_template", None) == feed.uri:
            return slot
    return None


def slot_position(slot: Any) -> tuple[int, int] | None:
    """(bytes on disk, items written) of a slot whose file is open; None before its
    first item. Call after :func:`flush_feeds`."""
    file = getattr(slot, "file", None)
    if file is None or not getattr(slot, "_fileloaded", False) or file.closed:
        return None
    return os.fstat(file.fileno()).st_size, int(slot.itemcount)


def resume_slot(slot: Any, items: int) -> None:
    """Continue ``slot``'s file, cut back to a position after ``items`` items of this
    run: open it for appending with its exporter marked as already started, so the
    next item follows the last one as in an uninterrupted run."""
    slot.file = slot.storage.open(slot.spider)
    options = slot.feed_options
    # (file, format) by position: Scrapy 2.13 names the second ``format``, 2.19 ``format_``.
    slot.exporter = slot._get_exporter(
        slot.file,
        options["format"],
        fields_to_export=options["fields"],
        encoding=options["encoding"],
        indent=options["indent"],
        **options["item_export_kwargs"],
    )
    slot._fileloaded = True
    slot._exporting = True
    slot.itemcount = items
    exporter = slot.exporter
    if hasattr(exporter, "first_item"):  # JsonItemExporter: "," before the next item
        exporter.first_item = False
    if hasattr(exporter, "_headers_not_written") and exporter.include_headers_line:
        # CsvItemExporter: the header is in the file; without FEED_EXPORT_FIELDS its
        # columns came from the first item, and the next rows follow them.
        exporter._headers_not_written = False
        if exporter.fields_to_export is None:
            exporter.fields_to_export = _csv_header(Path(slot.storage.path), exporter)
            exporter._autodetected_fields = True


def _csv_header(path: Path, exporter: Any) -> list[str]:
    with path.open("rb") as fh:
        first = fh.readline().decode(exporter.encoding or "utf-8")
    rows = list(csv.reader([first], dialect=exporter.csv_writer.dialect))
    return list(rows[0]) if rows else []
