"""Text for people: times, durations, sizes, clipped cells and aligned tables."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def when(ts: float, now: float) -> str:
    relative = f"in {ago(ts - now)}" if ts > now else f"{ago(now - ts)} ago"
    return f"{iso(ts)} ({relative})"


def size(n: int) -> str:
    """Bytes as people read them: ``512 B``, ``1.5 KB``, ``11.4 GB``."""
    value = float(n)
    for unit in ("B", "KB", "MB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def clip(value: Any, width: int) -> str:
    text_ = "" if value is None else str(value).replace("\n", " ")
    return text_ if len(text_) <= width else text_[: width - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [
        all(isinstance(r[i], (int, float)) for r in rows) and bool(rows)
        for i in range(len(headers))
    ]
    lines = []
    for row in cells:
        lines.append(
            "  ".join(
                cell.rjust(widths[i]) if numeric[i] else cell.ljust(widths[i])
                for i, cell in enumerate(row)
            ).rstrip()
        )
    return "\n".join(lines)
