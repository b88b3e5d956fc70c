"""A plain Scrapy project, with the frontier turned on by one line."""

BOT_NAME = "pages"
SPIDER_MODULES = ["pages.spiders"]
ADDONS = {"scrapy_reliability.Addon": 0}
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
ITEM_PIPELINES = {"pages.pipelines.ItemsToFile": 300}
# Off unless a test sets CLAIMS_PATH, PROCESS_STATE_PATH.
EXTENSIONS = {"pages.extensions.ClaimTimes": 0, "pages.extensions.ProcessState": 0}

# The test site is our own: no per-domain rate or concurrency limit unless a test sets one.
RELIABILITY_DOMAIN_RATE = 0
RELIABILITY_DOMAIN_CONCURRENCY = 0

# The test site's "500x3" pages answer 500 three times before their page: five attempts
# (Scrapy's default RETRY_TIMES = 2 gives three) see them through.
RETRY_TIMES = 4
