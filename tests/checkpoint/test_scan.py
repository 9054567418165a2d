"""A cluster node's rescan of a run (``CheckpointService._scan``): a published step missing
from the listing was deleted by another node, unless it was published while the listing
was being read."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nsplacement import close_namespace, open_namespace

from tierd.acl import Identity
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
