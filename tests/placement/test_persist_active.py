"""Files queued again while the persister works on them: looked at once more when that work
ends, not on every wake of the persister meanwhile."""

from __future__ import annotations

import asyncio
import os

import pytest

from tierd.acl import Identity
from tierd.placement import placement as placement_mod

from .conftest import Env, write_file

ROOT = Identity.ROOT


async def test_files_in_flight_are_not_walked_on_every_wake(
    file_env: Env, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A burst queues files faster than they are persisted, so thousands wait for a slot;
    the persister's periodic full scan finds them queued while in flight.  Before, each
    was then taken again on every wake (one per create of the burst) until its upload
    ended: the loop walked all of them per create.  Now each is looked at once more, after
    its upload -- and a file rewritten meanwhile still reaches cold with its new bytes."""
    monkeypatch.setattr(placement_mod, "FULL_SCAN_INTERVAL", 0.2)
    ns, p = await file_env.open()  # persist_delay 0
    try:
        b = await ns.create_bucket(ROOT, "act")
        gate = asyncio.Event()
        real = p.reconcile

        async def held(ino: int) -> bool:
            await gate.wait()
            return await real(ino)

        p.reconcile = held  # type: ignore[method-assign]
        walked: list[int] = []
        past = p._past_delay

        async def counted(queue: list[int], now: float) -> list[int]:
            walked.append(len(queue))
            return await past(queue, now)

        p._past_delay = counted  # type: ignore[method-assign]
        files = {f"f{i:03d}".encode(): os.urandom(100) for i in range(150)}
        for name, data in files.items():
            await write_file(ns, b.ino, name, data)
        await asyncio.sleep(0.5)  # a full scan or two finds all 150 in flight
        assert len(p._active) == 150
        walked.clear()
        files[b"f007"] = os.urandom(200)
        await write_file(ns, b.ino, b"f007", files[b"f007"])  # rewritten while in flight
        for i in range(100):  # a burst goes on: each create wakes the persister
            name = f"g{i:03d}".encode()
            files[name] = os.urandom(10)
            await write_file(ns, b.ino, name, files[name])
            await asyncio.sleep(0)
        await asyncio.sleep(0.1)
        # each wake looks at the new files (and, every 0.2 s, at the whole queue): before,
        # also at all 150 in flight every time (15,000 and more)
        assert sum(walked) < 2_000, (len(walked), sum(walked))
        gate.set()
        assert await p.drain(timeout=60)
        for name, data in files.items():
            assert file_env.raw_get(f"act/{name.decode()}") == data, name
        assert not p._again
    finally:
        await file_env.close()
