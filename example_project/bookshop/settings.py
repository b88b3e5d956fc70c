"""Settings of the bookshop project.

The first setting is the only one scrapy-reliability needs: with it, ``scrapy crawl``
keeps its frontier (every request, and whether it is done) in a transactional SQLite
database. Run with ``-s JOBDIR=crawls/NAME`` and the database is
``crawls/NAME/reliability.sqlite``; a crawl that is killed, even with kill -9, resumes
where it stopped when the same command is run again.
"""

ADDONS = {"scrapy_reliability.Addon": 0}

BOT_NAME = "bookshop"
SPIDER_MODULES = ["bookshop.spiders"]
NEWSPIDER_MODULE = "bookshop.spiders"

USER_AGENT = "bookshop (scrapy-reliability example project)"

# The demo site serves no robots.txt. Set this to True for a site you do not own.
ROBOTSTXT_OBEY = False

# Polite but fast, for a site on this machine. For somebody else's site, lower the
# concurrency and add DOWNLOAD_DELAY = 1.0 or AUTOTHROTTLE_ENABLED = True.
# At most CONCURRENT_REQUESTS requests are in flight (fetched, not yet recorded as done),
# so a crash makes at most that many pages be fetched again (demo.py checks this).
CONCURRENT_REQUESTS = 16
CONCURRENT_REQUESTS_PER_DOMAIN = 8
DOWNLOAD_DELAY = 0.0
DOWNLOAD_TIMEOUT = 30
# Per-domain limits held by the frontier across every worker. The demo site is on
# this machine; for somebody else's site keep the polite defaults (4 requests/s, 4
# at once) or set RELIABILITY_DOMAINS = {"example.com": {"rate": 1, "concurrency": 2}}.
RELIABILITY_DOMAIN_RATE = 100
RELIABILITY_DOMAIN_CONCURRENCY = 8
# Retries are scrapy-reliability's: the same frontier row, after a backoff or the
# server's Retry-After, at most this many attempts in all.
RELIABILITY_MAX_ATTEMPTS = 4

TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"

# Appended to, never overwritten: a resumed crawl adds the pages it has not written yet.
# (A kill -9 can leave half a line at the end; the next run cuts it before appending.)
# Pages and dead letters (requests that failed for good) go to separate files.
FEEDS = {
    "output/pages.jsonl": {
        "format": "jsonlines",
        "encoding": "utf-8",
        "overwrite": False,
        "item_classes": ["bookshop.items.PageItem"],
    },
    "output/dead.jsonl": {
        "format": "jsonlines",
        "encoding": "utf-8",
        "overwrite": False,
        "item_classes": ["scrapy_reliability.DeadLetter"],
    },
}
FEED_EXPORT_ENCODING = "utf-8"

# Scrapy's remote-control HTTP server leaves a job file behind in the user's profile
# each time a crawl is killed with kill -9; the demo does that, so it is off here.
REMOTE_CONTROL_ENABLED = False
