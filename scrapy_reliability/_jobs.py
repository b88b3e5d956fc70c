"""Where a crawl's frontier lives and what its job is called."""

from __future__ import annotations

import os
import shlex
import socket
from pathlib import Path

from scrapy.settings import SETTINGS_PRIORITIES, BaseSettings
from scrapy.utils.job import job_dir
from scrapy.utils.project import data_path

from scrapy_reliability.config import Config
from scrapy_reliability.frontier.dialect import redact
from scrapy_reliability.frontier.liveness import MARK

SQLITE_FILENAME = "reliability.sqlite"
#: The settings that choose a job's database and the job.
CHOOSING = ("JOBDIR", "RELIABILITY_DATABASE_URL", "RELIABILITY_JOB")


def database_url(config: Config, settings: BaseSettings, spider_name: str) -> str:
    """RELIABILITY_DATABASE_URL, else a SQLite file inside JOBDIR, else one under
    the project's data directory (``.scrapy/reliability/``)."""
    if config.database_url:
        return config.database_url
    jobdir = job_dir(settings)
    if jobdir:
        path = Path(jobdir) / SQLITE_FILENAME
    else:
        path = Path(data_path("reliability", createdir=True)) / f"{spider_name}.sqlite"
    return f"sqlite:///{path.resolve()}"


def job_name(config: Config, settings: BaseSettings, spider_name: str) -> str:
    if config.job:
        return config.job
    jobdir = job_dir(settings)
    if jobdir:
        return f"{spider_name}@{Path(jobdir).resolve().name}"
    return spider_name


def worker_identity() -> tuple[str, str, int]:
    """(worker id, hostname, pid) of this process. The id ends with the mark of a
    worker that holds its session lock on PostgreSQL (``frontier/liveness.py``)."""
    hostname = socket.gethostname()
    pid = os.getpid()
    return f"{hostname[:40]}:{pid}:{os.urandom(4).hex()}{MARK}", hostname, pid


def chosen_on_command_line(settings: BaseSettings) -> list[str]:
    """The ``-s`` options that chose the job's database and the job (of :data:`CHOOSING`,
    those given on the command line; a password shown as ``***``), to repeat in a
    command suggested to the user: without them it would name the spider's default job."""
    words = []
    for key in CHOOSING:
        if settings.getpriority(key) != SETTINGS_PRIORITIES["cmdline"]:
            continue
        value = str(settings.get(key))
        shown = redact(value) if key == "RELIABILITY_DATABASE_URL" else value
        words += ["-s", shlex.quote(f"{key}={shown}")]
    return words
