"""Running the test site from Python: :class:`SiteProcess` starts it as a subprocess
on a :func:`free_port` and reads its request log; :func:`max_per_window` counts what
the log shows in any window of time."""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import pathlib
import select
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any, Final
from urllib.parse import urlencode

from scrapy_reliability.testing.site_config import DEFAULT_HOSTS, SiteConfig
from scrapy_reliability.testing.site_server import EXIT_BIND_FAILED

if TYPE_CHECKING:  # typing.Self needs 3.11; annotations are never evaluated at runtime
    from typing_extensions import Self

FREE_PORT_HOSTS: Final[tuple[str, ...]] = ("127.0.0.1", *DEFAULT_HOSTS)
READY_TIMEOUT: Final[float] = 15.0
MODULE: Final[str] = "scrapy_reliability.testing.site"


def max_per_window(times: Iterable[float], window: float = 1.0) -> int:
    """The largest number of ``times`` inside any half-open window ``[a, a + window)``.

    The window slides over all real ``a``; input order does not matter; 0 for no times.
    Raises ValueError unless ``window > 0``.
    """
    if not window > 0:
        raise ValueError("window must be > 0")
    ts = sorted(times)
    best = 0
    end_index = 0
    for start_index, start in enumerate(ts):
        end_index = max(end_index, start_index)
        while end_index < len(ts) and ts[end_index] < start + window:
            end_index += 1
        best = max(best, end_index - start_index)
    return best


def _can_bind(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(hosts: Sequence[str] = FREE_PORT_HOSTS) -> int:
    """A TCP port that can currently be bound on every one of ``hosts``.

    The default checks 127.0.0.1 to 127.0.0.4. Racy by nature (another process may take
    it before use); :class:`SiteProcess` retries with a new port when that happens.
    """
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((hosts[0], 0))
            port: int = sock.getsockname()[1]
        if all(_can_bind(host, port) for host in hosts):
            return port
    raise RuntimeError(f"no port is free on all of {', '.join(hosts)}")


class SiteProcess:
    """Context manager: runs the site as ``sys.executable -m scrapy_reliability.testing.site``.

    On enter it starts the process and waits up to 15 s for ``READY <port>``; if the process
    dies or stays silent it is killed and RuntimeError is raised with its stderr. On exit it
    sends SIGTERM, waits up to 5 s, then SIGKILLs. If ``config.port`` is 0 a port is chosen
    with :func:`free_port` (and re-chosen, up to 5 times, if binding it fails). ``log_path``,
    if given, overrides ``config.log``. ``env`` is merged over ``os.environ``; the repository
    root (two directories above this file) is prepended to PYTHONPATH so the package is
    importable without being installed. After start, ``config`` is the effective config.
    """

    def __init__(
        self,
        config: SiteConfig,
        log_path: pathlib.Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        if log_path is not None:
            config = dataclasses.replace(config, log=pathlib.Path(log_path))
        self.config = config
        self.port: int = config.port
        self.hosts: tuple[str, ...] = config.hosts
        self.log_path: pathlib.Path | None = config.log
        self.process: subprocess.Popen[bytes] | None = None
        self._env = dict(env or {})
        self._stderr: IO[bytes] | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the process and wait for READY (see the class docstring)."""
        if self.process is not None:
            raise RuntimeError("SiteProcess already started")
        auto = self.config.port == 0
        attempts = 5 if auto else 1
        for attempt in range(attempts):
            config = self.config
            if auto:
                config = dataclasses.replace(
                    config, port=free_port((*FREE_PORT_HOSTS, *self.hosts))
                )
            failure = self._launch(config)
            if failure is None:
                self.config, self.port = config, config.port
                return
            returncode, message = failure
            if returncode != EXIT_BIND_FAILED or attempt == attempts - 1:
                raise RuntimeError(message)

    def _launch(self, config: SiteConfig) -> tuple[int | None, str] | None:
        env = {**os.environ, **self._env}
        root = str(pathlib.Path(__file__).resolve().parents[2])
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = root + (os.pathsep + old if old else "")
        # Kept open for the process's lifetime (closed in stop()), so no `with` here.
        stderr = tempfile.TemporaryFile()  # noqa: SIM115
        command = [sys.executable, "-m", MODULE, *config.argv()]
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, env=env
        )
        line = _read_line(process, READY_TIMEOUT)
        if line == f"READY {config.port}":
            self.process, self._stderr = process, stderr
            return None
        if process.poll() is None:
            process.kill()
        returncode = process.wait()
        if process.stdout is not None:
            process.stdout.close()
        stderr.seek(0)
        err = stderr.read().decode("utf-8", "replace")
        stderr.close()
        if line is None and returncode is not None and returncode < 0:
            why = f"did not print READY within {READY_TIMEOUT:g} s"
        else:
            why = f"exited with status {returncode} (stdout line: {line!r})"
        message = f"site {why}; command: {' '.join(command)}\n--- stderr ---\n{err}"
        return returncode, message

    def stop(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after 5 s). Idempotent."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def url(self, host_index: int = 0, path: str = "/") -> str:
        """``http://HOST:PORT{path}`` for ``hosts[host_index]``; path must start with '/'."""
        if not path.startswith("/"):
            raise ValueError("path must start with '/'")
        return f"http://{self.hosts[host_index]}:{self.port}{path}"

    def start_urls(self) -> list[str]:
        """The index URL of every host, in host order."""
        return [self.url(k, "/") for k in range(len(self.hosts))]

    def all_page_urls(self) -> list[str]:
        """Every ``/p/<i>`` URL of every host (host-major order)."""
        return [
            self.url(k, f"/p/{i}") for k in range(len(self.hosts)) for i in range(self.config.pages)
        ]

    def set_host_rate(self, rate: float, host: str | None = None) -> dict[str, float]:
        """Set the host limiter's rate of ``host`` (every host if None) from now on.

        Calls ``/_control/host-rate?rate=R[&host=H]`` (see the contracts); returns every
        host's rate as the site answered. Raises ValueError with the site's reason if it
        refuses the value (400), RuntimeError if the site is not running or fails.
        """
        params = {"rate": repr(rate)} if host is None else {"rate": repr(rate), "host": host}
        status, body = self.control("/_control/host-rate?" + urlencode(params))
        if status == 400:
            raise ValueError(f"site refused host rate {rate!r}: {body.decode().strip()}")
        if status != 200:
            raise RuntimeError(f"/_control/host-rate answered {status}: {body!r}")
        rates: dict[str, float] = json.loads(body)["host_rates"]
        return rates

    def control(self, target: str, timeout: float = 10.0) -> tuple[int, bytes]:
        """GET ``target`` (e.g. ``/_control/outage?seconds=2``) from the first host;
        returns the status and body. Raises RuntimeError if the site is not running."""
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError("the site is not running")
        conn = http.client.HTTPConnection(self.hosts[0], self.port, timeout=timeout)
        try:
            conn.request("GET", target)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def read_log(self) -> list[dict[str, Any]]:
        """Every complete line of the request log, parsed; [] if it does not exist yet."""
        if self.log_path is None:
            raise RuntimeError("this SiteProcess has no log (pass log_path)")
        try:
            text = self.log_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.split("\n")[:-1] if line]


def _read_line(process: subprocess.Popen[bytes], timeout: float) -> str | None:
    """The first stdout line of ``process`` (stripped), or None on EOF or timeout."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    deadline = time.monotonic() + timeout
    buffer = b""
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        buffer += chunk
    return buffer.split(b"\n", 1)[0].decode("utf-8", "replace").strip()
