"""Which files a start gives a data file of their own (``Namespace._recover``): only those
whose in-place intention says the kernel wrote them (FUSE write passthrough), never every
file changed in place through the WRITE path -- a copy of each could fill the hot tier,
and a start that failed on it would serve nothing."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

from nsplacement import close_namespace, open_namespace

from tierd.acl import Identity
from tierd.meta import MetaStore
from tierd.namespace import ROOT_INO

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
