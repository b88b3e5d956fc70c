"""A deterministic, fault-injecting, multi-host HTTP site for tests and benchmarks.

Run it as a subprocess::

    python -m scrapy_reliability.testing.site --port PORT [options]

or through :class:`SiteProcess` from Python. Standard library only (asyncio streams).
This module is the command line and the names tests import; the site itself is
``site_config.py`` (options, faults, links, pages), ``site_server.py`` (the asyncio
server), ``site_limiter.py`` (the per-host rate limiters) and ``site_process.py`` (the
subprocess, a free port, the log, the control endpoints).

Contracts
---------
* Every host in ``--hosts`` is bound on the same ``--port``; which host a request is
  for is decided by the local address it arrived on (the ``Host`` header is ignored).
  Once all hosts are bound the process prints exactly ``READY <port>`` on stdout and
  flushes; it prints nothing else on stdout. SIGTERM and SIGINT make it exit 0 at once,
  dropping open connections. A bind failure exits with status 3 (message on stderr),
  bad options with status 2.
* Pages: ``/`` is an index linking to ``/p/0``; ``/p/<i>`` (``0 <= i < pages``, decimal,
  no leading zeros) links to ``/p/{2i+1}`` and ``/p/{2i+2}`` when they exist, to
  ``http://NEXTHOST:PORT/p/<i>`` (next host in the list, cyclically) and to
  ``--extra-links`` pseudo-random same-host pages chosen by a stable hash of the seed.
  Every page of every host is therefore reachable from the index pages.
  ``/status/<code>`` (three digits, 100 to 599 but 304; anything may follow after a
  ``/``, e.g. ``/status/503/a``, to make distinct URLs) answers that status every time
  (no fault counter, no Retry-After), with a short HTML body, and no body at all for
  ``/status/200``; ``/r/<path>`` redirects (301) to ``<path>``.
* A "page request" is any request except ``/robots.txt`` and ``/_control/...``. Each page
  request is decided *at arrival* (no await between arrival and decision), logged at once
  and only then delayed by ``--latency-ms`` (and a ``slow`` fault's delay). The checks run
  in this order: outage (503), host rate limiter (429), routing (404 for unknown paths),
  the page's fault. Requests answered by an outage or by the host limiter do not consume
  a page fault's counters.
* Faults are a pure function of ``(seed, host, page)``: see :func:`page_fault`. Per-URL
  fault counters live in memory and start at zero with each process.
* The log (``--log``) gets one JSON object per page request, written as one line and
  flushed immediately, and nothing else (no summary): ``{"t", "host", "path", "page",
  "status", "fault", "early", "ua", "authorization", "conditional"}``. ``t`` is
  ``time.time()`` at arrival; ``status`` is null for a TCP reset; ``fault`` names what
  shaped this response (a fault kind, ``"outage"`` or ``"host-rate"``), null for a
  normal response; ``early`` is true for a
  request that arrived while a Retry-After pause it must honour was still running.
* The host rate limiter (``--host-rate R``, 0: off; per host, decided at arrival with
  ``t`` as the time). ``--host-limiter window`` (the default): at most R requests
  (whole) in any trailing second, so a burst of R passes; the request above it gets
  429 with ``Retry-After: --retry-after`` and starts a pause of that many seconds in
  which every request of the host gets the same 429 (``early`` true) without
  extending it. ``--host-limiter bucket``: a token bucket of ``--host-burst`` tokens
  (default 1) refilled continuously at R > 0 tokens/s (R may be fractional); a request
  that finds a token takes it and goes on to routing, one that finds none gets 429
  with ``Retry-After: --host-retry-after`` (default 1). There is no pause: each
  request is decided on its own, so a client that ignores Retry-After just draws more
  429s; ``early`` is true for any request of the host (served or not) that arrives
  before the latest Retry-After the host gave ran out, counted from the 429's arrival.
  Both log 429s as ``"fault": "host-rate"``.
* Control endpoints (on every host; never logged, never limited, never in outage):
  ``/_control/health`` answers ``ok``; ``/_control/stats`` JSON ``{"requests",
  "by_status"}`` (page requests so far); ``/_control/outage?seconds=D`` starts an
  outage of D >= 0 seconds now, answering ``{"outage_seconds": D}``;
  ``/_control/host-rate?rate=R[&host=H]`` sets the limiter's rate of host H (every
  host without ``host``) from now on (bucket tokens earned so far are kept; a window
  pause running keeps its end), answering ``{"limiter", "host_rates": {host: rate}}``.
  R must be a finite number > 0, whole for ``window``; on a site started with
  ``--host-rate 0`` it turns the limit on for those hosts. Bad values (a missing,
  repeated or unknown parameter, a bad rate, an unknown host) answer 400 with the
  reason as text. :meth:`SiteProcess.set_host_rate` calls it.
* JavaScript pages (``--js-pages N``, off by default): every page ``i`` with
  ``i % N == 0`` is served as a page whose heading and links exist only once its
  script has run, ``--js-delay-ms`` after it starts (see :func:`is_js_page`). The
  script adds the same ``<h1 id="page">`` and links as a plain page, plus
  ``data-rendered`` (:func:`js_token`, computed by the script) and ``data-ua``
  (``navigator.userAgent``) on the heading: only a browser that ran it sees them.
  Status, faults and logging are those of the plain page.
* Variant links (``--variant-links NAME``, off by default): every page links to its
  children only by absolute URLs on host ``NAME`` spelled seven ways (plain, with
  tracking parameters, the host in upper case, the default port ``:80``, a fragment,
  the scheme in upper case: :func:`variant_links`), and to no other host. A client
  reaches them through the site as its HTTP proxy (absolute-form request targets);
  the query is ignored, so every variant is the same page and logs the same path.
* Index pages (``--index-pages``, off by default), as on a documentation site:
  ``/index.html`` is served as ``/`` (the same bytes), ``/p/<i>/`` and
  ``/p/<i>/index.html`` as ``/p/<i>``; the index links to ``/``, ``/index.html`` and
  ``/p/0/``, and every page to ``/`` and to each child as ``/p/c/`` and
  ``/p/c/index.html`` (:func:`page_links`), to no other host. The log names the path
  requested, with the page it was served as.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import pathlib
import sys
from collections.abc import Sequence

from scrapy_reliability.testing.site_config import (
    DEFAULT_HOSTS,
    FAULT_KINDS,
    LIMITER_KINDS,
    SiteConfig,
    is_js_page,
    js_token,
    page_fault,
    page_links,
    variant_links,
)
from scrapy_reliability.testing.site_process import MODULE, SiteProcess, free_port, max_per_window
from scrapy_reliability.testing.site_server import _serve_forever

__all__ = [
    "DEFAULT_HOSTS",
    "FAULT_KINDS",
    "LIMITER_KINDS",
    "SiteConfig",
    "SiteProcess",
    "free_port",
    "is_js_page",
    "js_token",
    "main",
    "max_per_window",
    "page_fault",
    "page_links",
    "parse_args",
    "variant_links",
]


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(
            "port must be 1..65535 (0 is not allowed: all hosts share it)"
        )
    return value


def _rate(text: str) -> float:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _build_parser() -> argparse.ArgumentParser:
    d = SiteConfig()
    p = argparse.ArgumentParser(
        prog=f"python -m {MODULE}", description="Fault-injecting local multi-host HTTP site."
    )
    p.add_argument("--port", type=_port, required=True, help="port shared by every host")
    p.add_argument("--hosts", type=_csv, default=d.hosts, help="comma-separated bind addresses")
    p.add_argument("--pages", type=int, default=d.pages, help="pages per host")
    p.add_argument("--extra-links", type=int, default=d.extra_links, help="extra links per page")
    p.add_argument("--heavy-links", type=int, default=d.heavy_links, help="links of page 0")
    p.add_argument("--latency-ms", type=float, default=d.latency_ms, help="delay per response")
    p.add_argument("--crawl-delay", type=float, default=None, help="serve robots.txt with it")
    p.add_argument("--robots-redirect", default=None, help="host whose robots.txt all serve")
    p.add_argument("--fault-rate", type=float, default=d.fault_rate, help="faulty page share")
    p.add_argument("--faults", type=_csv, default=d.faults, help="enabled fault kinds")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of every stable hash")
    p.add_argument("--retry-after", type=int, default=d.retry_after, help="429 pause seconds")
    p.add_argument("--slow-times", type=int, default=d.slow_times, help="slow answers per URL")
    p.add_argument("--slow-seconds", type=float, default=d.slow_seconds, help="slow delay")
    p.add_argument("--outage-start", type=float, default=None, help="seconds after READY")
    p.add_argument("--outage-seconds", type=float, default=d.outage_seconds, help="length")
    p.add_argument("--host-rate", type=_rate, default=d.host_rate, help="per host/s (0 off)")
    p.add_argument("--host-limiter", choices=LIMITER_KINDS, default=d.host_limiter)
    p.add_argument("--host-burst", type=float, default=d.host_burst, help="bucket tokens")
    p.add_argument(
        "--host-retry-after", type=int, default=d.host_retry_after, help="bucket's 429 seconds"
    )
    p.add_argument("--log", type=pathlib.Path, default=None, help="JSON-lines request log")
    p.add_argument("--js-pages", type=int, default=d.js_pages, help="every Nth page by script")
    p.add_argument("--js-delay-ms", type=float, default=d.js_delay_ms, help="script's delay")
    p.add_argument(
        "--variant-links", default=None, metavar="NAME", help="link by URL variants on NAME"
    )
    p.add_argument("--validators", action="store_true", help="ETag, Last-Modified and 304 answers")
    p.add_argument("--index-pages", action="store_true", help="/index.html and /p/<i>/ pages")
    return p


def parse_args(argv: Sequence[str] | None = None) -> SiteConfig:
    """Parse command-line options into a SiteConfig (exits with status 2 on bad options)."""
    parser = _build_parser()
    ns = parser.parse_args(argv)
    try:
        return SiteConfig(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(SiteConfig)})
    except ValueError as exc:
        parser.error(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: serve until SIGTERM/SIGINT; returns the process exit status."""
    config = parse_args(argv)
    with contextlib.ExitStack() as stack:
        log = None
        if config.log is not None:
            # Line-buffered and flushed per record: readable while the site runs.
            log = stack.enter_context(open(config.log, "a", buffering=1, encoding="utf-8"))
        return asyncio.run(_serve_forever(config, log))


if __name__ == "__main__":
    sys.exit(main())
