"""Helpers of the cold-store durability tests (``test_cold_*.py``): a real ``tierd serve``
(S3 door, admin API, optionally a FUSE mount) over a real cold store -- a moto server over
HTTP or a ``file://`` directory --, the cold store read behind tierd's back, and
:class:`FaultProxy`, a small aiohttp reverse proxy in front of moto that answers 503
SlowDown or delays requests (real HTTP, as a throttling or slow store would).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
from aiohttp import ClientSession, ClientTimeout, web
from botocore.config import Config
from moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer

COLD_BUCKET = "tierd-cold"
S3_KEY, S3_SECRET = "COLDTESTKEY", "cold-test-secret-0123456789abcdef"


def wait_for(cond: Callable[[], bool], timeout: float = 30.0, what: str = "condition",
             every: float = 0.05) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(every)


class Cold:
    """The cold store as tierd sees it (``url`` and the settings) and as anyone else does
    (``keys()``, ``get()``, ``put()``, ``delete()`` without tierd)."""

    def __init__(self, kind: str, base: Path, server: MotoServer | None = None,
                 endpoint: str | None = None) -> None:
        self.kind, self.server = kind, server
        if kind == "file":
            self.root = base / "cold"
            self.root.mkdir(parents=True, exist_ok=True)
            self.url = f"file://{self.root}"
            self.env: dict[str, str] = {}
        else:
            assert server is not None
            self.prefix = f"c{os.urandom(5).hex()}"
            self.url = f"s3://{COLD_BUCKET}/{self.prefix}"
            self.env = {"TIERD_COLD_S3_ENDPOINT": endpoint or server.url,
                        "TIERD_COLD_S3_REGION": REGION,
                        "TIERD_COLD_S3_ACCESS_KEY": ACCESS_KEY,
                        "TIERD_COLD_S3_SECRET_KEY": SECRET_KEY,
                        "TIERD_COLD_S3_ADDRESSING": "path",
                        "TIERD_COLD_S3_MAX_ATTEMPTS": "2"}

    def objects(self) -> set[str]:
        if self.kind == "file":
            return {str(p.relative_to(self.root)) for p in self.root.rglob("*")
                    if p.is_file() and not p.is_symlink()
                    and not str(p.relative_to(self.root)).startswith(".")}
        assert self.server is not None
        out: set[str] = set()
        for page in self.server.client().get_paginator("list_objects_v2").paginate(
                Bucket=COLD_BUCKET, Prefix=self.prefix + "/"):
            out.update(o["Key"][len(self.prefix) + 1:] for o in page.get("Contents", []))
        return out

    def get(self, key: str) -> bytes:
        if self.kind == "file":
            return (self.root / key).read_bytes()
        assert self.server is not None
        r = self.server.client().get_object(Bucket=COLD_BUCKET, Key=f"{self.prefix}/{key}")
        return bytes(r["Body"].read())

    def delete(self, key: str) -> None:
        if self.kind == "file":
            (self.root / key).unlink()
            return
        assert self.server is not None
        self.server.client().delete_object(Bucket=COLD_BUCKET, Key=f"{self.prefix}/{key}")


class Tierd:
    """One ``tierd serve`` on a data directory kept across restarts."""

    def __init__(self, base: Path, cold: Cold, mount: bool = False,
                 **settings: str) -> None:
        self.base, self.cold = base, cold
        self.data_dir = base / "data"
        self.mnt: Path | None = base / "mnt" if mount else None
        self.log_path = base / "tierd.log"
        self.settings = {"TIERD_PERSIST_DELAY": "0", "TIERD_IMPORT_TTL": "0",
                         "TIERD_LOG_LEVEL": "info", **settings}
        self.proc: subprocess.Popen[bytes] | None = None
        self.doc: dict[str, Any] = {}

    # -- the process ------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> Tierd:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
        env.update(TIERD_COLD_URL=self.cold.url, TIERD_ROOT_ACCESS_KEY=S3_KEY,
                   TIERD_ROOT_SECRET_KEY=S3_SECRET, **self.cold.env, **self.settings)
        cmd = [sys.executable, "-m", "tierd.cli", "serve", "--data-dir", str(self.data_dir),
               "--s3-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]
        if self.mnt is not None:
            self.mnt.mkdir(exist_ok=True)
            cmd += ["--mount", str(self.mnt)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, env=env)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tierd exited with {self.proc.returncode}:\n{self.log}")
            with contextlib.suppress(ValueError, OSError):
                doc = json.loads((self.data_dir / "endpoints.json").read_text())
                if doc.get("pid") == self.proc.pid and "s3" in doc and "admin" in doc and (
                        self.mnt is None or "mount" in doc):
                    self.doc = doc
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"tierd did not start within {timeout} s:\n{self.log}")

    def kill9(self) -> None:
        """SIGKILL, as a crash (a FUSE mount left behind is detached)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(20)
        self._unmount()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._unmount()

    def _unmount(self) -> None:
        if self.mnt is not None:
            subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True, check=False)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    # -- the doors --------------------------------------------------------------------
    def s3(self, **config: Any) -> Any:
        opts: dict[str, Any] = {"s3": {"addressing_style": "path"},
                                "retries": {"max_attempts": 1, "mode": "standard"},
                                "read_timeout": 60}
        opts.update(config)
        return boto3.client("s3", endpoint_url=self.doc["s3"]["url"],
                            aws_access_key_id=S3_KEY, aws_secret_access_key=S3_SECRET,
                            region_name=REGION, config=Config(**opts))

    def admin(self, method: str, path: str, doc: dict[str, Any] | None = None,
              timeout: float = 120.0) -> Any:
        token = (self.data_dir / "admin-token").read_text().strip()
        req = urllib.request.Request(
            self.doc["admin"]["url"] + path, method=method,
            data=None if doc is None else json.dumps(doc).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def persist_wait(self, prefix: str = "", timeout: float = 60.0) -> dict[str, Any]:
        doc: dict[str, Any] = self.admin("POST", "/v1/placement/persist",
                                         {"prefix": prefix, "timeout": timeout},
                                         timeout=timeout + 30)
        return doc

    def cold_tier(self) -> dict[str, Any]:
        """The cold entry of ``GET /v1/tiers``."""
        doc = self.admin("GET", "/v1/tiers", timeout=10)
        return next(t for t in doc["tiers"] if t["name"] == "cold")

    def status(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.admin("GET", "/v1/status", timeout=10)
        return doc

    def listing(self, bucket: str, prefix: str = "", delimiter: str = "") -> set[str]:
        kw: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if delimiter:
            kw["Delimiter"] = delimiter
        out: set[str] = set()
        for page in self.s3().get_paginator("list_objects_v2").paginate(**kw):
            out.update(o["Key"] for o in page.get("Contents", []))
        return out


@contextlib.contextmanager
def running(t: Tierd) -> Iterator[Tierd]:
    t.start()
    try:
        yield t
    finally:
        t.stop()


class FaultProxy:
    """A reverse proxy (aiohttp, its own thread and loop) in front of ``upstream``.

    ``slowdown`` (0-1): the share of requests answered ``503 SlowDown`` (an S3 error
    document) instead of being forwarded; ``only`` restricts that to some methods.  ``delay``
    seconds before each forwarded request; ``delay_list`` seconds between the store's answer
    to a listing (GET on a bucket) and passing it on: the listing shows the store as it was
    before anything done meanwhile.  Counters: ``forwarded``, ``refused``, ``listings``."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.slowdown = 0.0
        self.only: set[str] | None = None
        self.delay = 0.0
        self.delay_list = 0.0
        self.forwarded = self.refused = self.listings = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        session = ClientSession(timeout=ClientTimeout(total=120), auto_decompress=False)
        app = web.Application(client_max_size=1 << 30)

        async def handle(request: web.Request) -> web.StreamResponse:
            return await self._handle(request, session)

        app.router.add_route("*", "/{tail:.*}", handle)  # a coroutine: bare ones are deprecated
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()
        await session.close()

    async def _handle(self, request: web.Request, session: ClientSession) -> web.StreamResponse:
        body = await request.read()
        if self.slowdown and (self.only is None or request.method in self.only) and (
                random.random() < self.slowdown):
            self.refused += 1
            return web.Response(status=503, content_type="application/xml", text=(
                "<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
                "<Message>Please reduce your request rate.</Message></Error>"))
        listing = request.method == "GET" and "list-type" in request.query
        if self.delay:
            await asyncio.sleep(self.delay)
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in ("transfer-encoding", "connection")}
        async with session.request(request.method, self.upstream + request.path_qs,
                                   headers=headers, data=body) as up:
            data = await up.read()
            self.forwarded += 1
            if listing:
                self.listings += 1
                if self.delay_list:
                    await asyncio.sleep(self.delay_list)
            out = {k: v for k, v in up.headers.items()
                   if k.lower() not in ("transfer-encoding", "connection", "content-encoding",
                                        "content-length")}
            return web.Response(status=up.status, headers=out, body=data)


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
