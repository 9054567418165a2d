"""A real S3 endpoint for tests: moto's standalone server in its own process, over HTTP.

Tests that need S3 (the cold tier's s3:// engine, placement's fault tests, benchmarks) talk to
it exactly as to MinIO or AWS: through boto3 and a TCP socket.  No in-process mocking
(``mock_aws``, ``ThreadedMotoServer``): a separate process is what lets a test stop the store
mid-workload, see connections refused, and bring it back.

API
---
``MotoServer(port=None, *, env=None, host="127.0.0.1")``
    Not started yet.  ``port=None`` picks a free port at :meth:`~MotoServer.start` (and
    keeps it for restarts).  ``env`` adds environment variables for the server process, e.g.
    ``{"S3_UPLOAD_PART_MIN_SIZE": "65536"}`` to allow small multipart parts.
``server.start(timeout=30) -> MotoServer``
    Start ``python -m moto.server -H HOST -p PORT`` and wait until it answers HTTP.
``server.stop(kill=False)``
    Terminate it (SIGTERM, then SIGKILL after 5 s); ``kill=True`` sends SIGKILL at once, like
    a crash.  Its state (buckets, objects) is lost: moto keeps everything in memory.
``server.restart()``
    ``stop()`` then ``start()`` on the **same port**, so clients configured with the old
    endpoint reconnect by themselves.  The new server is empty: recreate buckets.
``server.reset()``
    Drop every bucket and object without restarting (``POST /moto-api/reset``).
``server.url`` / ``server.port`` / ``server.running``
    ``http://127.0.0.1:PORT``, the port, whether the process is alive.
``server.tierd_args(url) -> list[str]``
    ``tierd serve`` options for a cold store ``s3://BUCKET/PREFIX`` on this server.
``server.client(**config) -> boto3 S3 client``
    Path-style, test credentials (:data:`ACCESS_KEY`/:data:`SECRET_KEY`), region
    :data:`REGION`; ``config`` entries override botocore ``Config`` options (e.g.
    ``retries={"max_attempts": 1}``).
``server.log_tail(n=40) -> str`` / ``server.log_path``
    The end of the server's output (for assertion messages) / the file holding it.
``server.close()``
    ``stop()`` and remove the log file.
``running_moto(**kwargs)``
    Context manager: a started server, stopped at exit.  A pytest fixture is then::

        @pytest.fixture(scope="session")
        def moto() -> Iterator[MotoServer]:
            with running_moto() as server:
                yield server

Import it as ``from moto_server import MotoServer`` from a test package under ``tests/``
(pytest puts ``tests/`` on ``sys.path`` for packages there).  Everything is bounded: the
start waits at most ``timeout`` seconds and a server is always stopped by ``stop()``/the
context manager, including on test failure.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the kernel's pick; may race, start() retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class MotoServer:
    """One moto standalone server subprocess (see the module docstring for the API)."""

    def __init__(self, port: int | None = None, *, env: dict[str, str] | None = None,
                 host: str = "127.0.0.1") -> None:
        self.host = host
        self._fixed_port = port is not None
        self.port = port or 0
        self._env = dict(env or {})
        self._proc: subprocess.Popen[bytes] | None = None
        fd, self.log_path = tempfile.mkstemp(prefix="moto-", suffix=".log")
        os.close(fd)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> MotoServer:
        """Start the server and wait until it answers; returns ``self``."""
        if self.running:
            return self
        deadline = time.monotonic() + timeout
        while True:
            if not self.port:
                self.port = free_port(self.host)
            self._spawn()
            if self._wait_ready(deadline):
                return self
            self.stop()
            if self._fixed_port or time.monotonic() >= deadline:
                raise RuntimeError(
                    f"moto server on {self.url} did not start:\n{self.log_tail()}"
                )
            self.port = 0  # lost a race for an automatically chosen port: pick another

    def _spawn(self) -> None:
        env = {**os.environ, **self._env}
        env.setdefault("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        env.setdefault("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        with open(self.log_path, "wb") as log:  # the child keeps its own descriptor
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a Ctrl-C in the test run does not reach it directly
            )

    def _wait_ready(self, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if not self.running:
                return False
            try:
                with urllib.request.urlopen(self.url + "/moto-api/data.json", timeout=1):
                    return True
            except urllib.error.HTTPError:
                return True  # it answered
            except OSError:
                time.sleep(0.05)
        return False

    def stop(self, kill: bool = False) -> None:
        """Stop the server (SIGKILL at once with ``kill=True``).  Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            if kill:
                proc.kill()
            else:
                proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        # the port must be free before a restart binds it again
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and self._port_in_use():
            time.sleep(0.05)

    def _port_in_use(self) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.2)
            return s.connect_ex((self.host, self.port)) == 0

    def restart(self, timeout: float = 30.0) -> MotoServer:
        """Stop and start again on the same port (the new server is empty)."""
        port = self.port
        self.stop()
        self.port = port
        fixed, self._fixed_port = self._fixed_port, True
        try:
            return self.start(timeout)
        finally:
            self._fixed_port = fixed

    def reset(self) -> None:
        """Forget every bucket and object (moto's reset API)."""
        req = urllib.request.Request(self.url + "/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def tierd_args(self, url: str) -> list[str]:
        """``tierd serve`` options for the cold store ``url`` (``s3://BUCKET/PREFIX``) on
        this server: endpoint, test credentials, region, path addressing."""
        return ["--cold-url", url, "--cold-s3-endpoint", self.url, "--cold-s3-access-key",
                ACCESS_KEY, "--cold-s3-secret-key", SECRET_KEY, "--cold-s3-region", REGION,
                "--cold-s3-addressing", "path"]

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this server (path-style, test credentials)."""
        import boto3
        from botocore.config import Config

        opts: dict[str, Any] = {"s3": {"addressing_style": "path"},
                                "retries": {"max_attempts": 2, "mode": "standard"}}
        opts.update(config)
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=Config(**opts),
        )

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                lines = fh.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def close(self) -> None:
        """Stop the server and remove its log file."""
        self.stop()
        with contextlib.suppress(OSError):
            os.unlink(self.log_path)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(kill=True)


@contextlib.contextmanager
def running_moto(**kwargs: Any) -> Iterator[MotoServer]:
    """A started :class:`MotoServer` for the ``with`` block; stopped (and its log removed)
    at exit."""
    server = MotoServer(**kwargs)
    try:
        yield server.start()
    finally:
        server.close()
