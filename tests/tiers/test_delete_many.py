"""``ObjectTier.delete_many``, the pending deletes' batch call, on every engine (file://,
s3:// on moto over HTTP, memory://): each key's outcome is what :meth:`delete` would have
given it -- gone, nothing there, or that key's own error -- and the S3 engine sends one
``DeleteObjects`` per 1000 keys (the delete worker's cost per unlinked file was one
request each)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from moto_server import MotoServer

from tierd.tiers import (
    InvalidKey,
    KeyRejected,
    ObjectNotFound,
    TierError,
    TierUnavailable,
    open_object_tier,
)
from tierd.tiers.s3_errors import delete_errors
from tierd.tiers.s3_tier import S3ObjectTier

from .conftest import Cold, s3_settings
from .test_object_tier import list_all, put_bytes


async def test_delete_many_outcomes(cold: Cold, tmp_path: Path) -> None:
    keys = ["bkt/a/b/c", "bkt/a/d", "bkt/keep", "bkt/e\x01f", "bkt/sp ace+%"]
    for k in keys:
        await put_bytes(cold.tier, tmp_path, k, k.encode())
    gone = ["bkt/a/b/c", "bkt/a/d", "bkt/e\x01f", "bkt/sp ace+%"]
    out = await cold.tier.delete_many([*gone, "bkt/missing", "bkt/a", "bad//key"])
    assert set(out) == {*gone, "bkt/missing", "bkt/a", "bad//key"}
    assert all(out[k] is None for k in (*gone, "bkt/missing", "bkt/a")), out
    assert isinstance(out["bad//key"], InvalidKey)
    for k in gone:
        assert not cold.raw_exists(k)
        assert await cold.tier.head(k) is None
    assert cold.raw_get("bkt/keep") == b"bkt/keep"
    keys_left, prefixes, _ = await list_all(cold.tier, "bkt/", "/")
    assert (keys_left, prefixes) == (["bkt/keep"], [])  # "a/" went with its last key
    assert await cold.tier.delete_many([]) == {}
    assert await cold.tier.delete_many(gone) == dict.fromkeys(gone)  # again: idempotent


async def test_delete_many_past_one_request(cold: Cold, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """1,001 keys: S3 sends two ``DeleteObjects`` (1000 keys at most each)."""
    keys = [f"bkt/k{i:04}" for i in range(1001)]
    for k in (keys[0], keys[999], keys[1000]):
        await put_bytes(cold.tier, tmp_path, k, b"x")
    requests: list[int] = []
    if isinstance(cold.tier, S3ObjectTier):
        real = cold.tier._delete_objects

        def counted(b: str, names: dict[str, str]) -> dict[str, TierError | None]:
            requests.append(len(names))
            return real(b, names)
        monkeypatch.setattr(cold.tier, "_delete_objects", counted)
    out = await cold.tier.delete_many(keys)
    assert out == dict.fromkeys(keys)
    assert not any(cold.raw_exists(k) for k in (keys[0], keys[999], keys[1000]))
    if isinstance(cold.tier, S3ObjectTier):
        assert sorted(requests) == [1, 1000]


async def test_delete_many_per_bucket_layout(moto: MotoServer, tmp_path: Path) -> None:
    """One S3 bucket per tierd bucket: a request per bucket, and a bucket that does not
    exist holds nothing to delete."""
    tier = open_object_tier("s3://", **s3_settings(moto))
    try:
        for k in ("dm-one/a", "dm-one/b/c", "dm-two/x"):
            await put_bytes(tier, tmp_path, k, b"v")
        out = await tier.delete_many(["dm-one/a", "dm-two/x", "dm-none-pb/k", "dm-one/b/c"])
        assert out == dict.fromkeys(["dm-one/a", "dm-two/x", "dm-none-pb/k", "dm-one/b/c"])
        for k in ("dm-one/a", "dm-one/b/c", "dm-two/x"):
            assert await tier.head(k) is None
    finally:
        await tier.close()


async def test_delete_many_store_down_raises(tmp_path: Path) -> None:
    """Nothing answers: the whole call is TierUnavailable (no key is known deleted)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings: dict[str, Any] = {
        "endpoint_url": f"http://127.0.0.1:{port}", "region": "us-east-1",
        "access_key": "k", "secret_key": "s", "addressing": "path", "max_attempts": 1,
        "connect_timeout": 1.0, "read_timeout": 2.0}
    tier = open_object_tier("s3://cold/p", **settings)
    try:
        with pytest.raises(TierUnavailable):
            await tier.delete_many(["bkt/a", "bkt/b"])
    finally:
        await tier.close()


def test_delete_errors_map_like_delete() -> None:
    """Each key's code in a ``DeleteObjects`` answer maps as a ``DeleteObject``'s would."""
    names = {f"p/{k}": f"b/{k}" for k in ("ok", "gone", "slow", "deny", "long", "odd")}
    errors = [{"Key": "p/gone", "Code": "NoSuchKey"}, {"Key": "p/slow", "Code": "SlowDown"},
              {"Key": "p/deny", "Code": "AccessDenied"},
              {"Key": "p/long", "Code": "KeyTooLongError"},
              {"Key": "p/odd", "Code": "SomethingElse", "Message": "no"},
              {"Key": "p/not-asked", "Code": "InternalError"}]
    out = delete_errors(errors, names, "s3://c", "c")
    assert set(out) == set(names.values())
    assert out["b/ok"] is None and out["b/gone"] is None
    assert isinstance(out["b/slow"], TierUnavailable)
    assert isinstance(out["b/deny"], TierUnavailable)
    assert isinstance(out["b/long"], KeyRejected)
    odd = out["b/odd"]
    assert isinstance(odd, TierError) and not isinstance(
        odd, TierUnavailable | KeyRejected | ObjectNotFound)
