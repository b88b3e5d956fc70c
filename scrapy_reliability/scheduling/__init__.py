"""The scheduling core behind :class:`scrapy_reliability.Scheduler`, one job per module.

- ``meta``: the ``reliability_*`` request meta keys and their typed values (shared
  with the middlewares; imports nothing of this package).
- ``engine``: the only module that touches Scrapy's internals.
- ``leases``: the lease book, the only writer of a lease's stage.
- ``writes``: helpers of the write pipeline (splitting a failed batch).
- ``refusals``: what is kept of a request the frontier cannot store.
- ``politeness``: local politeness (pick, robots.txt, the local pause mirror).
- ``session``: opening and closing the job on the database thread.

See docs/architecture.md for the layers and one request's way through them.
"""
