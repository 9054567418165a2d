"""The small-write log (tierd/namespace/smalllog.py) and the group writer under it.

A small PUT is acknowledged once its bytes are in the metadata commit; its data file is in
the page cache only until a trim's ``syncfs``.  These tests check the records, the trim, the
fall-back to a synced file, and above all the crash case: the data files of logged PUTs are
destroyed (as a power cut may leave them) and the next start must give back exactly what was
acknowledged -- and never roll back content that changed after the log was written.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tierd.namespace import smalllog
from tierd.tiers.fileio import INLINE_BYTES
from tierd.tiers.groupsync import GroupWriter
from tierd.tiers.hotdir import HotDir
from tierd.tiers.local_tier import LocalTier

from .conftest import ROOT, NsEnv


def logged(env: NsEnv) -> dict[int, tuple[int, bytes]]:
    assert env.store is not None
    with env.store.snapshot() as tx:
        return {ino: (version, data) for ino, version, data in tx.list_logged()}


def inode_of(env: NsEnv, bucket: str, key: str) -> int:
    return int(env.run(env.ns.head_object(ROOT, bucket, key)).ino)


@pytest.fixture
def no_timed_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    """No trim comes by itself: a test that counts the records left by its PUTs must not
    depend on finishing them within TRIM_DELAY (a loaded machine takes longer)."""
    monkeypatch.setattr(smalllog, "TRIM_DELAY", 3600.0)


def test_small_put_is_logged_then_trimmed(nsenv: NsEnv) -> None:
    nsenv.bucket("bkt")
    body = os.urandom(3000)
    nsenv.put(ROOT, "bkt", "k", body)
    ino = inode_of(nsenv, "bkt", "k")
    records = logged(nsenv)
    assert set(records) == {ino}
    version, data = records[ino]
    assert data == body
    assert version == nsenv.run(nsenv.ns.head_object(ROOT, "bkt", "k")).version
    assert Path(nsenv.ns.hot.path(ino)).read_bytes() == body  # written, not yet synced
    assert nsenv.ns.smalllog.bytes == len(body)
    assert nsenv.run(nsenv.ns.smalllog.trim())
    assert logged(nsenv) == {}
    assert nsenv.ns.smalllog.bytes == 0
    assert nsenv.get(ROOT, "bkt", "k") == body


def test_trim_runs_by_itself(nsenv: NsEnv) -> None:
    nsenv.bucket("bkt")
    nsenv.put(ROOT, "bkt", "k", b"x" * 100)
    assert logged(nsenv)
    before = nsenv.ns.smalllog.trims
    nsenv.run(asyncio.sleep(smalllog.TRIM_DELAY + 0.5))
    assert nsenv.ns.smalllog.trims > before
    assert logged(nsenv) == {}


def test_large_bodies_and_a_full_log_sync_their_own_file(nsenv: NsEnv) -> None:
    nsenv.bucket("bkt")
    big = os.urandom(INLINE_BYTES + 1)
    nsenv.put(ROOT, "bkt", "big", big)
    assert logged(nsenv) == {}
    nsenv.ns.smalllog.bytes = smalllog.LOG_BUDGET  # as if trims could not keep up
    try:
        nsenv.put(ROOT, "bkt", "small", b"abc")
        assert logged(nsenv) == {}
    finally:
        nsenv.ns.smalllog.bytes = 0
    assert nsenv.get(ROOT, "bkt", "big") == big
    assert nsenv.get(ROOT, "bkt", "small") == b"abc"


def test_clean_close_leaves_no_record(nsenv: NsEnv, no_timed_trim: None) -> None:
    nsenv.bucket("bkt")
    for i in range(20):
        nsenv.put(ROOT, "bkt", f"k{i}", bytes([i]) * 500)
    assert len(logged(nsenv)) == 20
    nsenv.reopen()
    assert logged(nsenv) == {}
    for i in range(20):
        assert nsenv.get(ROOT, "bkt", f"k{i}") == bytes([i]) * 500


@pytest.mark.parametrize("damage", ["delete", "truncate", "garbage"])
def test_crash_replays_the_log_into_lost_data_files(nsenv: NsEnv, damage: str,
                                                    no_timed_trim: None) -> None:
    """Acknowledged small PUTs whose data files lost their page cache come back whole."""
    nsenv.bucket("bkt")
    bodies = {f"d/k{i}": os.urandom(1 + i * 997) for i in range(30)}
    for key, body in bodies.items():
        nsenv.put(ROOT, "bkt", key, body)
    nsenv.put(ROOT, "bkt", "d/k3", b"overwritten")  # the older version's record is moot
    bodies["d/k3"] = b"overwritten"
    records = logged(nsenv)
    assert len(records) == 31
    # the crash: the namespace is abandoned (store closed, as a killed process leaves it),
    # then the data files lose what was never synced
    hot = nsenv.ns.hot
    assert nsenv.store is not None
    nsenv._abandoned.append(nsenv.ns)
    nsenv.store.close()
    nsenv.store = None
    for ino in records:
        path = Path(hot.path(ino))
        if damage == "delete":
            path.unlink(missing_ok=True)
        elif path.exists():
            path.write_bytes(b"" if damage == "truncate" else b"\0" * 64)
    nsenv.ns = nsenv._open()
    assert logged(nsenv) == {}
    for key, body in bodies.items():
        assert nsenv.get(ROOT, "bkt", key) == body, key
        info = nsenv.run(nsenv.ns.head_object(ROOT, "bkt", key))
        assert info.size == len(body)


def test_replay_never_rolls_back_newer_content(nsenv: NsEnv, no_timed_trim: None) -> None:
    """A file changed through the POSIX door after its PUT has a newer version: the log
    record of the PUT must not overwrite it at the next start."""
    bino = nsenv.bucket("bkt")
    nsenv.put(ROOT, "bkt", "f", b"from s3 " * 10)
    ino = inode_of(nsenv, "bkt", "f")
    assert ino in logged(nsenv)

    async def rewrite() -> None:
        fh = await nsenv.ns.open(ROOT, ino, os.O_WRONLY | os.O_TRUNC)
        try:
            await nsenv.ns.write(fh, 0, b"from posix")
            await nsenv.ns.fsync(fh, False)
        finally:
            await nsenv.ns.release(fh)

    nsenv.run(rewrite())
    assert ino in logged(nsenv)  # no trim has run yet
    nsenv.crash_reopen()
    assert logged(nsenv) == {}
    assert nsenv.read_file(ROOT, ino) == b"from posix"
    assert nsenv.names(ROOT, bino) == [b"f"]


def test_group_writer_groups_and_fails_alone(tmp_path: Path) -> None:
    hot = HotDir(LocalTier(tmp_path / "hot", name="hot"))
    gw: GroupWriter = hot.small

    async def main() -> None:
        bodies = {ino: os.urandom(ino * 13 % 5000 + 1) for ino in range(1, 201)}
        await asyncio.gather(*(hot.write_new(ino, [b], durable=ino % 2 == 0)
                               for ino, b in bodies.items()))
        for ino, b in bodies.items():
            assert Path(hot.path(ino)).read_bytes() == b
        assert gw.files == 200
        assert gw.groups < 200  # concurrent writers shared groups
        # a file that cannot be created fails only its own write
        blocker = tmp_path / "hot" / "blocked"
        blocker.write_bytes(b"")
        bad = gw.write(str(blocker / "x"), [b"nope"])
        good = hot.write_new(999, [b"fine"])
        results = await asyncio.gather(bad, good, return_exceptions=True)
        assert isinstance(results[0], NotADirectoryError)
        assert results[1] is None
        assert Path(hot.path(999)).read_bytes() == b"fine"
        # cancelled while queued: the file is written, then removed, never left behind --
        # unless the writer finished it before the cancel arrived (a loaded machine): then
        # the write succeeded and its file is whole
        task = asyncio.ensure_future(hot.write_new(1000, [b"gone"]))
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            for _ in range(500):  # the writer thread removes it; give a loaded machine 5 s
                if not os.path.exists(hot.path(1000)):
                    break
                await asyncio.sleep(0.01)
            assert not os.path.exists(hot.path(1000))
        else:
            assert Path(hot.path(1000)).read_bytes() == b"gone"

    asyncio.run(main())
    gw.close()
    with pytest.raises(RuntimeError):
        asyncio.run(gw.write(str(tmp_path / "late"), [b""]))
