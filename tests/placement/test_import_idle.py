"""Transparent import at ``import_ttl`` 0 (every look-up of a name a directory lacks lists
cold): a listing that finds nothing to import and nothing lost commits nothing.

Before, each such look-up ran a write transaction that only stamped the directory (a stamp
is never fresh at TTL 0): over PostgreSQL the cluster's writer lock and a commit for every
new name made through FUSE (docs/metadata.md, "Measured").  The stamp it wrote is what the
test sees; the import and the judgement of lost files still run when the listing has
something (``test_vanished.py`` drops and re-uploads from an emptied listing)."""

from __future__ import annotations

import errno
import os

import pytest

from tierd.errors import FsError

from .conftest import ROOT, Env, write_file


async def test_a_miss_with_nothing_in_cold_commits_nothing(file_env: Env) -> None:
    ns, p = await file_env.open(persist_delay=600.0)  # the new file stays queued
    try:
        b = await ns.create_bucket(ROOT, "idle")
        d = await ns.mkdir(ROOT, b.ino, b"d", 0o755)
        await write_file(ns, d.ino, b"f", b"new")
        with pytest.raises(FsError) as ei:
            await ns.lookup(ROOT, d.ino, b"missing")
        assert ei.value.errno == errno.ENOENT
        with p.meta.snapshot() as tx:
            assert tx.get_stamp(d.ino) == 0, "the empty listing was committed"
        # something in cold: imported at the next miss (and the directory stamped)
        file_env.raw_put("idle/d/outside", b"from another client")
        got = await ns.lookup(ROOT, d.ino, b"outside")
        assert got.size == len(b"from another client")
        with p.meta.snapshot() as tx:
            assert tx.get_stamp(d.ino) > 0
        assert {n for n, _ in await ns.listdir(ROOT, d.ino)} == {b"f", b"outside"}
    finally:
        await file_env.close()


async def test_a_miss_still_finds_a_clean_file_cold_lost(file_env: Env) -> None:
    """The listing is empty, but a persisted file is missing from it: judged (re-uploaded
    from its complete local copy), as before."""
    ns, p = await file_env.open()
    try:
        b = await ns.create_bucket(ROOT, "lost")
        d = await ns.mkdir(ROOT, b.ino, b"d", 0o755)
        await write_file(ns, d.ino, b"f", os.urandom(1000))
        assert await p.drain("lost/", timeout=30)
        file_env.raw_delete("lost/d/f")
        with pytest.raises(FsError):
            await ns.lookup(ROOT, d.ino, b"missing")
        assert p.stats.reuploaded == 1
        assert await p.drain("lost/", timeout=30)
        assert file_env.raw_exists("lost/d/f")
    finally:
        await file_env.close()
