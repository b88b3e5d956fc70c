"""The scheduling core behind :class:`scrapy_reliability.Scheduler`, one job per module.

Top down (each imports only modules below it):

- ``session``: open (job, register, recover), heartbeat, close; ``jobdb`` is its
  database-thread side.
- ``claims``: the claim buffer (ready queue, when to claim, the wake-up timer).
- ``outcomes``: one method per lifecycle transition (ack, ignore, bury, reschedule,
  hand back, return paused, record an item failure).
- ``writes``: the write pipeline (one batch, one write in flight, backpressure, the
  failed-write split, refusals of single changes).
- ``storage``: the storage-failure streak, give-up and stop.
- ``politeness``: local politeness (pick, robots.txt, the local pause mirror).
- ``leases``: the lease book, the only writer of a lease's stage.
- ``settled``, ``batches``, ``refusals``: small helpers.
- ``context``: what every part reads (the crawl, the job, the database thread).
- ``engine``: the only module that touches Scrapy's internals.
- ``scrapy_hooks``: checks at startup that the installed Scrapy has those internals.
- ``meta``: the ``reliability_*`` request meta keys and their typed values.

docs/architecture.md walks one request through them.
"""
