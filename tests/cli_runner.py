"""``scrapy frontier`` run in the test process, as its subprocess would run it.

Starting Python and importing Scrapy costs about a second per command; the command
itself, milliseconds. :func:`run_in_process` runs Scrapy's own command line
(``scrapy.cmdline.execute``) here instead: in ``cwd``, with the environment a
subprocess would get, standard output and error captured, WARNING and higher log
lines on standard error (as Python prints them in a process that configured no
logging), and the exit status from ``sys.exit``. Everything the command changes in
this process is put back: the working directory, the environment, ``sys.path``, the
project's modules it imported (another test's project has the same names) and the
loggers' levels and handlers (Scrapy 2.13 sets them up when its command line runs).

``tests/test_cli.py`` runs each subcommand once as a real subprocess too
(``test_every_subcommand_runs_as_a_process``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import platform
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

from scrapy import cmdline

# Python 3.10 runs `uname -p` the first time the platform's processor is asked for
# (Scrapy's and doctor's platform lines): asked here, at import, it is not a process
# started by whichever test runs a command first.
platform.processor()
platform.platform()

#: Where modules that stay imported live: the interpreter, the virtualenv, this repo.
_KEEP = tuple(
    str(Path(p).resolve())
    for p in {sys.prefix, sys.base_prefix, str(Path(__file__).resolve().parent.parent)}
)


def run_in_process(
    cwd: Path, argv: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``scrapy *argv`` in ``cwd``, as ``subprocess.run(..., capture_output=True,
    text=True, env=env)`` would return it."""
    saved_env = dict(os.environ)
    saved_path = list(sys.path)
    saved_modules = set(sys.modules)
    saved_cwd = os.getcwd()
    saved_logging = _logging_state()
    out, err = io.StringIO(), io.StringIO()
    # Python's last-resort handler: a process without logging configured prints
    # WARNING and above, the message alone, to standard error.
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    root = logging.getLogger()
    code = 0
    os.environ.clear()
    os.environ.update(env if env is not None else _child_env(saved_env))
    try:
        os.chdir(cwd)
        root.addHandler(handler)
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("default")  # a child prints warnings, never raises them
            try:
                cmdline.execute(["scrapy", *argv])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
            except Exception:  # a child would print it and exit with 1
                traceback.print_exc(file=err)
                code = 1
    finally:
        root.removeHandler(handler)
        _restore_logging(saved_logging)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
        for name in set(sys.modules) - saved_modules:
            file = getattr(sys.modules[name], "__file__", None)
            if file and not str(Path(file).resolve()).startswith(_KEEP):
                del sys.modules[name]  # the project's settings and spiders
    return subprocess.CompletedProcess(["scrapy", *argv], code, out.getvalue(), err.getvalue())


def _child_env(parent: dict[str, str]) -> dict[str, str]:
    """The parent's environment less what would configure Scrapy or this package."""
    return {k: v for k, v in parent.items() if not k.startswith(("SCRAPY_", "RELIABILITY_"))}


def _logging_state() -> dict[str, tuple[int, list[logging.Handler], bool, bool]]:
    """Each logger's level, handlers, propagation and disabled flag (the root's as "")."""
    loggers = {"": logging.getLogger()}
    loggers.update(
        (name, obj)
        for name, obj in logging.Logger.manager.loggerDict.items()
        if isinstance(obj, logging.Logger)
    )
    return {
        name: (lg.level, list(lg.handlers), lg.propagate, lg.disabled)
        for name, lg in loggers.items()
    }


def _restore_logging(saved: dict[str, tuple[int, list[logging.Handler], bool, bool]]) -> None:
    for name, (level, handlers, propagate, disabled) in saved.items():
        lg = logging.getLogger(name or None)
        lg.setLevel(level)
        lg.handlers[:] = handlers
        lg.propagate, lg.disabled = propagate, disabled
    for name, obj in list(logging.Logger.manager.loggerDict.items()):
        if name not in saved and isinstance(obj, logging.Logger):
            obj.setLevel(logging.NOTSET)  # a logger the command created: as a new one is
            obj.handlers.clear()
