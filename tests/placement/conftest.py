"""Fixtures of the placement suite: a namespace with placement over real parts.

``env`` is parametrized over the cold engine: ``file`` (a temp directory) and ``s3`` (a moto
standalone server subprocess over HTTP, one per session; each test gets its own prefix).
``raw_get``/``raw_put`` reach the cold store without tierd (files, boto3) to check the
transparent layout both ways.  Async tests run on a fresh loop (no pytest-asyncio).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer

from tierd.acl import Identity
from tierd.meta import MetaStore
from tierd.namespace import Namespace
from tierd.placement import Placement, PlacementSettings
from tierd.tiers import LocalTier, ObjectTier, open_object_tier

ROOT = Identity.ROOT
COLD_BUCKET = "tierd-cold"
SMALL = {"multipart_threshold": 6 << 20, "part_size": 5 << 20, "range_size": 1 << 20,
         "concurrency": 4}
MiB = 1 << 20


def s3_settings(server: MotoServer) -> dict[str, Any]:
    return {"endpoint_url": server.url, "region": REGION, "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY, "addressing": "path", "max_attempts": 2,
            "connect_timeout": 1.0, "read_timeout": 5.0, **SMALL}


class Env:
    """Paths and factories of one test; :meth:`open` builds a started namespace."""

    def __init__(self, kind: str, base: Path, server: MotoServer | None) -> None:
        self.kind, self.base, self.server = kind, base, server
        self.hot_dir = base / "hot"
        self.meta_dir = base / "meta"
        if kind == "file":
            self.cold_root = base / "cold"
            self.cold_root.mkdir()
            self.url = f"file://{self.cold_root}"
            self.settings: dict[str, Any] = dict(SMALL)
        else:
            assert server is not None
            self.prefix = f"t-{uuid.uuid4().hex[:12]}"
            self.url = f"s3://{COLD_BUCKET}/{self.prefix}"
            self.settings = s3_settings(server)
        self.ns: Namespace | None = None
        self.p: Placement | None = None

    def cold_tier(self) -> ObjectTier:
        return open_object_tier(self.url, **self.settings)

    def raw_get(self, key: str) -> bytes:
        if self.kind == "file":
            return (self.cold_root / key).read_bytes()
        assert self.server is not None
        r = self.server.client().get_object(Bucket=COLD_BUCKET, Key=f"{self.prefix}/{key}")
        return bytes(r["Body"].read())

    def raw_exists(self, key: str) -> bool:
        if self.kind == "file":
            return (self.cold_root / key).is_file()
        assert self.server is not None
        r = self.server.client().list_objects_v2(Bucket=COLD_BUCKET,
                                                 Prefix=f"{self.prefix}/{key}")
        return any(o["Key"] == f"{self.prefix}/{key}" for o in r.get("Contents", []))

    def raw_put(self, key: str, data: bytes) -> None:
        if self.kind == "file":
            p = self.cold_root / key
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            return
        assert self.server is not None
        self.server.client().put_object(Bucket=COLD_BUCKET, Key=f"{self.prefix}/{key}",
                                        Body=data)

    def raw_delete(self, key: str) -> None:
        """Delete an object behind tierd's back (another S3 client, an operator)."""
        if self.kind == "file":
            (self.cold_root / key).unlink()
            return
        assert self.server is not None
        self.server.client().delete_object(Bucket=COLD_BUCKET, Key=f"{self.prefix}/{key}")

    async def open(self, capacity: int = 0, warm: int | None = None,
                   **kw: Any) -> tuple[Namespace, Placement]:
        """``capacity``: hot bytes (0: its file system); ``warm``: a warm tier of that many
        bytes (None: no warm tier)."""
        meta = MetaStore.open_lmdb(self.meta_dir)
        hot = LocalTier(self.hot_dir, name="hot", capacity=capacity)
        warm_tier = (LocalTier(self.base / "warm", name="warm", capacity=warm)
                     if warm is not None else None)
        settings = PlacementSettings(**{"import_ttl": 0.0, "retry_delay": 0.2, **kw})
        p = Placement(meta, self.cold_tier(), hot, settings, warm=warm_tier)
        await p.start()
        ns = await Namespace.load(meta, self.hot_dir, placement=p)
        self.ns, self.p = ns, p
        return ns, p

    async def close(self) -> None:
        if self.ns is not None:
            await self.ns.close()
        if self.p is not None:
            await self.p.shutdown()
            self.p.meta.close()
        self.ns = self.p = None


@pytest.fixture(params=["file", "s3"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    server = request.getfixturevalue("moto") if request.param == "s3" else None
    yield Env(request.param, tmp_path, server)


@pytest.fixture
def file_env(tmp_path: Path) -> Iterator[Env]:
    yield Env("file", tmp_path, None)


async def body(data: bytes, size: int = 1 << 20) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def write_file(ns: Namespace, parent: int, name: bytes, data: bytes) -> int:
    inode, fh = await ns.create(ROOT, parent, name, 0o644, os.O_WRONLY)
    for i in range(0, len(data), 1 << 20):
        await ns.write(fh, i, data[i : i + (1 << 20)])
    await ns.release(fh)
    return inode.ino


async def read_file(ns: Namespace, ino: int, chunk: int = 1 << 20) -> bytes:
    fh = await ns.open(ROOT, ino, os.O_RDONLY)
    try:
        out = bytearray()
        while data := await ns.read(fh, len(out), chunk):
            out += data
        return bytes(out)
    finally:
        await ns.release(fh)


async def until(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)
