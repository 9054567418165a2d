"""``open(O_TRUNC)`` of a file a passthrough writer still holds (its RELEASE comes after the
``close``, and the last writer's release may wait for a mapping: fuse/files.py).  The
truncate commits the new size, makes it durable, then cuts the hot file; a look at the hot
file in between (that writer's FLUSH or RELEASE, a getattr, an S3 HEAD: ``_external_look``)
took the hot file's size -- the old one, not cut yet -- as the file's.  Found by
bench/torture.py (rename a file written through the kernel over KEY, then
``open(KEY, O_TRUNC)``, write, fsync): the new writer was refused passthrough (its hot file
no longer the size the namespace said), wrote through the daemon over the stale size, and
its fsync acknowledged the old length with zeros past the new bytes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tierd.acl import Identity
from tierd.namespace import ROOT_INO, Namespace

from .test_kernel_intents import in_namespace

ROOT = Identity.ROOT


def test_a_look_during_an_o_trunc_keeps_the_new_size(tmp_path: Path) -> None:
    old, new = os.urandom(31724), os.urandom(30671)

    async def body(ns: Namespace) -> None:
        b = (await ns.lookup(ROOT, ROOT_INO, b"bkt")).ino
        inode, h1 = await ns.create(ROOT, b, b"k", 0o644, os.O_WRONLY | os.O_CREAT,
                                    kernel_writes=True)
        fd1 = await ns.passthrough_open(h1)
        assert fd1 is not None
        os.pwrite(fd1, old, 0)  # the kernel's writes
        ns.passthrough_sync(h1)
        await ns.fsync(h1)
        sync: Any = ns._sync_meta

        async def looked_then_synced() -> None:
            # the first writer's FLUSH and RELEASE arrive while the truncate waits for its
            # durable point (between its commit and the cut of the hot file)
            ns.passthrough_sync(h1, wrote=False)
            await ns.getattr(ROOT, inode.ino)
            ns.passthrough_close(h1)
            await sync()
        ns._sync_meta = looked_then_synced  # type: ignore[method-assign]
        h2 = await ns.open(ROOT, inode.ino, os.O_WRONLY | os.O_TRUNC)
        del ns._sync_meta
        await ns.release(h1)
        fd2 = await ns.passthrough_open(h2)  # the door tries passthrough first
        if fd2 is not None:
            os.pwrite(fd2, new, 0)
            ns.passthrough_sync(h2)
        else:
            await ns.write(h2, 0, new)
        await ns.fsync(h2)
        with ns.meta.snapshot() as tx:
            got = tx.get_inode(inode.ino)
            assert got is not None
        assert got.size == len(new), f"fsync committed {got.size} bytes, not {len(new)}"
        assert fd2 is not None, "the truncated file's writer was refused passthrough"
        h3 = await ns.open(ROOT, inode.ino, os.O_RDONLY)
        assert bytes(await ns.read(h3, 0, 1 << 20)) == new
        await ns.release(h3)
        ns.passthrough_close(h2)
        await ns.release(h2)

    in_namespace(tmp_path, body)
