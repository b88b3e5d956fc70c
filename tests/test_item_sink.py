"""The built-in SQL sink's table (frontier/item_sink.py): created once when workers
start together, refused when a table of that name lacks its columns."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import create_engine, text

from scrapy_reliability.frontier import item_sink
from scrapy_reliability.frontier.errors import FrontierError


@pytest.mark.postgres
def test_workers_starting_together_create_the_table_once(postgres_url: str) -> None:
    """Four workers opening one job at the same moment each ensure the table: one
    creates it, the others find it (a CREATE race failed a worker with DuplicateTable)."""
    engines = [create_engine(postgres_url) for _ in range(4)]
    try:
        for round_ in range(6):
            name = f"sink_{round_}"
            start = threading.Barrier(len(engines))
            errors: list[BaseException] = []

            def open_worker(engine, name=name, start=start, errors=errors) -> None:
                start.wait()
                try:
                    item_sink.ensure(engine, name)
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=open_worker, args=(e,)) for e in engines]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=30)
            assert errors == [], f"round {round_}: {errors[0]!r}"
            assert item_sink.stored(engines[0], name, 1) == 0
    finally:
        for engine in engines:
            engine.dispose()


def test_a_table_without_the_sinks_columns_is_refused(tmp_path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE scraped (id INTEGER PRIMARY KEY, body TEXT)"))
    with pytest.raises(FrontierError, match="exists without the columns job_id, request_id"):
        item_sink.ensure(engine, "scraped")
    item_sink.ensure(engine, "fresh")
    assert item_sink.stored(engine, "fresh", 1) == 0
