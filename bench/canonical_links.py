"""The canonical URL policy on a corpus of links with fragments: how many take the fast
path (no w3lib ``canonicalize_url``) and the time per link, the policy as it was (a
fragment sent every link through canonicalize_url) against the policy now (the
fragment cut first), in the same run, on the same links.

The corpus is generated (``--seed``): the links a crawl of a documentation site, a
blog and a shop yields, as Scrapy hands them over (absolute, made safe): section
links (``page.html#section``, ``#module-os``, ``#id3``), index pages (``/3/``,
``/3/index.html``), search and listing pages with query strings (sorted and not),
tracking parameters, a few spelled with an upper-case host or percent-escapes, and
links repeated as navigation repeats them.

Method: each round times every variant over the whole corpus (the order rotated by
round), in this process; figures are medians of the rounds, the ratio new/old is
per round. Every link must get the same canonical URL from both (else exit 1).

    python bench/canonical_links.py [--links 20000] [--repeat 7] [--seed 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from w3lib.url import canonicalize_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scrapy_reliability.canonical import (
    _W3LIB_AGREES,
    CanonicalPolicy,
    _known_canonical,
    _w3lib_keeps,
)

DOCS = "https://docs.example.org"
MODULES = [
    "os", "os.path", "sys", "json", "re", "asyncio-task", "asyncio-stream", "pathlib",
    "functools", "itertools", "collections", "typing", "dataclasses", "subprocess",
    "urllib.parse", "http.client", "logging", "unittest", "sqlite3", "datetime",
]  # fmt: skip
WORDS = ["quick", "guide", "release", "notes", "tuning", "crawl", "python", "data", "web"]


def _docs_link(rng: random.Random) -> str:
    module = (
        rng.choice(MODULES) if rng.random() < 0.5 else f"{rng.choice(WORDS)}{rng.randint(1, 300)}"
    )
    version = rng.choice(["3", "3", "3", "3.12", "3.13"])
    page = f"{DOCS}/{version}/library/{module}.html"
    kind = rng.random()
    if kind < 0.45:  # a section or an object of the page
        anchor = rng.choice(
            [f"module-{module}", f"{module}.{rng.choice(WORDS)}", f"id{rng.randint(1, 40)}"]
        )
        return f"{page}#{anchor}"
    if kind < 0.55:  # the search page, its query as the form writes it (not sorted)
        return f"{DOCS}/{version}/search.html?q={rng.choice(WORDS)}&check_keywords=yes&area=default"
    if kind < 0.65:
        return f"{page}?highlight={rng.choice(WORDS)}#{module}.{rng.choice(WORDS)}"
    if kind < 0.80:  # index pages, as navigation links them
        return rng.choice(
            [
                f"{DOCS}/{version}/",
                f"{DOCS}/{version}/index.html",
                f"{DOCS}/{version}/library/index.html",
                f"{DOCS}/{version}/genindex.html#{rng.choice('ABCDEFGHIJ')}",
                f"{DOCS}/{version}/contents.html#toc",
            ]
        )
    return page


def _blog_link(rng: random.Random) -> str:
    month, slug = (
        rng.randint(1, 12),
        f"{rng.choice(WORDS)}-{rng.choice(WORDS)}-{rng.randint(1, 99)}",
    )
    post = f"https://blog.example.com/2025/{month:02d}/{slug}/"
    kind = rng.random()
    if kind < 0.3:
        return post + rng.choice(["#comments", "#respond", f"#comment-{rng.randint(1, 900)}"])
    if kind < 0.45:
        return (
            post
            + "?utm_source=newsletter&utm_medium=email&utm_campaign=w"
            + str(rng.randint(1, 52))
        )
    if kind < 0.55:
        return f"https://blog.example.com/page/{rng.randint(2, 40)}/"
    if kind < 0.6:
        return f"https://Blog.Example.com/tag/{rng.choice(WORDS)}/#main"
    return post


def _shop_link(rng: random.Random) -> str:
    category = f"https://shop.example.com/c/{rng.choice(WORDS)}-{rng.randint(1, 30)}"
    kind = rng.random()
    if kind < 0.3:
        return f"{category}?page={rng.randint(2, 9)}&sort=price"
    if kind < 0.45:
        return f"{category}?sort=price&page={rng.randint(2, 9)}"  # not sorted: w3lib sorts
    if kind < 0.65:
        item = f"https://shop.example.com/p/{rng.randint(1000, 9999)}"
        return item + rng.choice(["#reviews", "#details", "#size-guide", ""])
    if kind < 0.7:
        return f"https://shop.example.com/search?q=caf%C3%A9+{rng.choice(WORDS)}"
    return category


def corpus(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    links: list[str] = []
    while len(links) < n:
        site = rng.random()
        link = _docs_link(rng) if site < 0.6 else _blog_link(rng) if site < 0.8 else _shop_link(rng)
        # Navigation repeats links: some come again at once.
        links.extend([link] * (rng.choice([1, 1, 1, 2, 3]) if site < 0.6 else 1))
    return links[:n]


def old_canonical_url(policy: CanonicalPolicy, url: str) -> str:
    """``CanonicalPolicy.canonical_url`` as it was: a URL with a fragment went
    through canonicalize_url, since the fast path's check saw the "#"."""
    canonical = url if _W3LIB_AGREES and _w3lib_keeps(url) else str(canonicalize_url(url))
    if not policy.domains:
        fast = policy._plain(canonical)
        if fast is not None:
            return fast
    return policy._finish(canonical)


def _time(fn: Callable[[str], object], links: list[str]) -> float:
    start = time.perf_counter()
    for url in links:
        fn(url)
    return (time.perf_counter() - start) / len(links) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--links", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    links = corpus(args.links, args.seed)
    policy = CanonicalPolicy()
    if not _W3LIB_AGREES:
        print("the w3lib installed differs from what the fast path expects: no fast path")
    with_fragment = [u for u in links if "#" in u]
    old_fast = sum(1 for u in links if _W3LIB_AGREES and _w3lib_keeps(u))
    new_fast = sum(1 for u in links if _known_canonical(u) is not None)
    new_fast_fragment = sum(1 for u in with_fragment if _known_canonical(u) is not None)
    differ = [u for u in links if old_canonical_url(policy, u) != policy.canonical_url(u)]

    old = lambda u: old_canonical_url(policy, u)  # noqa: E731
    # (name, function, links): the whole corpus, then its links with a fragment alone.
    variants: list[tuple[str, Callable[[str], object], list[str]]] = [
        ("canonicalize_url alone", canonicalize_url, links),
        ("old", old, links),
        ("new", policy.canonical_url, links),
        ("old, with a fragment", old, with_fragment),
        ("new, with a fragment", policy.canonical_url, with_fragment),
    ]
    times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for r in range(args.repeat):
        for name, fn, subset in variants[r % len(variants) :] + variants[: r % len(variants)]:
            times[name].append(_time(fn, subset))
    median = {name: statistics.median(t) for name, t in times.items()}

    def ratios(new: str, old: str) -> str:
        per_round = [n / o for n, o in zip(times[new], times[old], strict=True)]
        rounds = " ".join(f"{x:.2f}" for x in per_round)
        return f"{statistics.median(per_round):.2f} (rounds: {rounds})"

    n = len(links)

    def share(k: float) -> str:
        return f"{100 * k / n:.1f}%"

    print(
        f"corpus: {n:,} links (seed {args.seed}), {len(set(links)):,} distinct: "
        f"{share(len(with_fragment))} with a fragment, {share(sum('?' in u for u in links))} "
        f"with a query, {share(sum(u.endswith(('/', 'index.html')) for u in links))} index pages"
    )
    print(
        f"fast path taken: old {share(old_fast)}, new {share(new_fast)} "
        f"(links with a fragment: 0.0% -> {100 * new_fast_fragment / len(with_fragment):.1f}%)"
    )
    print(f"us/link, median of {args.repeat} rounds:")
    for name, _, _ in variants:
        print(f"  {name:24s} {median[name]:6.2f}")
    print(f"new/old, every link:          {ratios('new', 'old')}")
    print(f"new/old, links with fragment: {ratios('new, with a fragment', 'old, with a fragment')}")
    print(f"same canonical URL for every link: {'yes' if not differ else 'NO'}")
    for url in differ[:5]:
        print(f"  differs: {url}: {old_canonical_url(policy, url)} != {policy.canonical_url(url)}")
    if args.json is not None:
        result = {
            "links": n,
            "seed": args.seed,
            "with_fragment": len(with_fragment),
            "fast_old": old_fast,
            "fast_new": new_fast,
            "us_per_link": median,
            "rounds": times,
            "differ": len(differ),
        }
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
