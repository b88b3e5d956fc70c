"""Scrapy's feed exports, as the frontier needs them: which local feeds can be written
exactly once (:func:`exact_feeds`), and a line-based feed whose last line a kill -9 cut
in half repaired. What touches the internals of Scrapy's FeedExporter, its slots and
its exporters (flushing them before every ack batch, continuing a file cut back to its
last committed position) is in ``scheduling/engine.py``, the one module that may.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

LINE_FORMATS = frozenset({"jsonlines", "jl", "jsonl", "csv"})


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
