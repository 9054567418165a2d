"""Data files made ahead for creates the kernel writes (``tierd.namespace.spares``): the
numbers are reserved, their files exist before the create, a failed create gives its number
back, nothing else is handed one, and no file of an unused number outlives a clean close or
an unclean stop."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
from pathlib import Path

import pytest

from tierd.acl import Identity
from tierd.errors import FsError
from tierd.namespace import ROOT_INO
from tierd.namespace.spares import BATCH

from .conftest import NsEnv

ROOT = Identity.ROOT
USER = Identity(uid=1000, gid=1000)


def _data_files(env: NsEnv) -> set[int]:
    return set(env.ns.hot.inventory())


def _spare_files_ready(env: NsEnv) -> None:
    """Until spares are ready and the refill that made them is over: one still running adds
    its next batch later, and a count taken meanwhile is off by it."""
    async def wait() -> None:
        for _ in range(500):
            if len(env.ns.spares) >= 8 and env.ns.spares._refill is None:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("no spares were made")
    env.run(wait())


def _create(env: NsEnv, parent: int, name: str, ident: Identity = ROOT, *,
            kernel: bool = True, mode: int = 0o644) -> int:
    async def go() -> int:
        inode, fh = await env.ns.create(ident, parent, name.encode(), mode,
                                        os.O_CREAT | os.O_WRONLY, kernel_writes=kernel)
        await env.ns.release(fh)
        return inode.ino
    return env.run(go())


@pytest.fixture
def env(tmp_path: Path) -> NsEnv:
    e = NsEnv(tmp_path)
    yield e
    e.close()


def test_a_kernel_written_create_gets_a_reserved_number_whose_file_exists(env: NsEnv) -> None:
    b = env.bucket()
    first = _create(env, b, "first")  # none ready yet: a number of its own; starts a refill
    _spare_files_ready(env)
    ready = list(env.ns.spares._ready)
    assert all(os.path.exists(env.ns.hot.path(i)) for i in ready)
    assert first not in ready
    made = [_create(env, b, f"f{i}") for i in range(5)]
    assert made == ready[:5]  # in order, each a spare whose file was there
    for ino in made:
        assert os.stat(env.ns.hot.path(ino)).st_size == 0
    # numbers from the counter (a directory, a PUT, a file the daemon writes) never collide
    d = env.run(env.ns.mkdir(ROOT, b, b"sub", 0o755)).ino
    plain = _create(env, b, "plain", kernel=False)
    assert {d, plain}.isdisjoint(ready) and max(ready) < min(d, plain)
    assert env.read_file(ROOT, made[0]) == b""


def test_a_failed_create_gives_its_number_back_and_an_existing_name_too(env: NsEnv) -> None:
    b = env.bucket(mode=0o755)  # root's: others may not create in it
    _create(env, b, "x")
    _spare_files_ready(env)
    nxt = env.ns.spares._ready[0]
    env.err(errno.EACCES, env.ns.create(USER, b, b"denied", 0o644, os.O_CREAT | os.O_WRONLY,
                                        kernel_writes=True))
    assert env.ns.spares._ready[0] == nxt
    again = _create(env, b, "x")  # opens the existing file: no number used
    assert again != nxt and env.ns.spares._ready[0] == nxt
    assert _create(env, b, "y") == nxt


def test_set_id_bits_and_the_daemons_own_writes_take_no_spare(env: NsEnv) -> None:
    b = env.bucket()
    _create(env, b, "x")
    _spare_files_ready(env)
    n = len(env.ns.spares)
    ino = _create(env, b, "sgid", mode=0o2755)
    assert stat.S_IMODE(env.run(env.ns.getattr(ROOT, ino)).mode) & stat.S_ISGID
    _create(env, b, "daemon", kernel=False)
    assert len(env.ns.spares) == n


def _some_used(env: NsEnv, b: int) -> tuple[list[int], set[int]]:
    """Three files made from spares, and the spares left."""
    _create(env, b, "first")
    _spare_files_ready(env)
    used = [_create(env, b, f"f{i}") for i in range(3)]
    unused = set(env.ns.spares._ready)
    assert unused and unused <= _data_files(env) and set(used) <= _data_files(env)
    assert unused.isdisjoint(used)
    return used, unused


def test_a_clean_close_removes_the_unused_files(env: NsEnv) -> None:
    used, unused = _some_used(env, env.bucket())
    env.reopen()
    files = _data_files(env)
    assert unused.isdisjoint(files)
    assert set(used) <= files  # the files' own data files stay


def test_after_an_unclean_stop_the_unused_files_are_removed(env: NsEnv) -> None:
    b = env.bucket()
    used, unused = _some_used(env, b)
    env.run(env.ns.sync())
    env.crash_reopen()
    files = _data_files(env)
    assert unused.isdisjoint(files)
    assert set(used) <= files
    assert _create(env, b, "after") > max(unused) + BATCH  # the counter skipped past them


def test_a_create_that_fails_after_its_number_was_given_is_not_given_back(
        env: NsEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    b = env.bucket()
    _create(env, b, "x")
    _spare_files_ready(env)
    nxt = env.ns.spares._ready[0]

    def boom(*args: object, **kw: object) -> None:
        raise FsError(errno.EIO, "the commit failed")

    monkeypatch.setattr(env.ns, "_queue", boom)  # after the inode had the number
    env.err(errno.EIO, env.ns.create(ROOT, b, b"y", 0o644, os.O_CREAT | os.O_WRONLY,
                                     kernel_writes=True))
    monkeypatch.undo()
    assert nxt not in env.ns.spares._ready
    assert _create(env, b, "z") != nxt
    env.reopen()  # the number has no inode: its file is removed at close
    assert nxt not in _data_files(env)
    assert env.run(env.ns.lookup(ROOT, ROOT_INO, b"bkt")).ino == b


def test_a_full_disk_makes_no_spares_and_they_are_tried_again(
        env: NsEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refill that cannot make files (ENOSPC) leaves creates making their own, and is
    tried again later (``RETRY``)."""
    from tierd.namespace import spares

    b = env.bucket()
    real = env.ns.hot.make_files

    def full(inos: object) -> list[int]:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(env.ns.hot, "make_files", full)
    first = _create(env, b, "a")  # starts a refill, which fails
    env.run(asyncio.sleep(0.2))
    assert len(env.ns.spares) == 0 and env.ns.spares._failed_at is not None
    second = _create(env, b, "b")  # its own number; no refill yet (RETRY s)
    assert second > first and env.ns.spares._refill is None
    monkeypatch.setattr(env.ns.hot, "make_files", real)
    monkeypatch.setattr(spares, "RETRY", 0.0)
    _create(env, b, "c")
    _spare_files_ready(env)
    assert env.ns.spares._failed_at is None


def test_a_refill_keeps_making_batches_until_enough_are_ready(env: NsEnv) -> None:
    """One batch per refill, started with a few left, let a burst of creates outrun the
    helper and make most of their files themselves: a refill goes on, a batch at a time,
    until ``HIGH`` are ready, and starts again below ``LOW``, so a burst finds one ready."""
    from tierd.namespace.spares import HIGH, LOW

    b = env.bucket()
    _create(env, b, "first")  # starts a refill

    async def settled() -> int:
        for _ in range(3000):  # (slow creates on a loaded machine: up to 30 s)
            if env.ns.spares._refill is None and len(env.ns.spares) >= HIGH:
                return len(env.ns.spares)
            await asyncio.sleep(0.01)
        raise AssertionError(f"{len(env.ns.spares)} spares made, not {HIGH}")
    full = env.run(settled())
    assert HIGH <= full < HIGH + BATCH  # several batches, and no more than needed
    ready = list(env.ns.spares._ready)
    assert len(set(ready)) == len(ready) and ready == sorted(ready)
    assert set(ready) <= _data_files(env)
    # below LOW a create starts the next refill, which brings the pool back up
    used = [_create(env, b, f"f{i}") for i in range(full - LOW)]
    assert used == ready[:len(used)] and env.ns.spares._refill is None  # LOW left
    used.append(_create(env, b, "below"))
    assert env.run(settled()) >= HIGH
    now = list(env.ns.spares._ready)
    assert set(now).isdisjoint(used) and max(now) > max(ready)  # new batches were made
