"""``scrapy frontier``: look into and operate the frontier of a project.

The command (its options and dispatch) is :mod:`.frontier`; each subcommand runs
in :mod:`.listings` (status, domains, dead), :mod:`.report_figures` (the HTML
report's figures, written by :mod:`.report_page`), :mod:`.explain`, :mod:`.operations`
(requeue, purge, migrate) or :mod:`.doctor`, with a :class:`.context.Context`
(settings, database, job, output) and :mod:`.text` (times, tables).
"""

from scrapy_reliability.commands.frontier import FrontierCommand

__all__ = ["FrontierCommand"]
