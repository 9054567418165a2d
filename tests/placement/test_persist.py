"""Write-back and read-through against real cold stores (file:// and moto over HTTP)."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Sequence
from typing import Any

import pytest

from tierd.errors import FsError, Reason
from tierd.meta import STATE_CLEAN
from tierd.placement import HOT, bitmap
from tierd.tiers import BLOCK_SIZE, TierError

from .conftest import ROOT, Env, MiB, body, read_file, write_file


async def test_file_written_through_namespace_is_persisted(env: Env) -> None:
    ns, p = await env.open()
    try:
        b = await ns.create_bucket(ROOT, "data")
        sub = await ns.mkdir(ROOT, b.ino, b"dir", 0o755)
        payload = os.urandom(9 * MiB + 123)
        ino = await write_file(ns, sub.ino, b"f.bin", payload)
        await ns.put_object(ROOT, "data", "obj/x.txt", body(b"hello"))
        empty = await write_file(ns, b.ino, b"empty", b"")
        assert await p.drain(timeout=30)
        assert env.raw_get("data/dir/f.bin") == payload
        assert env.raw_get("data/obj/x.txt") == b"hello"
        assert env.raw_get("data/empty") == b""
        with p.meta.snapshot() as tx:
            for i in (ino, empty):
                inode = tx.get_inode(i)
                assert inode is not None and inode.state == STATE_CLEAN
                rec = tx.get_cold(i)
                assert rec is not None and rec.version == inode.version
        assert p.dirty_bytes == 0
    finally:
        await env.close()


async def test_object_put_into_cold_is_listed_and_read_through(env: Env) -> None:
    ns, p = await env.open()
    try:
        await ns.create_bucket(ROOT, "dsx")
        payload = os.urandom(3 * BLOCK_SIZE + 5)
        env.raw_put("dsx/train/shard-0", payload)
        env.raw_put("dsx/train/sub/shard-1", b"one")
        env.raw_put("dsx/top", b"top")
        listing = await ns.list_objects(ROOT, "dsx", "train/", delimiter="/")
        assert [k for k, _ in listing.contents] == ["train/shard-0"]
        assert listing.prefixes == ["train/sub/"]
        assert listing.contents[0][1].size == len(payload)
        full = await ns.list_objects(ROOT, "dsx")
        assert [k for k, _ in full.contents] == ["top", "train/shard-0", "train/sub/shard-1"]
        reader = await ns.get_object(ROOT, "dsx", "train/shard-0", ensure=False)
        try:
            assert b"".join([c async for c in reader.iter(BLOCK_SIZE + 1, 10)]) == \
                payload[BLOCK_SIZE + 1 : BLOCK_SIZE + 11]
        finally:
            await reader.close()
        inode = await ns.resolve(ROOT, "dsx/train/shard-0")
        assert inode.blocks[HOT] == b"\x02"  # only the block that was read
        assert await read_file(ns, inode.ino, chunk=3 * MiB) == payload
        inode = await ns.resolve(ROOT, "dsx/train/shard-0")
        assert inode.blocks[HOT] == b"\x0f"
        assert p.used >= len(payload)
        # FUSE path: lookup of a name put into cold after the directory was listed
        env.raw_put("dsx/train/late", b"late")
        d = await ns.resolve(ROOT, "dsx/train")
        late = await ns.lookup(ROOT, d.ino, b"late")
        assert await read_file(ns, late.ino) == b"late"
        names = [n for n, _ in await ns.listdir(ROOT, d.ino)]
        assert names == [b"late", b"shard-0", b"sub"]
        # S3 path: a key never listed
        env.raw_put("dsx/deep/a/b/c.txt", b"deep")
        reader = await ns.get_object(ROOT, "dsx", "deep/a/b/c.txt")
        try:
            assert await reader.read_all() == b"deep"
        finally:
            await reader.close()
    finally:
        await env.close()


async def test_bucket_in_cold_appears_at_start(env: Env) -> None:
    env.raw_put("legacy/x/y", b"xy")
    ns, _ = await env.open()
    try:
        names = [b.name for b in await ns.list_buckets(ROOT)]
        assert "legacy" in names
        r = await ns.get_object(ROOT, "legacy", "x/y")
        try:
            assert await r.read_all() == b"xy"
        finally:
            await r.close()
    finally:
        await env.close()


async def test_rename_unlink_and_links_follow_in_cold(env: Env) -> None:
    ns, p = await env.open()
    try:
        b = await ns.create_bucket(ROOT, "bkt")
        d = await ns.mkdir(ROOT, b.ino, b"d", 0o755)
        ino = await write_file(ns, d.ino, b"a", b"AAA")
        await write_file(ns, b.ino, b"gone", b"G")
        assert await p.drain(timeout=30)
        assert env.raw_exists("bkt/d/a") and env.raw_exists("bkt/gone")
        await ns.rename(ROOT, d.ino, b"a", b.ino, b"b")
        await ns.link(ROOT, ino, d.ino, b"hard")
        await ns.unlink(ROOT, b.ino, b"gone")
        assert await p.drain(timeout=30)
        assert not env.raw_exists("bkt/d/a") and not env.raw_exists("bkt/gone")
        assert env.raw_get("bkt/b") == b"AAA" and env.raw_get("bkt/d/hard") == b"AAA"
        # a directory rename moves every file below it
        await ns.rename(ROOT, b.ino, b"d", b.ino, b"e")
        await ns.unlink(ROOT, b.ino, b"b")
        assert await p.drain(timeout=30)
        assert env.raw_get("bkt/e/hard") == b"AAA"
        assert not env.raw_exists("bkt/d/hard") and not env.raw_exists("bkt/b")
        # S3 overwrite and delete
        await ns.put_object(ROOT, "bkt", "k", body(b"v1"))
        await ns.put_object(ROOT, "bkt", "k", body(b"v2"))
        assert await p.drain(timeout=30)
        assert env.raw_get("bkt/k") == b"v2"
        await ns.delete_object(ROOT, "bkt", "k")
        assert await p.drain(timeout=30)
        assert not env.raw_exists("bkt/k")
        with p.meta.snapshot() as tx:
            assert tx.list_queue() == []
    finally:
        await env.close()


async def test_file_changed_while_uploading_ends_newest(env: Env) -> None:
    ns, p = await env.open()
    gate = asyncio.Event()
    started = asyncio.Event()
    real_put = p.cold.put_file

    async def slow_put(*a: object, **kw: object) -> object:
        started.set()
        await gate.wait()
        return await real_put(*a, **kw)  # type: ignore[arg-type]

    p.cold.put_file = slow_put  # type: ignore[method-assign]
    try:
        b = await ns.create_bucket(ROOT, "ckx")
        v1 = os.urandom(2 * MiB)
        ino = await write_file(ns, b.ino, b"ckpt", v1)
        await asyncio.wait_for(started.wait(), 10)
        v2 = os.urandom(3 * MiB)
        fh = await ns.open(ROOT, ino, os.O_WRONLY | os.O_TRUNC)
        await ns.write(fh, 0, v2)
        await ns.release(fh)
        gate.set()
        assert await p.drain(timeout=30)
        assert env.raw_get("ckx/ckpt") == v2
        with p.meta.snapshot() as tx:
            inode = tx.get_inode(ino)
            rec = tx.get_cold(ino)
            assert inode is not None and rec is not None
            assert inode.state == STATE_CLEAN and rec.version == inode.version
    finally:
        gate.set()
        await env.close()


async def test_dirty_bound_slows_writers(file_env: Env) -> None:
    ns, p = await file_env.open(dirty_limit=2 * MiB)
    gate = asyncio.Event()
    real_put = p.cold.put_file

    async def blocked_put(*a: object, **kw: object) -> object:
        await gate.wait()
        return await real_put(*a, **kw)  # type: ignore[arg-type]

    p.cold.put_file = blocked_put  # type: ignore[method-assign]
    try:
        b = await ns.create_bucket(ROOT, "www")
        await write_file(ns, b.ino, b"big", os.urandom(3 * MiB))
        assert p.dirty_bytes > p.settings.dirty_limit
        with pytest.raises(FsError) as ei:
            await ns.put_object(ROOT, "www", "k", body(b"x"))
        assert ei.value.errno == errno.EAGAIN and ei.value.reason is Reason.SLOW_DOWN
        writer = asyncio.create_task(write_file(ns, b.ino, b"next", b"y" * 1000))
        await asyncio.sleep(0.3)
        assert not writer.done()  # waits, nothing dropped
        gate.set()
        await asyncio.wait_for(writer, 20)
        assert await p.drain(timeout=30)
        assert file_env.raw_get("www/next") == b"y" * 1000
    finally:
        gate.set()
        await file_env.close()


async def test_write_through_policy_waits_for_cold(file_env: Env) -> None:
    from tierd.placement.ops import PlacementOps

    ns, p = await file_env.open()
    try:
        await ns.create_bucket(ROOT, "wtx")
        ops = PlacementOps(p)
        await ops.set_policy("wtx/sync/", mode="write-through")
        await ops.set_policy("wtx/tmp/", mode="cache-only")
        await ns.put_object(ROOT, "wtx", "sync/a", body(b"now"))
        assert file_env.raw_get("wtx/sync/a") == b"now"  # already there at the ack
        await ns.put_object(ROOT, "wtx", "tmp/s", body(b"scratch"))
        assert await p.drain(timeout=10)
        assert not file_env.raw_exists("wtx/tmp/s")
    finally:
        await file_env.close()


async def test_restart_resumes_queue(file_env: Env) -> None:
    ns, p = await file_env.open()
    b = await ns.create_bucket(ROOT, "rsx")
    await p.close()  # persister stopped: the queue stays
    await write_file(ns, b.ino, b"f", b"resume me")
    await file_env.close()
    ns, p = await file_env.open()
    try:
        assert await p.drain(timeout=20)
        assert file_env.raw_get("rsx/f") == b"resume me"
    finally:
        await file_env.close()


async def test_deleted_key_is_not_reimported_before_cold_delete(file_env: Env) -> None:
    ns, p = await file_env.open()
    gate = asyncio.Event()
    real_delete = p.cold.delete_many

    async def slow_delete(keys: Sequence[str]) -> dict[str, TierError | None]:
        await gate.wait()
        return await real_delete(keys)

    p.cold.delete_many = slow_delete  # type: ignore[method-assign]
    try:
        await ns.create_bucket(ROOT, "dlx")
        await ns.put_object(ROOT, "dlx", "d/k", body(b"v"))
        assert await p.drain(timeout=10)
        await ns.delete_object(ROOT, "dlx", "d/k")
        await asyncio.sleep(0.1)  # the persister is waiting on the cold delete
        assert file_env.raw_exists("dlx/d/k")
        assert (await ns.list_objects(ROOT, "dlx")).contents == []
        assert (await ns.list_objects(ROOT, "dlx", delimiter="/")).prefixes == []
        gate.set()
        assert await p.drain(timeout=10)
        assert not file_env.raw_exists("dlx/d/k")
    finally:
        gate.set()
        await file_env.close()


async def test_concurrent_readers_share_one_fetch_and_streams_read_ahead(env: Env) -> None:
    """Eight readers of one missing block cause one cold request for it; a sequential
    reader finds the blocks ahead of it already on hot (readahead), fetched in runs."""
    ns, p = await env.open()
    calls: list[tuple[int, int]] = []
    real = p.cold.read_into

    async def counting(key: str, offset: int, length: int, *a: Any, **kw: Any) -> Any:
        calls.append((offset, length))
        return await real(key, offset, length, *a, **kw)

    p.cold.read_into = counting  # type: ignore[method-assign]
    try:
        await ns.create_bucket(ROOT, "rdx")
        nblocks = 12
        payload = os.urandom(nblocks * BLOCK_SIZE)
        env.raw_put("rdx/a", payload)
        env.raw_put("rdx/b", payload[::-1])
        await ns.list_objects(ROOT, "rdx")  # imported lazily by the listing
        a = await ns.resolve(ROOT, "rdx/a")
        await asyncio.gather(*(p.ensure(a.ino, 5, 100, touch=False) for _ in range(8)))
        assert calls == [(0, BLOCK_SIZE)], calls  # one fill of block 0, shared by eight
        assert (await ns.resolve(ROOT, "rdx/a")).blocks[HOT] == b"\x01"

        calls.clear()
        b = await ns.resolve(ROOT, "rdx/b")
        await p.ensure(b.ino, 0, MiB)
        await p.ensure(b.ino, MiB, BLOCK_SIZE)  # sequential: the stream is seen
        await p.quiesce(b.ino)
        fetched = sum(n for _, n in calls)
        on_hot = (await ns.resolve(ROOT, "rdx/b")).blocks[HOT]
        ahead = [blk for blk in range(2, nblocks) if bitmap.has(on_hot, blk)]
        assert ahead, f"no block past the reader arrived: {on_hot!r}"
        assert fetched >= (2 + len(ahead)) * BLOCK_SIZE
        assert len(calls) < 2 + len(ahead), calls  # runs of blocks, not one GET per block
        assert await read_file(ns, b.ino, chunk=3 * MiB) == payload[::-1]
    finally:
        await env.close()


async def test_imported_objects_inherit_the_default_acl(file_env: Env) -> None:
    """Objects found in cold get what a create in their directory would: the default ACL
    (directories keep it as their own default too), else the umask."""
    from tierd.acl import posix_acl as pa

    default = pa.serialize((pa.AclEntry(pa.USER_OBJ, 7), pa.AclEntry(pa.USER, 5, 1001),
                            pa.AclEntry(pa.GROUP_OBJ, 5), pa.AclEntry(pa.MASK, 5),
                            pa.AclEntry(pa.OTHER, 0)))
    ns, _ = await file_env.open()
    try:
        b = await ns.create_bucket(ROOT, "acls")
        await ns.setxattr(ROOT, b.ino, pa.DEFAULT_XATTR, default)
        file_env.raw_put("acls/sub/f.bin", b"from cold")
        file_env.raw_put("acls/top.bin", b"top")
        await ns.list_objects(ROOT, "acls")
        f = await ns.resolve(ROOT, "acls/sub/f.bin")
        sub = await ns.resolve(ROOT, "acls/sub")
        top = await ns.resolve(ROOT, "acls/top.bin")
        assert f.perm == 0o640 and top.perm == 0o640  # rw from u::rwx & 0666, mask r-x & rw-
        assert {(e.tag, e.perm, e.id) for e in pa.parse(f.acl_access)} >= {(pa.USER, 5, 1001)}
        assert sub.acl_default == default and sub.perm == 0o750
        assert await ns.getxattr(ROOT, f.ino, pa.ACCESS_XATTR) == f.acl_access
    finally:
        await file_env.close()


async def test_a_hot_tier_lost_apart_from_the_metadata_is_read_from_cold(env: Env) -> None:
    """Metadata says the bytes are on hot, the hot files are gone (a restored metadata
    backup, a wiped NVMe): at start placement records them as absent and reads fetch them
    from cold, whole, instead of returning the empty files the namespace would make."""
    ns, p = await env.open()
    payload = os.urandom(2 * BLOCK_SIZE + 11)
    try:
        await ns.create_bucket(ROOT, "lost")
        await ns.put_object(ROOT, "lost", "clean.bin", body(payload))
        assert await p.drain(timeout=30)
        ino = (await ns.resolve(ROOT, "lost/clean.bin")).ino
    finally:
        await env.close()
    os.unlink(env.hot_dir / f"{ino:016x}"[-2:] / f"{ino:016x}")
    ns, p = await env.open()
    try:
        assert (await ns.resolve(ROOT, "lost/clean.bin")).blocks.get(HOT) == b""
        assert await read_file(ns, ino) == payload
        assert p.stats.fetched_bytes == len(payload)
    finally:
        await env.close()
