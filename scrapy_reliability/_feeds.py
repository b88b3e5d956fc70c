"""Items written by Scrapy's feed exports count as settled only once flushed.

The frontier acks a request only after its items reached the feed file; these
helpers flush the open feeds before every ack batch, and repair a line-based
feed whose last line a kill -9 cut in half, so a resumed run appends cleanly.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import IO, Any

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
    if "://" in uri:
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
