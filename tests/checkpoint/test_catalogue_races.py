"""Races of the checkpoint catalogue with the namespace: a cluster node's rescan of a run
(``CheckpointService._scan``), and the removal of a dropped step's temporary directory."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

from nsplacement import close_namespace, open_namespace

from tierd.acl import Identity
from tierd.checkpoint import publish
from tierd.checkpoint.service import CheckpointService
from tierd.checkpoint.state import COMMITTED, LOCAL, Run, Step
from tierd.meta import MetaStore
from tierd.namespace import ROOT_INO

ROOT = Identity.ROOT


def test_a_step_published_during_the_listing_is_kept(tmp_path: Path) -> None:
    """This node's step 2 turns LOCAL (its publish ended) while the rescan's listing, read
    before the publish, is on its way: it stays (the CI saw ``wait_persisted`` answer "no
    step 2" right after its save); step 1, LOCAL before the listing and missing from it, was
    deleted by another node and goes."""

    async def go() -> None:
        meta = MetaStore.open_lmdb(tmp_path / "meta")
        ns = await open_namespace(meta, tmp_path / "data")
        try:
            b = await ns.mkdir(ROOT, ROOT_INO, b"checkpoints", 0o755)
            await ns.mkdir(ROOT, b.ino, b"r", 0o755)
            svc = CheckpointService(ns, pool=None, shared=True)  # type: ignore[arg-type]
            run = Run("checkpoints", "r", 2, 0)
            run.steps[1] = Step(1, ROOT, LOCAL)
            run.steps[2] = Step(2, ROOT, COMMITTED)
            real = ns.listdir

            async def listing(*a: Any, **kw: Any) -> Any:
                entries = await real(*a, **kw)  # read before step 2's publish ended
                run.steps[2].state = LOCAL
                return entries

            ns.listdir = listing  # type: ignore[method-assign]
            await svc._scan(run)
            assert sorted(run.steps) == [2]
        finally:
            await close_namespace(ns)
            meta.close()

    asyncio.run(go())


def test_a_part_landing_after_the_listing_is_removed_too(tmp_path: Path) -> None:
    """A dropped step's temporary directory: a part whose write was cancelled with the
    step may land between the removal's listing and its rmdir (the CI saw the rmdir fail
    with ENOTEMPTY and the part reach cold).  The directory is emptied again."""

    async def go() -> None:
        meta = MetaStore.open_lmdb(tmp_path / "meta")
        ns = await open_namespace(meta, tmp_path / "data")
        try:
            b = await ns.mkdir(ROOT, ROOT_INO, b"checkpoints", 0o755)
            r = await ns.mkdir(ROOT, b.ino, b"r", 0o755)
            tmp = await ns.mkdir(ROOT, r.ino, b".tierd-tmp-step-3-x", 0o755)
            await _file(ns, tmp.ino, b"data-0")
            real = ns.listdir
            late = [b"data-2"]

            async def listing(*a: Any, **kw: Any) -> Any:
                entries = await real(*a, **kw)
                if late:  # a part lands right after the first listing
                    await _file(ns, tmp.ino, late.pop())
                return entries

            ns.listdir = listing  # type: ignore[method-assign]
            await publish.remove_step_dir(ns, ROOT, "checkpoints", "r", ".tierd-tmp-step-3-x")
            ns.listdir = real  # type: ignore[method-assign]
            assert [n for n, _ in await ns.listdir(ROOT, r.ino)] == []
        finally:
            await close_namespace(ns)
            meta.close()

    asyncio.run(go())


async def _file(ns: Any, parent: int, name: bytes) -> None:
    _inode, fh = await ns.create(ROOT, parent, name, stat.S_IFREG | 0o644,
                                 os.O_WRONLY | os.O_CREAT)
    await ns.release(fh)
