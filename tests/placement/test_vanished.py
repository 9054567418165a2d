"""Objects deleted from the cold store by someone else: a clean file is not served stale
forever (a read miss answers ENOENT/NoSuchKey and drops it; a re-listing drops it), and data
cold does not have -- dirty or open with unflushed writes -- is never dropped."""

from __future__ import annotations

import asyncio
import errno
import os

import pytest

from tierd.errors import FsError, Reason
from tierd.placement.ops import PlacementOps

from .conftest import ROOT, Env, MiB, read_file, until, write_file


async def test_read_miss_on_a_vanished_object_is_enoent_and_drops_it(env: Env) -> None:
    env.raw_put("vnx/a", os.urandom(2 * MiB))
    env.raw_put("vnx/keep", b"stays")
    ns, p = await env.open()
    try:
        await ns.list_objects(ROOT, "vnx")
        a = await ns.resolve(ROOT, "vnx/a")
        env.raw_delete("vnx/a")
        fh = await ns.open(ROOT, a.ino, os.O_RDONLY)
        with pytest.raises(FsError) as ei:
            await ns.read(fh, 0, MiB)
        assert ei.value.errno == errno.ENOENT and ei.value.reason is Reason.NO_SUCH_KEY
        with ns.meta.snapshot() as tx:  # an orphan while the handle holds it...
            assert a.ino in tx.list_orphans()
        await ns.release(fh)
        with ns.meta.snapshot() as tx:  # ...reaped at its release, not at the next start
            assert tx.get_inode(a.ino) is None and a.ino not in tx.list_orphans()
        with pytest.raises(FsError) as ei:
            await ns.resolve(ROOT, "vnx/a")
        assert ei.value.errno == errno.ENOENT
        assert p.stats.vanished == 1
        with pytest.raises(FsError) as ei:  # the S3 door: NoSuchKey (404)
            await ns.get_object(ROOT, "vnx", "a")
        assert ei.value.errno == errno.ENOENT
        reader = await ns.get_object(ROOT, "vnx", "keep")
        assert reader.size == 5
        await reader.close()
        env.raw_put("vnx/a", b"new upload")  # put again: imported again
        assert (await ns.head_object(ROOT, "vnx", "a")).size == len(b"new upload")
    finally:
        await env.close()


async def test_relisting_drops_clean_entries_but_never_unpersisted_data(env: Env) -> None:
    """A clean file whose object vanished is dropped only when no complete local copy
    exists: ``cached`` (read whole onto hot) is uploaded again, ``gone`` (never read) is
    dropped, ``mine`` (open with unflushed writes) is kept."""
    env.raw_put("rlx/d/cached", os.urandom(MiB))
    env.raw_put("rlx/d/gone", b"x")
    ns, p = await env.open()
    try:
        await ns.list_objects(ROOT, "rlx")
        d = await ns.resolve(ROOT, "rlx/d")
        names = {n for n, _ in await ns.listdir(ROOT, d.ino)}
        assert names == {b"cached", b"gone"}
        cached = await ns.resolve(ROOT, "rlx/d/cached")
        want = await read_file(ns, cached.ino)  # on hot now: a complete local copy
        reader = await ns.open(ROOT, cached.ino, os.O_RDONLY)  # held across the relisting
        gone = await ns.resolve(ROOT, "rlx/d/gone")
        gone_reader = await ns.open(ROOT, gone.ino, os.O_RDONLY)  # held across the drop
        mine = os.urandom(MiB)
        ino = await write_file(ns, d.ino, b"mine", mine)
        assert await p.drain("rlx/", timeout=30)
        fh = await ns.open(ROOT, ino, os.O_WRONLY)  # open with unflushed writes...
        await ns.write(fh, 0, b"changed")
        for k in ("rlx/d/cached", "rlx/d/gone", "rlx/d/mine"):
            env.raw_delete(k)
        names = {n for n, _ in await ns.listdir(ROOT, d.ino)}
        assert names == {b"cached", b"mine"}  # ...is kept, and so is the complete copy
        assert p.stats.vanished == 1 and p.stats.reuploaded == 1
        with pytest.raises(FsError) as ei:  # an open handle gets ENOENT, not punched zeros
            await ns.read(gone_reader, 0, 100)
        assert ei.value.errno == errno.ENOENT
        await ns.release(gone_reader)
        assert await ns.read(reader, 0, MiB) == want
        await ns.release(reader)
        await ns.release(fh)  # and its content reaches cold again
        assert await p.drain("rlx/", timeout=30)
        await until(lambda: env.raw_exists("rlx/d/mine") and env.raw_exists("rlx/d/cached"))
        assert env.raw_get("rlx/d/mine") == b"changed" + mine[7:]
        assert env.raw_get("rlx/d/cached") == want
        assert {n for n, _ in await ns.listdir(ROOT, d.ino)} == {b"cached", b"mine"}
    finally:
        await env.close()


async def test_dirty_file_whose_object_vanished_is_kept_and_repersisted(file_env: Env) -> None:
    ns, p = await file_env.open()
    try:
        b = await ns.create_bucket(ROOT, "dvx")
        v1 = os.urandom(MiB)
        ino = await write_file(ns, b.ino, b"f", v1)
        assert await p.drain("dvx/", timeout=30)
        await p.close()  # the persister stops: the next version stays dirty
        fh = await ns.open(ROOT, ino, os.O_WRONLY | os.O_TRUNC)
        await ns.write(fh, 0, b"v2")
        await ns.release(fh)
        file_env.raw_delete("dvx/f")
        assert {n for n, _ in await ns.listdir(ROOT, b.ino)} == {b"f"}
        assert await read_file(ns, ino) == b"v2"
        await p.start()
        assert await p.drain("dvx/", timeout=30)
        assert file_env.raw_get("dvx/f") == b"v2"
    finally:
        await asyncio.sleep(0)
        await file_env.close()


async def test_recursive_import_drops_what_vanished_under_the_prefix(env: Env) -> None:
    for k in ("ipx/d/a", "ipx/d/e/b", "ipx/other"):
        env.raw_put(k, b"data")
    ns, p = await env.open()
    ops = PlacementOps(p)
    try:
        assert (await ops.import_prefix("ipx/"))["imported"] >= 3
        env.raw_delete("ipx/d/e/b")
        env.raw_delete("ipx/other")
        await ops.import_prefix("ipx/d/")  # only the prefix's subtree is compared
        with pytest.raises(FsError):
            await ns.resolve(ROOT, "ipx/d/e/b")
        assert (await ns.resolve(ROOT, "ipx/d/a")).size == 4
        assert (await ns.resolve(ROOT, "ipx/other")).size == 4  # outside: not looked at
        assert p.stats.vanished == 1
        objs = await ns.list_objects(ROOT, "ipx")  # S3 listing without delimiter
        assert p.stats.vanished == 2
        assert [k for k, _ in objs.contents] == ["d/a"]
    finally:
        await env.close()
