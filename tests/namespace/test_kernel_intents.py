"""Which files a start gives a data file of their own (``Namespace._recover``): only those
whose in-place intention says the kernel wrote them (FUSE write passthrough), never every
file changed in place through the WRITE path -- a copy of each could fill the hot tier,
and a start that failed on it would serve nothing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

from nsplacement import close_namespace, open_namespace

from tierd.acl import Identity
from tierd.meta import MetaStore
from tierd.namespace import ROOT_INO, Namespace
from tierd.tiers.local_tier import LocalTier

ROOT = Identity.ROOT


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


def test_intents_list_by_kind(tmp_path: Path) -> None:
    meta = MetaStore.open_lmdb(tmp_path / "meta")
    try:
        with meta.write() as tx:
            tx.add_intent(7)
            tx.add_intent(9, kernel=True)
        with meta.snapshot() as tx:
            assert tx.list_intents() == [7, 9]
            assert tx.list_intents(kernel=True) == [9]
            assert tx.has_intent(7) and tx.has_intent(9)
    finally:
        meta.close()


def test_a_start_detaches_only_the_kernel_written_files(tmp_path: Path) -> None:
    async def go() -> None:
        meta = MetaStore.open_lmdb(tmp_path / "meta")
        try:
            ns = await open_namespace(meta, tmp_path)
            await ns.create_bucket(ROOT, "bkt")
            for key in ("plain", "kernel"):
                await ns.put_object(ROOT, "bkt", key, _body(key.encode() * 1000))
            b = (await ns.lookup(ROOT, ROOT_INO, b"bkt")).ino
            plain = (await ns.lookup(ROOT, b, b"plain")).ino
            kernel = (await ns.lookup(ROOT, b, b"kernel")).ino
            with meta.write() as tx:  # as a crash leaves them
                tx.add_intent(plain)
                tx.add_intent(kernel, kernel=True)
            before = {i: os.stat(ns.hot.path(i)).st_ino for i in (plain, kernel)}
            await close_namespace(ns)
            ns = await open_namespace(meta, tmp_path)
            try:
                after = {i: os.stat(ns.hot.path(i)).st_ino for i in (plain, kernel)}
                assert after[plain] == before[plain]  # the same file: not copied
                assert after[kernel] != before[kernel]  # out of a zombie writer's reach
                for key in ("plain", "kernel"):
                    r = await ns.get_object(ROOT, "bkt", key)
                    try:
                        assert await r.read_all() == key.encode() * 1000
                    finally:
                        await r.close()
            finally:
                await close_namespace(ns)
        finally:
            meta.close()

    asyncio.run(go())


@contextlib.contextmanager
def creating_threads() -> Iterator[list[str]]:
    """The names of the threads that make a hot data file (``LocalTier.open_file`` with
    ``create``) while the block runs."""
    made: list[str] = []
    real = LocalTier.open_file

    def spy(self: LocalTier, ino: int, *, create: bool) -> int:
        if create:
            made.append(threading.current_thread().name)
        return real(self, ino, create=create)

    LocalTier.open_file = spy  # type: ignore[method-assign]
    try:
        yield made
    finally:
        LocalTier.open_file = real  # type: ignore[method-assign]


def in_namespace(tmp_path: Path, body: Callable[[Namespace], Awaitable[None]]) -> None:
    """``body`` over a namespace on lmdb in ``tmp_path`` with a bucket ``bkt``."""
    async def go() -> None:
        meta = MetaStore.open_lmdb(tmp_path / "meta")
        try:
            ns = await open_namespace(meta, tmp_path)
            try:
                await ns.create_bucket(ROOT, "bkt")
                await body(ns)
            finally:
                await close_namespace(ns)
        finally:
            meta.close()

    asyncio.run(go())


def test_a_passthrough_create_makes_its_data_file_off_the_event_loop(tmp_path: Path) -> None:
    """A new file's hot data file is created for the kernel to write in a worker thread: a
    create writes the file system's metadata and waits behind any sync in progress there
    (a millisecond and more measured), which the event loop must not.  Two passthrough
    opens of one new file share one descriptor (the tier's cache, no leak)."""
    async def body(ns: Namespace) -> None:
        b = (await ns.lookup(ROOT, ROOT_INO, b"bkt")).ino
        flags = os.O_WRONLY | os.O_CREAT
        inode, fh = await ns.create(ROOT, b, b"new", 0o644, flags, kernel_writes=True)
        _, fh2 = await ns.create(ROOT, b, b"new", 0o644, os.O_WRONLY)
        assert not os.path.exists(ns.hot.path(inode.ino))  # nothing made yet
        with creating_threads() as made:
            fds = await asyncio.gather(ns.passthrough_open(fh), ns.passthrough_open(fh2))
        assert fds[0] is not None and fds[0] == fds[1]
        assert os.path.exists(ns.hot.path(inode.ino))
        assert made and threading.main_thread().name not in made, made
        for h in (fh, fh2):
            await ns.release(h)

    in_namespace(tmp_path, body)


def test_a_first_write_makes_the_data_file_off_the_event_loop(tmp_path: Path) -> None:
    """The WRITE path's first write of a new file makes its hot data file in a worker
    thread too (the file system's metadata write must not hold the loop)."""
    async def body(ns: Namespace) -> None:
        b = (await ns.lookup(ROOT, ROOT_INO, b"bkt")).ino
        inode, fh = await ns.create(ROOT, b, b"f", 0o644, os.O_WRONLY | os.O_CREAT)
        with creating_threads() as made:
            assert await ns.write(fh, 0, b"abc") == 3
        await ns.release(fh)
        with open(ns.hot.path(inode.ino), "rb") as f:
            assert f.read() == b"abc"
        assert made and threading.main_thread().name not in made, made

    in_namespace(tmp_path, body)
