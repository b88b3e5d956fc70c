"""What the test site serves: its options (:class:`SiteConfig`) and everything they
determine, the same in every process: which page has which fault, each page's links
and HTML, which pages need JavaScript. See :mod:`scrapy_reliability.testing.site`
for the contracts."""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
from dataclasses import dataclass
from typing import Final, Literal

LimiterKind = Literal["window", "bucket"]

FAULT_KINDS: Final[tuple[str, ...]] = ("500x3", "429", "reset", "truncate", "slow", "404")
"""Every fault kind, in canonical order (the order :func:`page_fault` chooses among)."""

DEFAULT_HOSTS: Final[tuple[str, ...]] = ("127.0.0.2", "127.0.0.3", "127.0.0.4")

LIMITER_KINDS: Final[tuple[LimiterKind, ...]] = ("window", "bucket")
"""The per-host limiters of ``--host-limiter`` (see :mod:`scrapy_reliability.testing.site`)."""


def host_rate_error(kind: str, rate: float, *, allow_off: bool) -> str | None:
    """Why ``rate`` is not a valid per-host rate for limiter ``kind``; None if it is.

    A ``window`` rate is a whole number of requests per trailing second, a ``bucket``
    rate any finite number of requests per second above 0. ``allow_off`` admits 0 (no
    limit), which only ``--host-rate`` of the window limiter means.
    """
    if not math.isfinite(rate) or rate < 0 or (rate == 0 and not allow_off):
        low = ">= 0 (0: no limit)" if allow_off else "> 0"
        return f"host rate must be a finite number {low}, not {rate!r}"
    if kind == "window" and not float(rate).is_integer():
        return f"host rate of the window limiter must be a whole number, not {rate!r}"
    return None


def _stable_hash(*parts: object) -> int:
    """A 64-bit hash of ``parts`` that is the same in every process and Python version."""
    data = "\x1f".join(str(p) for p in parts).encode("utf-8")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


@dataclass(frozen=True)
class SiteConfig:
    """Every command-line option of the site, with the same defaults.

    ``port=0`` is allowed here only as "not chosen yet": :class:`SiteProcess` replaces it
    with :func:`free_port`; :meth:`argv` refuses it. ``faults`` is normalised to
    :data:`FAULT_KINDS` order without duplicates, so the order given does not matter.
    ``outage_start``/``outage_seconds`` schedule one outage relative to READY; both or
    neither must be set. ``log`` is the JSON-lines request log, or None for no log.
    ``js_pages``/``js_delay_ms``: JavaScript pages (0: none). ``host_limiter`` chooses
    the per-host limiter: ``window`` (``host_rate`` whole, 0: none; a 429 pauses the
    host for ``retry_after``) or ``bucket`` (``host_rate`` > 0 tokens/s, ``host_burst``
    tokens, ``Retry-After: host_retry_after``; ``host_burst`` and ``host_retry_after``
    are for the bucket only). Invalid values raise ValueError.
    """

    port: int = 0
    hosts: tuple[str, ...] = DEFAULT_HOSTS
    pages: int = 800
    extra_links: int = 0
    #: Page 0 of each host also links to every page 1..heavy_links (a heavy page).
    heavy_links: int = 0
    latency_ms: float = 0.0
    crawl_delay: float | None = None
    #: A host of the site: every other host's /robots.txt redirects (301) to its own.
    robots_redirect: str | None = None
    fault_rate: float = 0.0
    faults: tuple[str, ...] = FAULT_KINDS
    seed: int = 0
    retry_after: int = 3
    slow_times: int = 2
    slow_seconds: float = 4.0
    outage_start: float | None = None
    outage_seconds: float = 0.0
    host_rate: float = 0
    host_limiter: LimiterKind = "window"
    host_burst: float = 1.0
    host_retry_after: int = 1
    log: pathlib.Path | None = None
    js_pages: int = 0
    js_delay_ms: float = 0.0
    #: A host name (e.g. ``site.test``): pages link to their children only by absolute
    #: URLs on it, spelled several ways (see :func:`variant_links`). The crawl then
    #: reaches the site as its HTTP proxy (``http_proxy=http://HOST:PORT``).
    variant_links: str | None = None
    #: Pages carry an ETag and a Last-Modified, and a conditional request for an
    #: unchanged page is answered 304. ``/_control/change?every=K`` changes every
    #: K-th page (a new version: another body, ETag and Last-Modified).
    validators: bool = False
    #: Directory pages, as a documentation site has them: ``/index.html`` is served as
    #: ``/``, ``/p/<i>/`` and ``/p/<i>/index.html`` as ``/p/<i>`` (see
    #: :func:`page_links` for the links).
    index_pages: bool = False

    def __post_init__(self) -> None:
        hosts = tuple(self.hosts)
        faults = tuple(self.faults)
        unknown = sorted(set(faults) - set(FAULT_KINDS))
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
        object.__setattr__(self, "hosts", hosts)
        object.__setattr__(self, "faults", tuple(k for k in FAULT_KINDS if k in faults))
        if self.log is not None:
            object.__setattr__(self, "log", pathlib.Path(self.log))
        if not hosts or any(not h or "," in h for h in hosts) or len(set(hosts)) != len(hosts):
            raise ValueError(f"hosts must be distinct non-empty names: {hosts!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port out of range: {self.port}")
        if self.pages < 1:
            raise ValueError("pages must be >= 1")
        if self.extra_links < 0:
            raise ValueError("extra_links must be >= 0")
        if not 0 <= self.heavy_links < self.pages:
            raise ValueError("heavy_links must be >= 0 and below pages")
        if not 0.0 <= self.fault_rate <= 1.0:
            raise ValueError("fault_rate must be within [0, 1]")
        if self.retry_after < 1:
            raise ValueError("retry_after must be >= 1 second")
        if self.slow_times < 0:
            raise ValueError("slow_times must be >= 0")
        self._check_host_limiter()
        if min(self.latency_ms, self.slow_seconds, self.outage_seconds) < 0:
            raise ValueError("latency_ms, slow_seconds and outage_seconds must be >= 0")
        if self.crawl_delay is not None and self.crawl_delay < 0:
            raise ValueError("crawl_delay must be >= 0")
        if self.robots_redirect is not None and self.robots_redirect not in self.hosts:
            raise ValueError("robots_redirect must be one of the hosts")
        if (self.outage_start is None) != (self.outage_seconds == 0):
            raise ValueError("outage_start and a positive outage_seconds go together")
        if self.outage_start is not None and self.outage_start < 0:
            raise ValueError("outage_start must be >= 0")
        if self.js_pages < 0 or self.js_delay_ms < 0:
            raise ValueError("js_pages and js_delay_ms must be >= 0")
        name = self.variant_links
        if name is not None and (not name or not all(c.isalnum() or c in ".-" for c in name)):
            raise ValueError(f"variant_links must be a host name like 'site.test': {name!r}")

    def _check_host_limiter(self) -> None:
        kind = self.host_limiter
        if kind not in LIMITER_KINDS:
            raise ValueError(f"host_limiter must be one of {', '.join(LIMITER_KINDS)}: {kind!r}")
        error = host_rate_error(kind, self.host_rate, allow_off=kind == "window")
        if error is not None:
            raise ValueError(f"{error} (host_limiter={kind!r})")
        if not (math.isfinite(self.host_burst) and self.host_burst >= 1):
            raise ValueError(f"host_burst must be a finite number >= 1, not {self.host_burst!r}")
        if not (self.host_retry_after >= 0 and float(self.host_retry_after).is_integer()):
            raise ValueError(
                f"host_retry_after must be a whole number of seconds >= 0, "
                f"not {self.host_retry_after!r}"
            )
        if kind == "window" and (self.host_burst != 1 or self.host_retry_after != 1):
            raise ValueError(
                "host_burst and host_retry_after are for host_limiter='bucket' only "
                "(the window limiter pauses a host for retry_after)"
            )

    def argv(self) -> list[str]:
        """Command-line arguments that make the site run with exactly this config.

        ``parse_args(config.argv()) == config`` holds. Raises ValueError if port is 0.
        """
        if self.port == 0:
            raise ValueError(
                "SiteConfig.port is 0: choose a port (SiteProcess does, via free_port)"
            )
        args = [
            f"--port={self.port}",
            f"--hosts={','.join(self.hosts)}",
            f"--pages={self.pages}",
            f"--extra-links={self.extra_links}",
            f"--heavy-links={self.heavy_links}",
            f"--latency-ms={self.latency_ms!r}",
            f"--fault-rate={self.fault_rate!r}",
            f"--faults={','.join(self.faults)}",
            f"--seed={self.seed}",
            f"--retry-after={self.retry_after}",
            f"--slow-times={self.slow_times}",
            f"--slow-seconds={self.slow_seconds!r}",
            f"--host-rate={self.host_rate!r}",
        ]
        if self.host_limiter != "window":
            args += [
                f"--host-limiter={self.host_limiter}",
                f"--host-burst={self.host_burst!r}",
                f"--host-retry-after={self.host_retry_after}",
            ]
        if self.crawl_delay is not None:
            args.append(f"--crawl-delay={self.crawl_delay!r}")
        if self.robots_redirect is not None:
            args.append(f"--robots-redirect={self.robots_redirect}")
        if self.outage_start is not None:
            args += [
                f"--outage-start={self.outage_start!r}",
                f"--outage-seconds={self.outage_seconds!r}",
            ]
        if self.log is not None:
            args.append(f"--log={self.log}")
        if self.js_pages:
            args.append(f"--js-pages={self.js_pages}")
        if self.js_delay_ms:
            args.append(f"--js-delay-ms={self.js_delay_ms!r}")
        if self.variant_links is not None:
            args.append(f"--variant-links={self.variant_links}")
        if self.validators:
            args.append("--validators")
        if self.index_pages:
            args.append("--index-pages")
        return args


def page_fault(config: SiteConfig, host: str, i: int) -> str | None:
    """The fault kind of page ``i`` of ``host``, or None; exactly what the server applies.

    A page is faulty iff ``blake2b(seed, "fault", host, i) % 10000 < fault_rate * 10000``;
    its kind is ``config.faults[blake2b(seed, "kind", host, i) % len(config.faults)]``.
    Page 0 (and anything outside ``1 <= i < pages``) is never faulty. The result does not
    depend on ``pages`` (for pages that exist), on PYTHONHASHSEED or on the process.
    """
    if i <= 0 or i >= config.pages or not config.faults or config.fault_rate <= 0.0:
        return None
    if _stable_hash(config.seed, "fault", host, i) % 10000 >= config.fault_rate * 10000:
        return None
    return config.faults[_stable_hash(config.seed, "kind", host, i) % len(config.faults)]


def status_answer(path: str) -> tuple[int, bytes] | None:
    """The status and body of ``/status/<code>[/<anything>]`` (a three-digit code from
    100 to 599, not 304): that status every time, no body for 200; None for any
    other path."""
    parts = path.split("/", 3)
    if len(parts) < 3 or parts[1] != "status" or not parts[2].isdigit() or len(parts[2]) != 3:
        return None
    code = int(parts[2])
    if not 100 <= code <= 599 or code == 304:
        return None
    return code, b"" if code == 200 else f"status {code}\n".encode()


def page_links(config: SiteConfig, host: str, i: int) -> list[str]:
    """The hrefs of page ``i`` of ``host``, in document order (requires ``0 <= i < pages``).

    Children ``/p/{2i+1}``, ``/p/{2i+2}`` (when they exist), then the absolute link to the
    same page on the next host, then ``extra_links`` relative same-host links. With
    ``index_pages``: the home page ``/``, then each child twice, as its directory
    ``/p/c/`` and as ``/p/c/index.html``, and nothing else.
    """
    if not 0 <= i < config.pages:
        raise ValueError(f"no page {i}")
    children = [c for c in (2 * i + 1, 2 * i + 2) if c < config.pages]
    if config.index_pages:
        return ["/", *(f"/p/{c}/{name}" for c in children for name in ("", "index.html"))]
    if config.variant_links is not None:
        return [link for c in children for link in variant_links(config.variant_links, c, i)]
    links = [f"/p/{c}" for c in children]
    index = config.hosts.index(host)
    next_host = config.hosts[(index + 1) % len(config.hosts)]
    links.append(f"http://{next_host}:{config.port}/p/{i}")
    links.extend(
        f"/p/{_stable_hash(config.seed, 'extra', host, i, k) % config.pages}"
        for k in range(config.extra_links)
    )
    if i == 0 and config.heavy_links:
        links.extend(f"/p/{k}" for k in range(1, config.heavy_links + 1))
    return links


def variant_links(name: str, c: int, i: int) -> list[str]:
    """The links of page ``i`` to its child ``c`` with ``--variant-links NAME``
    (rotated by ``c``): the plain ``http://NAME/p/c`` and the same page with
    tracking parameters (utm_*, fbclid and gclid, _ga and mc_eid), the host in upper
    case, the default port ``:80``, a fragment, and the scheme in upper case. The
    site serves each as the same page (the query is ignored, a fragment is never
    sent)."""
    plain = f"http://{name}/p/{c}"
    links = [
        plain,
        f"{plain}?utm_source=site&utm_medium=link&utm_campaign=p{i}",
        f"{plain}?fbclid=IwAR{i}x{c}&gclid=Cj0K{i}",
        f"http://{name.upper()}/p/{c}",
        f"http://{name}:80/p/{c}",
        f"{plain}#from-{i}",
        f"HTTP://{name}/p/{c}?_ga=2.{i}.{c}&mc_eid={i}",
    ]
    # Rotated, so that a different spelling comes first (is fetched) for each child.
    k = c % len(links)
    return links[k:] + links[:k]


def _render_page(config: SiteConfig, host: str, i: int) -> bytes:
    anchors = "\n".join(f'<a href="{href}">{href}</a>' for href in page_links(config, host, i))
    return (
        f"<html><head><title>{host} p {i}</title></head><body>"
        f'<h1 id="page" data-host="{host}" data-page="{i}">{host} page {i}</h1>\n'
        f"{anchors}\n</body></html>\n"
    ).encode()


def versioned(body: bytes, i: int, version: int) -> bytes:
    """Page ``i``'s body after ``/_control/change`` made ``version`` of it (0: the
    original): a line naming the version and a link to a new URL of the page."""
    if not version:
        return body
    extra = f'<p>version {version}</p><a href="/p/{i}?v={version}">v{version}</a></body>'
    return body.replace(b"</body>", extra.encode())


def is_js_page(config: SiteConfig, i: int) -> bool:
    """Whether page ``i`` is a JavaScript page (``js_pages`` divides ``i``)."""
    return config.js_pages > 0 and 0 <= i < config.pages and i % config.js_pages == 0


def js_token(host: str, i: int) -> str:
    """What the script of JavaScript page ``i`` of ``host`` puts in ``data-rendered``.

    A rolling hash of ``"HOST/i"`` that the script computes when it runs: it is not
    in the page's source.
    """
    h = 7
    for ch in f"{host}/{i}":
        h = (h * 31 + ord(ch)) % 1000003
    return f"js-{h}"


def _render_js_page(config: SiteConfig, host: str, i: int) -> bytes:
    data = json.dumps({"host": host, "page": i, "links": page_links(config, host, i)})
    delay = max(0, round(config.js_delay_ms))
    script = (
        "(function () {\n"
        f"  var d = {data};\n"
        "  function token(s) {\n"
        "    var h = 7;\n"
        "    for (var k = 0; k < s.length; k++) { h = (h * 31 + s.charCodeAt(k)) % 1000003; }\n"
        '    return "js-" + h;\n'
        "  }\n"
        "  setTimeout(function () {\n"
        '    var h1 = document.createElement("h1");\n'
        '    h1.id = "page";\n'
        '    h1.setAttribute("data-host", d.host);\n'
        '    h1.setAttribute("data-page", String(d.page));\n'
        '    h1.setAttribute("data-rendered", token(d.host + "/" + d.page));\n'
        '    h1.setAttribute("data-ua", navigator.userAgent);\n'
        '    h1.textContent = d.host + " page " + d.page;\n'
        "    document.body.appendChild(h1);\n"
        "    d.links.forEach(function (href) {\n"
        '      var a = document.createElement("a");\n'
        "      a.href = href;\n"
        "      a.textContent = href;\n"
        "      document.body.appendChild(a);\n"
        "    });\n"
        f"  }}, {delay});\n"
        "})();\n"
    )
    return (
        f"<html><head><title>{host} p {i}</title></head><body>"
        "<noscript>This page needs JavaScript.</noscript>\n"
        f"<script>\n{script}</script>\n</body></html>\n"
    ).encode()


def index_links(config: SiteConfig) -> list[str]:
    """The hrefs of the index page ``/``: ``/p/0``; with ``index_pages`` the index
    itself twice (``/`` and ``/index.html``, as a documentation home page links to
    itself) and ``/p/0/``."""
    return ["/", "/index.html", "/p/0/"] if config.index_pages else ["/p/0"]


def page_index(path: str, pages: int) -> int | None:
    """The page ``/p/<i>`` is (decimal, no leading zeros, ``i < pages``), or None."""
    if not path.startswith("/p/"):
        return None
    digits = path[3:]
    if not digits.isdigit() or not digits.isascii() or (len(digits) > 1 and digits[0] == "0"):
        return None
    i = int(digits)
    return i if i < pages else None


def served_path(config: SiteConfig, path: str) -> str:
    """The path a request is answered as: with ``index_pages``, ``/index.html`` is
    ``/``, and ``/p/<i>/`` and ``/p/<i>/index.html`` are ``/p/<i>``."""
    if not config.index_pages:
        return path
    if path == "/index.html":
        return "/"
    if path.startswith("/p/") and path.endswith(("/", "/index.html")):
        return path[: path.rindex("/")]
    return path


def _render_index(config: SiteConfig, host: str) -> bytes:
    anchors = "\n".join(f'<a href="{href}">{href}</a>' for href in index_links(config))
    return (
        f"<html><head><title>{host} index</title></head><body>"
        f'<h1 id="index" data-host="{host}">{host} index</h1>\n'
        f"{anchors}\n</body></html>\n"
    ).encode()
