"""Fixtures of the tier backend suite.

``cold`` is parametrized over every :class:`~tierd.tiers.ObjectTier` engine, so each test
using it runs against ``file://`` (a temp directory), ``s3://`` (a moto standalone server
subprocess over HTTP, one per session) and ``memory://`` (fsspec).  Each test gets a fresh,
empty store (a new directory, S3 prefix or memory root) and a ``raw`` view of the same store
through its native client (files, boto3, fsspec) to check the transparent layout.

Tests may be ``async def``: the hook below runs them on a fresh event loop (the project does
not use pytest-asyncio).  Tiers are loop-independent, so sync fixtures create them.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest
from moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer

from tierd.tiers import ObjectTier, open_object_tier

#: small transfer settings so a few MiB exercise multipart (moto's 5 MiB minimum part) and
#: parallel ranged GETs
SMALL = {"multipart_threshold": 6 << 20, "part_size": 5 << 20, "range_size": 1 << 20,
         "concurrency": 4}
COLD_BUCKET = "tierd-cold"


def s3_settings(server: MotoServer, **extra: Any) -> dict[str, Any]:
    """Settings of an S3ObjectTier on ``server`` (short timeouts: faults show fast)."""
    settings: dict[str, Any] = {
        "endpoint_url": server.url, "region": REGION, "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY, "addressing": "path", "max_attempts": 3,
        "connect_timeout": 2.0, "read_timeout": 10.0,
    }
    settings.update(SMALL)
    settings.update(extra)
    return settings


@dataclass
class Cold:
    """One engine under test plus raw access to its store."""

    kind: str
    tier: ObjectTier
    raw_get: Callable[[str], bytes]
    raw_put: Callable[[str, bytes], None]
    raw_exists: Callable[[str], bool]


def _file_cold(tmp_path: Path) -> Cold:
    root = tmp_path / "cold"
    tier = open_object_tier(f"file://{root}", **SMALL)

    def put(key: str, data: bytes) -> None:
        p = root / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    return Cold("file", tier, lambda k: (root / k).read_bytes(), put,
                lambda k: (root / k).is_file())


def _s3_cold(server: MotoServer) -> Cold:
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    tier = open_object_tier(f"s3://{COLD_BUCKET}/{prefix}", **s3_settings(server))
    client = server.client()

    def get(key: str) -> bytes:
        return bytes(client.get_object(Bucket=COLD_BUCKET, Key=f"{prefix}/{key}")["Body"].read())

    def exists(key: str) -> bool:
        r = client.list_objects_v2(Bucket=COLD_BUCKET, Prefix=f"{prefix}/{key}")
        return any(o["Key"] == f"{prefix}/{key}" for o in r.get("Contents", []))

    return Cold("s3", tier, get,
                lambda k, d: client.put_object(Bucket=COLD_BUCKET, Key=f"{prefix}/{k}", Body=d),
                exists)


def _memory_cold() -> Cold:
    root = f"/tierd-{uuid.uuid4().hex[:12]}"
    tier = open_object_tier(f"memory://{root}", **SMALL)
    fs = fsspec.filesystem("memory")
    return Cold("memory", tier, lambda k: bytes(fs.cat_file(f"{root}/{k}")),
                lambda k, d: fs.pipe_file(f"{root}/{k}", d),
                lambda k: bool(fs.isfile(f"{root}/{k}")))


@pytest.fixture(params=["file", "s3", "memory"])
def cold(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cold]:
    kind = request.param
    if kind == "file":
        c = _file_cold(tmp_path)
    elif kind == "s3":
        c = _s3_cold(request.getfixturevalue("moto"))
    else:
        c = _memory_cold()
    try:
        yield c
    finally:
        asyncio.run(c.tier.close())


def pattern(size: int, seed: int = 0) -> bytes:
    """Deterministic random bytes: a shifted or misplaced range never compares equal."""
    return random.Random(seed).randbytes(size)
