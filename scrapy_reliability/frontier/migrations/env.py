"""Alembic environment of the frontier: always run with a connection given by
:mod:`scrapy_reliability.frontier.migrate`, never from an ``alembic.ini``."""

from __future__ import annotations

from alembic import context

from scrapy_reliability.frontier.schema import VERSION_TABLE, metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
