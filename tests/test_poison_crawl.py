"""One bad value costs its own request, never its batch, its worker or its job; a
run that ends with requests it refused or could not process says so (real crawls)."""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from scrapy_reliability.testing.site import SiteConfig, SiteProcess, page_links
from tests.crawling import Crawl, count_lines, make_project, pages_in, read_jsonl, signal_when
from tests.crawlproject.pages.spiders.pages import POISON_PATHS
from tests.frontier_helpers import URL_SQL
from tests.test_cli import frontier_cmd

pytestmark = pytest.mark.slow

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def database_setting(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"JOBDIR={tmp_path / 'job'}"
    return f"RELIABILITY_DATABASE_URL={request.getfixturevalue('postgres_url')}"


def started_until(crawl: Crawl, site: SiteProcess, requests: int) -> subprocess.Popen[bytes]:
    """Start ``crawl`` and return once the site has served ``requests`` pages."""
    proc = crawl.start()
    while count_lines(site.log_path) < requests:
        assert proc.poll() is None, crawl.log()[-3000:]
        time.sleep(0.05)
    return proc


def status_of(crawl: Crawl, db: str, job: str | None = None) -> dict[str, object]:
    key, value = db.split("=", 1)
    settings = {key: value}
    if job:
        settings["RELIABILITY_JOB"] = job
    result = frontier_cmd(crawl.project, "status", "pages", "--json", settings=settings)
    assert result.returncode == 0, result.stdout + result.stderr
    found: dict[str, object] = json.loads(result.stdout)
    return found


@pytest.mark.parametrize("backend", BACKENDS)
def test_requests_no_backend_can_store_cost_only_themselves(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """Each host's index page also yields requests that SQLite or PostgreSQL cannot
    store as they are (a 304-character hostname, priorities beyond 32 bits, NaN and
    Infinity, a lone surrogate, an object, a 70 kB URL, a bytes key): every normal
    page is fetched, the crawl ends by itself, each refused request is named in the
    log, and the run says it is incomplete (exit status 1, status counts them)."""
    config = SiteConfig(pages=120)
    db = database_setting(backend, tmp_path, request)
    items = tmp_path / "items.jsonl"
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        # URLLENGTH_LIMIT=0: the 70 kB URL reaches the scheduler.
        crawl = Crawl(
            make_project(tmp_path),
            site.start_urls(),
            db,
            f"ITEMS_PATH={items}",
            "URLLENGTH_LIMIT=0",
            poison="1",
        )
        started = time.monotonic()
        code = crawl.run(timeout=240)
        took = time.monotonic() - started
        log = crawl.log()
        fetched = {e["path"] for e in read_jsonl(site.log_path)}
    assert code == 1, log[-3000:]
    assert pages_in(items) == {(h, i) for h in config.hosts for i in range(config.pages)}
    # Nothing refused was fetched, and every refused request is named.
    # A lone surrogate in meta is stored escaped (JSON): not poison on either backend.
    storable = POISON_PATHS["surrogate_meta"]
    assert storable in fetched
    poison = [p for p in POISON_PATHS.values() if p is not None and p != storable]
    assert not any(path.startswith(p) for path in fetched for p in poison)
    refused_lines = [line for line in log.splitlines() if "Refused to schedule" in line]
    for path in poison:
        assert any(path in line for line in refused_lines), (path, refused_lines)
    assert any("a" * 60 + "." in line for line in refused_lines)
    per_host = len(POISON_PATHS) - 1
    assert "'finish_reason': 'incomplete'" in log, log[-3000:]
    assert "is not complete" in log
    assert "Traceback" not in log, log[-5000:]
    assert "DeprecationWarning" not in log, log[-5000:]
    status = status_of(crawl, db)
    counts = status["counts"]
    assert isinstance(counts, dict)
    assert counts.get("pending", 0) == counts.get("leased", 0) == 0
    dead = status["dead_letters"]
    assert isinstance(dead, dict)
    # The long hostname is one request for the three hosts' index pages (same URL
    # but for the port, which is shared): the others are one per host.
    assert dead.get("refused") == (per_host - 1) * len(config.hosts) + 1, dead
    # The run's summary counts them, and `explain` gives the reason for such a URL.
    assert f"{dead.get('refused')} refused" in log
    key, value = db.split("=", 1)
    url = crawl.start_urls[0].rstrip("/") + str(POISON_PATHS["object_meta"])
    explained = frontier_cmd(crawl.project, "explain", "pages", url, settings={key: value})
    assert explained.returncode == 0, explained.stdout + explained.stderr
    assert "refused" in explained.stdout and "meta['o']" in explained.stdout, explained.stdout
    print(
        f"{backend}: {len(config.hosts) * config.pages} pages in {took:.1f} s, "
        f"refused: {dead.get('refused')}, exit status {code}"
    )


def _parents(config: SiteConfig) -> dict[tuple[str, int], set[tuple[str, int]]]:
    """Each page's set of the pages that link to it, from the site's own links."""
    parents: dict[tuple[str, int], set[tuple[str, int]]] = {}
    for host in config.hosts:
        for i in range(config.pages):
            for href in page_links(config, host, i):
                target = href.split("//")[1].split(":")[0] if "//" in href else host
                parents.setdefault((target, int(href.rsplit("/", 1)[1])), set()).add((host, i))
    return parents


def _corrupt_pending_rows(db: Path, how_many: int) -> list[str]:
    """Overwrite the payloads of some pending rows with what a broken disk, a bad
    manual edit or a bug could leave; returns their URLs."""
    bad_payloads = [
        "{not json",
        "[1, 2, 3]",
        json.dumps({"url": 42}),
        json.dumps({"v": 1, "url": "http://127.0.0.1/x", "class": "os.system"}),
        json.dumps({"v": 1, "url": "http://127.0.0.1/x", "class": "no.such.module.Request"}),
        json.dumps(
            {
                "v": 1,
                "url": "http://127.0.0.1/x",
                "meta": {"a": {"__reliability_type__": "nope", "value": 1}},
            }
        ),
        '"just a string"',
        "null",
        json.dumps({"v": 1, "url": "http://127.0.0.1/x", "meta": {"retry_times": "abc"}}),
    ]
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            f"SELECT id, {URL_SQL} FROM reliability_requests WHERE state = 'pending' "
            "ORDER BY id LIMIT ?",
            (how_many,),
        ).fetchall()
        for n, (row_id, _url) in enumerate(rows):
            conn.execute(
                "UPDATE reliability_requests SET payload = ? WHERE id = ?",
                (bad_payloads[n % len(bad_payloads)], row_id),
            )
        conn.commit()
    finally:
        conn.close()
    return [url for _id, url in rows]


def test_payloads_corrupted_between_a_kill_and_the_restart_cost_their_rows_only(
    tmp_path: Path,
) -> None:
    config = SiteConfig(pages=200)
    jobdir = tmp_path / "job"
    items = tmp_path / "items.jsonl"
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = Crawl(
            make_project(tmp_path),
            site.start_urls(),
            f"JOBDIR={jobdir}",
            f"ITEMS_PATH={items}",
            "CONCURRENT_REQUESTS=4",
            # Oldest first: the pending rows corrupted are then the crawl's next ones,
            # and the pages below them are reached by other links. Newest first (Scrapy's
            # default), the oldest pending rows are the shallowest, and the pages only
            # they link to would be lost with them.
            "RELIABILITY_ORDER=bfs",
        )
        assert signal_when(crawl.start(), site.log_path, 150) == -signal.SIGKILL
        corrupted = _corrupt_pending_rows(jobdir / "reliability.sqlite", 16)
        assert len(corrupted) == 16
        code = crawl.run(timeout=240)
        log = crawl.log()
    assert code == 1, log[-3000:]
    lost = {(u.split("//")[1].split(":")[0], int(u.rsplit("/", 1)[1])) for u in corrupted}
    every = {(h, i) for h in config.hosts for i in range(config.pages)}
    got = pages_in(items)
    # Every page but the corrupted ones (unless reached before the kill) arrived, and
    # but those every link to which was on a missing page: when the kill lands as the
    # crawl reaches page i on every host, the corrupted rows can be all of a page's
    # parents.
    missing = every - got
    parents = _parents(config)
    cut_off = {page for page in missing - lost if parents.get(page, set()) <= missing}
    assert missing - cut_off <= lost, sorted(missing - cut_off - lost)[:10]
    assert len(cut_off) < len(every) // 4, (len(cut_off), sorted(cut_off)[:10])
    conn = sqlite3.connect(jobdir / "reliability.sqlite")
    try:
        states = dict(
            conn.execute(
                "SELECT state, count(*) FROM reliability_requests GROUP BY state"
            ).fetchall()
        )
        classes = dict(
            conn.execute(
                "SELECT error_class, count(*) FROM reliability_dead_letters GROUP BY error_class"
            ).fetchall()
        )
    finally:
        conn.close()
    assert states.get("pending", 0) == states.get("leased", 0) == 0, states
    assert classes == {"corrupt": 16}, classes
    assert log.count("recording it as a dead letter of class 'corrupt'") == 16
    assert "'finish_reason': 'incomplete'" in log
    assert "16 corrupt" in log
    assert "Traceback" not in log, log[-5000:]
    print(f"16 corrupted rows: {len(got)} of {len(every)} pages, dead letters {classes}")


def _second_version(tmp_path: Path) -> Path:
    """A copy of the test project whose spider renamed its link callback."""
    project = make_project(tmp_path / "v2")
    spider = project / "pages" / "spiders" / "pages.py"
    spider.write_text(spider.read_text().replace("parse_page", "parse_page_v2"))
    return project


@pytest.mark.long
@pytest.mark.postgres
def test_two_spider_versions_on_one_job_lose_nothing(tmp_path: Path, postgres_url: str) -> None:
    """Two workers of one PostgreSQL job, the second with a renamed callback: each
    hands the other's requests back instead of burying them, and every page is
    fetched. Then a worker of the second version alone: the first version's requests
    it cannot run become dead letters of class 'incompatible', the run says it is
    incomplete, and a retry pass of the first version recovers them."""
    # Slow enough that the first worker is still busy when the second has started,
    # even on a loaded machine (at least 14 s alone at 2 requests at once).
    config = SiteConfig(pages=60, latency_ms=150)
    db = f"RELIABILITY_DATABASE_URL={postgres_url}"
    v1, v2 = make_project(tmp_path / "v1"), _second_version(tmp_path)
    items1, items2 = tmp_path / "items1.jsonl", tmp_path / "items2.jsonl"
    every = {(h, i) for h in config.hosts for i in range(config.pages)}
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        common = (db, "RELIABILITY_JOB=mixed", "CONCURRENT_REQUESTS=2")
        a = Crawl(v1, site.start_urls(), *common, f"ITEMS_PATH={items1}")
        b = Crawl(v2, site.start_urls(), *common, f"ITEMS_PATH={items2}")
        pa = a.start()
        while count_lines(site.log_path) < 20:
            time.sleep(0.05)
        pb = b.start()
        codes = (pa.wait(timeout=300), pb.wait(timeout=300))
        assert codes == (0, 0), (a.log()[-3000:], b.log()[-3000:])
        assert pages_in(items1, items2) == every
        for log in (a.log(), b.log()):
            assert "not a method" not in log and "incompatible" not in log, log[-3000:]
            assert "'finish_reason': 'finished'" in log
        assert "runs another version of the spider" in b.log()
        assert "Joining job mixed" in b.log()
        handed = sum(
            int(line.split(":")[1].strip().rstrip(",}"))
            for log in (a.log(), b.log())
            for line in log.splitlines()
            if "'reliability/handed_back'" in line
        )
        assert handed > 0
        # A worker that keeps finding only the other version's rows claims less often
        # (no tight loop of claims and hand-backs).
        claimed = sum(
            int(line.split(":")[1].strip().rstrip(",}"))
            for log in (a.log(), b.log())
            for line in log.splitlines()
            if "'reliability/claimed'" in line
        )
        assert claimed <= 3 * len(every), claimed
        print(
            f"two versions together: {len(every)} pages, rows handed back: {handed}, "
            f"claims: {claimed}"
        )

        # The second version alone on a job the first version started.
        alone = ("RELIABILITY_JOB=mixed2", db, "CONCURRENT_REQUESTS=4")
        items3 = tmp_path / "items3.jsonl"
        a2 = Crawl(v1, site.start_urls(), *alone, f"ITEMS_PATH={items3}")
        a2.runs = 10  # logs of their own
        before = count_lines(site.log_path)
        assert signal_when(a2.start(), site.log_path, before + 40) == -signal.SIGKILL
        b2 = Crawl(v2, site.start_urls(), *alone, f"ITEMS_PATH={items3}")
        b2.runs = 10
        assert b2.run(timeout=300) == 1, b2.log()[-3000:]
        log = b2.log()
        assert "'finish_reason': 'incomplete'" in log and "incompatible" in log
        assert "Traceback" not in log, log[-5000:]
        dead = status_of(b2, db, job="mixed2")["dead_letters"]
        assert isinstance(dead, dict) and dead.get("incompatible", 0) > 0, dead
        a2.verb = ["retrypass", "--error-class", "incompatible"]
        a2.settings.append("DOWNLOAD_DELAY=0")  # the retry pass is gentle by default
        assert a2.run(timeout=300) == 0, a2.log()[-3000:]
        assert pages_in(items3) == every


def _tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {done.stderr.strip()}")


@pytest.mark.long
def test_a_full_disk_stops_the_crawl_with_one_line_and_the_restart_resumes(
    tmp_path: Path,
) -> None:
    """The SQLite frontier on a small file system that fills up mid-crawl: the crawl
    stops by itself within RELIABILITY_STORAGE_GIVE_UP_SECONDS (20 here) with one
    ERROR line naming the cause, exit status 1; once space is freed, the same command
    resumes and nothing is lost."""
    disk = tmp_path / "disk"
    _tmpfs(disk, "64M")
    try:
        config = SiteConfig(pages=400, latency_ms=20)
        # Only the frontier on the small disk (Scrapy's own JOBDIR files elsewhere).
        db = f"RELIABILITY_DATABASE_URL=sqlite:///{disk / 'frontier.sqlite'}"
        items = tmp_path / "items.jsonl"
        with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
            crawl = Crawl(
                make_project(tmp_path),
                site.start_urls(),
                db,
                f"ITEMS_PATH={items}",
                "RELIABILITY_STORAGE_GIVE_UP_SECONDS=20",
                "CONCURRENT_REQUESTS=4",
            )
            proc = started_until(crawl, site, 100)
            filler = disk / "filler"
            subprocess.run(
                ["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True, check=False
            )
            full_at = time.monotonic()
            code = proc.wait(timeout=120)
            stopped_after = time.monotonic() - full_at
            log = crawl.log()
            assert code == 1, log[-3000:]
            assert stopped_after < 60, stopped_after
            stops = [line for line in log.splitlines() if "Stopping the crawl" in line]
            assert len(stops) == 1, stops
            assert "full" in stops[0] and "run the same command again" in stops[0], stops
            assert "Traceback" not in log, log[-5000:]
            assert "'finish_reason': 'frontier_unavailable'" in log
            filler.unlink()
            assert crawl.run(timeout=300) == 0, crawl.log()[-3000:]
            assert "Resuming job" in crawl.log()
        every = {(h, i) for h in config.hosts for i in range(config.pages)}
        assert pages_in(items) == every
        print(f"disk full: stopped {stopped_after:.1f} s later with: {stops[0][-160:]}")
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.long
def test_a_deleted_sqlite_file_stops_the_crawl_and_is_never_recreated(tmp_path: Path) -> None:
    """The SQLite file removed mid-crawl: the crawl stops within seconds with one
    line naming the file, no empty file appears in its place; with the file put
    back, the same command resumes and nothing is lost."""
    config = SiteConfig(pages=400, latency_ms=20)
    jobdir = tmp_path / "job"
    items = tmp_path / "items.jsonl"
    db = jobdir / "reliability.sqlite"
    aside = tmp_path / "aside"
    aside.mkdir()
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = Crawl(
            make_project(tmp_path),
            site.start_urls(),
            f"JOBDIR={jobdir}",
            f"ITEMS_PATH={items}",
            "RELIABILITY_LEASE_SECONDS=6",
            "CONCURRENT_REQUESTS=4",
        )
        proc = started_until(crawl, site, 100)
        # "Deleted" as far as the crawl can tell: the name is gone (kept aside, with
        # its WAL, to put back for the restart).
        for suffix in ("", "-wal", "-shm"):
            src = Path(f"{db}{suffix}")
            if src.exists():
                shutil.move(src, aside / src.name)
        gone_at = time.monotonic()
        code = proc.wait(timeout=120)
        stopped_after = time.monotonic() - gone_at
        log = crawl.log()
        assert code == 1, log[-3000:]
        assert stopped_after < 60
        assert not db.exists(), "an empty frontier was created in place of the lost one"
        stops = [line for line in log.splitlines() if "Stopping the crawl" in line]
        assert len(stops) == 1 and str(db) in stops[0] and "deleted" in stops[0], stops
        assert "Traceback" not in log, log[-5000:]
        for kept in aside.iterdir():
            shutil.move(kept, jobdir / kept.name)
        assert crawl.run(timeout=300) == 0, crawl.log()[-3000:]
        assert "Resuming job" in crawl.log()
    assert pages_in(items) == {(h, i) for h in config.hosts for i in range(config.pages)}
    print(f"deleted file: stopped {stopped_after:.1f} s later with: {stops[0][-160:]}")


_TRIGGER = """
CREATE FUNCTION refuse_some() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'INSERT' AND NEW.state = 'pending' AND NEW.url LIKE '%/p/7' THEN
    RAISE EXCEPTION 'refused by the test: %', NEW.url;
  END IF;
  IF TG_OP = 'UPDATE' AND NEW.state = 'done' AND NEW.url LIKE '%/p/11' THEN
    RAISE EXCEPTION 'ack refused by the test: %', NEW.url;
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER refuse_some BEFORE INSERT OR UPDATE ON reliability_requests
  FOR EACH ROW EXECUTE FUNCTION refuse_some();
"""


@pytest.mark.postgres
def test_a_row_the_database_refuses_costs_that_row_only(tmp_path: Path, postgres_url: str) -> None:
    """PostgreSQL refuses (by a trigger standing for any constraint) the insert of
    page 7 of each host and the ack of page 11. The batches holding them are split
    until each refused change is alone: page 7 is kept on the record as refused,
    page 11 stays unresolved (fail closed: it goes back to pending), every other
    change of those batches commits, every other page is fetched, and the run ends
    by itself saying it is incomplete."""
    from sqlalchemy import create_engine, text

    from scrapy_reliability.frontier import Frontier

    Frontier.connect(postgres_url, exclusive=False).close()  # the schema, at head
    engine = create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(text(_TRIGGER))
    engine.dispose()
    config = SiteConfig(pages=150)
    db = f"RELIABILITY_DATABASE_URL={postgres_url}"
    items = tmp_path / "items.jsonl"
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = Crawl(make_project(tmp_path), site.start_urls(), db, f"ITEMS_PATH={items}")
        started = time.monotonic()
        code = crawl.run(timeout=240)
        took = time.monotonic() - started
        log = crawl.log()
    assert code == 1, log[-3000:]
    from tests.crawling import reachable_pages

    refused = {(h, 7) for h in config.hosts}
    assert pages_in(items) == reachable_pages(config, refused) - refused
    assert "Traceback" not in log, log[-5000:]
    named = [line for line in log.splitlines() if "Refused to schedule" in line]
    assert len(named) == len(config.hosts) and all("/p/7:" in n or "/p/7 " in n for n in named), (
        named
    )
    unresolved = [line for line in log.splitlines() if "stays unresolved" in line]
    assert len(unresolved) == len(config.hosts), unresolved
    status = status_of(crawl, db)
    assert status["dead_letters"] == {"refused": len(config.hosts)}, status
    counts = status["counts"]
    assert isinstance(counts, dict) and counts.get("pending") == len(config.hosts), counts
    assert "'finish_reason': 'incomplete'" in log
    print(
        f"refused inserts and acks isolated in {took:.1f} s: {len(named)} refused, "
        f"{len(unresolved)} unresolved, {len(pages_in(items))} pages"
    )


def test_a_restart_on_a_full_disk_says_so_in_one_line(tmp_path: Path) -> None:
    """Started on a file system that is already full, the crawl cannot open its
    job: one ERROR line naming the cause, exit status 1, no traceback."""
    disk = tmp_path / "disk"
    _tmpfs(disk, "2M")
    try:
        db = f"RELIABILITY_DATABASE_URL=sqlite:///{disk / 'frontier.sqlite'}"
        with SiteProcess(SiteConfig(pages=20), log_path=tmp_path / "site.jsonl") as site:
            crawl = Crawl(make_project(tmp_path), site.start_urls(), db)
            assert crawl.run() == 0, crawl.log()[-3000:]  # creates the frontier
            crawl.settings.append("RELIABILITY_RESTART_FINISHED=True")
            subprocess.run(
                ["dd", "if=/dev/zero", f"of={disk / 'filler'}", "bs=64k"],
                capture_output=True,
                check=False,
            )
            code = crawl.run()
            log = crawl.log()
        assert code == 1, log[-3000:]
        errors = [line for line in log.splitlines() if " ERROR: " in line or "CRITICAL" in line]
        assert len(errors) == 1, errors
        assert "full" in errors[0], errors
        assert "Traceback" not in log, log[-5000:]
        print("restart on a full disk:", errors[0][-200:])
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.long
@pytest.mark.postgres
def test_a_postgres_server_that_stays_unreachable_stops_the_crawl(
    tmp_path: Path, postgres_url: str
) -> None:
    """The crawl's database role loses its login mid-crawl and its connections are
    ended: every reconnect fails. The crawl stops by itself within
    RELIABILITY_STORAGE_GIVE_UP_SECONDS (15 here) with one line naming the server,
    exit status 1; with the login back, the same command resumes, nothing lost."""
    import uuid

    from sqlalchemy import create_engine, make_url, text

    role = f"crawler_{uuid.uuid4().hex[:8]}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE ROLE "{role}" LOGIN SUPERUSER'))
    url = make_url(postgres_url).set(username=role).render_as_string(hide_password=False)
    config = SiteConfig(pages=400, latency_ms=20)
    items = tmp_path / "items.jsonl"
    try:
        with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
            crawl = Crawl(
                make_project(tmp_path),
                site.start_urls(),
                f"RELIABILITY_DATABASE_URL={url}",
                f"ITEMS_PATH={items}",
                "RELIABILITY_STORAGE_GIVE_UP_SECONDS=15",
                "CONCURRENT_REQUESTS=4",
            )
            proc = started_until(crawl, site, 100)
            with admin.connect() as conn:
                conn.execute(text(f'ALTER ROLE "{role}" NOLOGIN'))
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE usename = :role"
                    ),
                    {"role": role},
                )
            cut_at = time.monotonic()
            code = proc.wait(timeout=120)
            stopped_after = time.monotonic() - cut_at
            log = crawl.log()
            assert code == 1, log[-3000:]
            assert stopped_after < 60, stopped_after
            stops = [line for line in log.splitlines() if "Stopping the crawl" in line]
            assert len(stops) == 1 and "127.0.0.1" in stops[0], stops
            assert "Traceback" not in log, log[-5000:]
            with admin.connect() as conn:
                conn.execute(text(f'ALTER ROLE "{role}" LOGIN'))
            assert crawl.run(timeout=300) == 0, crawl.log()[-3000:]
            assert "Resuming job" in crawl.log()
        assert pages_in(items) == {(h, i) for h in config.hosts for i in range(config.pages)}
        print(f"unreachable Postgres: stopped {stopped_after:.1f} s later: {stops[0][-200:]}")
    finally:
        with admin.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :role"
                ),
                {"role": role},
            )
            # Its tables live in the test database (dropped with it); the role goes now.
            conn.execute(text(f'REASSIGN OWNED BY "{role}" TO postgres'))
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()
