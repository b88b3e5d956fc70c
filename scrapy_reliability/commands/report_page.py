"""The HTML page of ``scrapy frontier report``: one file that opens offline.

Chart.js (vendored in ``assets/``, MIT, see ``assets/README.md``), the page's own
script and style are inlined; the report's figures are one JSON document in a
``<script type="application/json">`` with ``<``, ``>`` and ``&`` escaped, so no stored
value (URLs and error texts come from the crawled sites) can end the element. The
page's script builds every table cell as a text node, never as HTML. A
Content-Security-Policy lets only these inline scripts run (by their SHA-256) and
forbids every network fetch.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from importlib import resources
from typing import Any

#: The vendored charting library and the page's own files, in ``commands/assets/``.
CHART_JS = "chart.umd.min.js"
PAGE_JS = "report.js"
PAGE_CSS = "report.css"

# What must not occur in an inline <script> or <style>: it would end it early (or open
# an HTML comment that changes how the parser finds its end).
_UNSAFE_INLINE = re.compile(r"</(script|style)|<!--", re.IGNORECASE)

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
<header>
<h1>{title}</h1>
<p id="meta" class="meta"></p>
<noscript><p class="note">This report draws its charts and tables with JavaScript:
allow scripts for this file.</p></noscript>
</header>
<nav>
<a href="#summary">Summary</a> <a href="#progress">Progress</a>
<a href="#outcomes">Outcomes</a> <a href="#errors">Error classes</a>
<a href="#domains">Domains</a> <a href="#pending">Oldest pending</a>
<a href="#dead">Dead letters</a>
</nav>
<main>
<section id="summary"><h2>Summary</h2><div id="summary-body"></div></section>
<section id="progress"><h2>Progress over time</h2>
<p class="note" id="progress-note"></p>
<div class="chart"><canvas id="chart-progress" aria-label="Progress over time"></canvas></div>
</section>
<section id="outcomes"><h2>Outcomes over time</h2>
<p class="note">Requests that reached a final state (done, ignored, dead), by when they got
there (their last change).</p>
<div class="chart"><canvas id="chart-outcomes" aria-label="Outcomes over time"></canvas></div>
</section>
<section id="errors"><h2>Error classes over time</h2>
<p class="note">Requests that failed at least once (whether they succeeded later or not),
by the time of their first failure, under the class of their last failure.</p>
<div class="chart"><canvas id="chart-failures" aria-label="Failures by class"></canvas></div>
<p class="note">Dead letters by when they were buried, per class (exact).</p>
<div class="chart"><canvas id="chart-dead" aria-label="Dead letters by class"></canvas></div>
</section>
<section id="domains"><h2>Domains</h2>
<div class="chart tall"><canvas id="chart-domains" aria-label="Requests per domain"></canvas></div>
<div id="domains-body"></div>
</section>
<section id="pending"><h2>Oldest pending requests</h2><div id="pending-body"></div></section>
<section id="dead"><h2>Dead letters</h2>
<p><label for="dead-filter">Filter</label>
<input id="dead-filter" type="search" placeholder="URL, domain, class, status or error text"
 autocomplete="off">
<span id="dead-count" class="meta"></span></p>
<div id="dead-body"></div>
</section>
</main>
<script type="application/json" id="report-data">{data}</script>
<script>{chart_js}</script>
<script>{page_js}</script>
</body>
</html>
"""


class ReportAssetMissing(Exception):
    """A file the page inlines is not installed with the package."""


def asset(name: str) -> str:
    """The text of ``commands/assets/NAME``, checked to be safe to inline."""
    try:
        text = (
            resources.files("scrapy_reliability.commands")
            .joinpath(f"assets/{name}")
            .read_text(encoding="utf-8")
        )
    except (FileNotFoundError, OSError):
        raise ReportAssetMissing(
            f"scrapy_reliability/commands/assets/{name} is missing from this installation "
            "of scrapy-reliability: reinstall it (pip install --force-reinstall "
            "scrapy-reliability)"
        ) from None
    if _UNSAFE_INLINE.search(text):
        raise ReportAssetMissing(f"assets/{name} cannot be inlined: it contains </script or <!--")
    return text


def embed_json(value: Any) -> str:
    """``value`` as JSON that is safe inside ``<script type="application/json">``: the
    characters HTML could read (``<``, ``>``, ``&``) and the JavaScript line separators
    are ``\\u`` escapes, which JSON.parse turns back into themselves."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, default=str)
    for char in ("&", "<", ">", "\u2028", "\u2029"):
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text


def _sha256(text: str) -> str:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def render(data: dict[str, Any], *, title: str) -> str:
    """The whole page for the report's figures ``data``."""
    chart_js = asset(CHART_JS)
    page_js = asset(PAGE_JS)
    css = asset(PAGE_CSS)
    csp = (
        "default-src 'none'; "
        f"script-src {_sha256(chart_js)} {_sha256(page_js)}; "
        f"style-src {_sha256(css)}; img-src data:; base-uri 'none'; form-action 'none'"
    )
    return _TEMPLATE.format(
        csp=html.escape(csp, quote=True),
        title=html.escape(title, quote=True),
        css=css,
        data=embed_json(data),
        chart_js=chart_js,
        page_js=page_js,
    )
