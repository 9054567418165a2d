"""A file's placement policy is its first name's (:func:`tierd.placement.paths.file_policy`),
for eviction as for everything else: a hard link under a pinned prefix does not pin a file
whose first name is not pinned, and a pinned first name pins it under every name."""

from __future__ import annotations

import os

from tierd.placement import HOT
from tierd.placement.ops import PlacementOps
from tierd.tiers import BLOCK_SIZE

from .conftest import ROOT, Env, read_file


async def test_pin_follows_the_first_name(file_env: Env) -> None:
    file_env.raw_put("hlx/a/f", os.urandom(BLOCK_SIZE))
    ns, p = await file_env.open()
    ops = PlacementOps(p)
    try:
        await ns.list_objects(ROOT, "hlx")  # imports hlx/a/f
        f = await ns.resolve(ROOT, "hlx/a/f")
        b = await ns.resolve(ROOT, "hlx")
        keep = await ns.mkdir(ROOT, b.ino, b"keep", 0o755)
        await ns.link(ROOT, f.ino, keep.ino, b"f")  # second name: hlx/keep/f
        await p.wait_persisted(f.ino)
        assert file_env.raw_exists("hlx/keep/f")

        async def hot_bytes() -> int:
            await read_file(ns, f.ino)  # (re)fill hot
            return (await ops.evict("hlx/"))["tiers"][HOT]

        await ops.set_policy("hlx/keep/", pin=True)  # pins the second name only
        assert await hot_bytes() == BLOCK_SIZE
        await ops.set_policy("hlx/keep/", pin=False)
        await ops.set_policy("hlx/a/", pin=True)  # pins the first name
        assert await hot_bytes() == 0
        await ops.set_policy("hlx/a/", pin=False)
        assert await hot_bytes() == BLOCK_SIZE
    finally:
        await file_env.close()
