"""The persister's per-file cost and the ETag it learns.

* Content written through handles (the FUSE door) commits with an unknown ETag: hashing
  behind the writer halved a sequential writer's speed.  The upload hashes the bytes it
  sends and records the MD5 as the inode's ETag, in the record transaction, only for the
  version it uploaded.
* An empty file is uploaded without opening (or creating) its hot file.
* The persist delay reads each queued file's first-queued time once, not on every pass.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any

import pytest

from tierd.acl import Identity
from tierd.meta import EMPTY_MD5, STATE_CLEAN
from tierd.meta.store import MetaTxn
from tierd.placement import placement as placement_mod
from tierd.placement.upload import Round

from .conftest import Env, write_file

ROOT = Identity.ROOT
MiB = 1 << 20


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def count_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count the calls of the real ``MetaTxn.<name>`` (a one-element list, reset by the
    caller): the real method still answers."""
    calls = [0]
    real = getattr(MetaTxn, name)

    def counted(tx: MetaTxn, *args: Any) -> Any:
        calls[0] += 1
        return real(tx, *args)

    monkeypatch.setattr(MetaTxn, name, counted)
    return calls


@pytest.mark.parametrize("size", [100_000, 7 * MiB])  # a single PUT and a multipart upload
async def test_upload_records_the_md5_of_handle_written_content(env: Env, size: int) -> None:
    ns, p = await env.open()
    try:
        b = await ns.create_bucket(ROOT, "etg")
        data = os.urandom(size)
        ino = await write_file(ns, b.ino, b"f", data)
        with ns.meta.snapshot() as tx:
            committed = tx.get_inode(ino)
        assert committed is not None and committed.etag == ""  # not hashed while written
        assert await p.drain(timeout=60)
        with ns.meta.snapshot() as tx:
            inode, rec = tx.get_inode(ino), tx.get_cold(ino)
        assert inode is not None and rec is not None
        assert inode.etag == md5(data) and inode.state == STATE_CLEAN
        assert rec.version == inode.version and rec.size == size
        assert env.raw_get("etg/f") == data
        if size < 6 * MiB:  # a single PUT: the store's ETag is the MD5 the persister sent
            assert rec.keys == {"etg/f": md5(data)}
        assert (await ns.head_object(ROOT, "etg", "f")).etag == md5(data)
    finally:
        await env.close()


async def test_a_learned_md5_is_kept_only_for_the_version_it_hashed(file_env: Env) -> None:
    """The record transaction must not label a newer version with an older MD5."""
    ns, p = await file_env.open(persist_delay=3600)
    try:
        b = await ns.create_bucket(ROOT, "etg")
        ino = await write_file(ns, b.ino, b"f", b"old bytes")
        with ns.meta.snapshot() as tx:
            old = tx.get_inode(ino)
        assert old is not None
        await write_file(ns, b.ino, b"f", b"new bytes")  # a newer version, ETag unknown
        with ns.meta.write() as tx:
            p._learn_etag(tx, Round(ino, md5=md5(b"old bytes"), md5_version=old.version))
        with ns.meta.snapshot() as tx:
            cur = tx.get_inode(ino)
        assert cur is not None and cur.version != old.version and cur.etag == ""
        assert await ns.etag(ino) == md5(b"new bytes")
        with ns.meta.write() as tx:  # a known ETag is never replaced either
            p._learn_etag(tx, Round(ino, md5="0" * 32, md5_version=cur.version))
        assert await ns.etag(ino) == md5(b"new bytes")
    finally:
        await file_env.close()


async def test_an_empty_file_is_persisted_without_its_hot_file(env: Env) -> None:
    ns, p = await env.open()
    try:
        b = await ns.create_bucket(ROOT, "etg")
        inode, fh = await ns.create(ROOT, b.ino, b"empty", 0o644, os.O_WRONLY)
        await ns.release(fh)
        assert await p.drain(timeout=60)
        assert env.raw_get("etg/empty") == b""
        with ns.meta.snapshot() as tx:
            cur, rec = tx.get_inode(inode.ino), tx.get_cold(inode.ino)
        assert cur is not None and cur.etag == EMPTY_MD5 and cur.state == STATE_CLEAN
        assert rec is not None and rec.keys == {"etg/empty": EMPTY_MD5}
        assert not os.path.exists(ns.hot.path(inode.ino))  # never created for the upload
    finally:
        await env.close()


async def test_the_persist_delay_reads_each_queue_token_once(
    file_env: Env, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every pass of the persister looked at every waiting file's queue token again (in a
    create burst: once per create, 117,000 reads for 3,000 files)."""
    monkeypatch.setattr(placement_mod, "FULL_SCAN_INTERVAL", 0.0)  # every pass a full one
    reads = count_calls(monkeypatch, "queued")
    ns, p = await file_env.open(persist_delay=3600)
    try:
        b = await ns.create_bucket(ROOT, "dly")
        for i in range(100):
            await write_file(ns, b.ino, f"f{i}".encode(), b"x")
        await asyncio.sleep(0.2)  # the persister has seen them all
        reads[0] = 0
        for _ in range(20):  # twenty passes over the whole queue
            p.wake()
            await asyncio.sleep(0.02)
        assert reads[0] < 100, f"{reads[0]} queue reads for 20 passes over 100 waiting files"
        assert not file_env.raw_exists("dly/f0")  # still waiting out the delay
    finally:
        await file_env.close()


async def test_a_file_queued_again_waits_the_delay_from_its_new_queueing(
    file_env: Env,
) -> None:
    """The remembered first-queued time is forgotten when the file leaves the queue."""
    ns, p = await file_env.open(persist_delay=1.5)
    try:
        b = await ns.create_bucket(ROOT, "dly")
        await write_file(ns, b.ino, b"f", b"one")
        await asyncio.sleep(2.0)
        assert await p.drain(timeout=30)
        assert file_env.raw_get("dly/f") == b"one"
        await asyncio.sleep(2.0)  # the first queueing is long past the delay now
        await write_file(ns, b.ino, b"f", b"two")
        await asyncio.sleep(0.7)
        assert file_env.raw_get("dly/f") == b"one"  # inside the new delay
        for _ in range(100):
            if file_env.raw_get("dly/f") == b"two":
                break
            await asyncio.sleep(0.1)
        assert file_env.raw_get("dly/f") == b"two"
    finally:
        await file_env.close()


async def test_persist_wait_does_not_list_the_whole_queue_per_persisted_file(
    file_env: Env, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``drain`` asked after every persisted file whether any is left by listing the whole
    queue: quadratic in the queued files, on the event loop (25 s for 3,000 in a profile).
    Only the persister's full scans (every few seconds) may list it now."""
    lists = count_calls(monkeypatch, "list_queue")
    ns, p = await file_env.open(persist_delay=3600)
    try:
        b = await ns.create_bucket(ROOT, "drn")
        for i in range(150):
            await write_file(ns, b.ino, f"f{i}".encode(), b"x")
        lists[0] = 0
        assert await p.drain(timeout=120)
        assert lists[0] <= 10, f"the queue was listed {lists[0]} times to drain 150 files"
        assert file_env.raw_get("drn/f149") == b"x"
    finally:
        await file_env.close()
