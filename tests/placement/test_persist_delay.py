"""The persist delay: write-back waits ``persist_delay`` from a file's first change, so
files removed or rewritten within it never reach cold, and anyone waiting for persistence
(drain, write-through) or a dirty budget past half skips the wait."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

from tierd.acl import Identity

from .conftest import Env, write_file

ROOT = Identity.ROOT


async def test_files_wait_out_the_delay_and_short_lived_ones_never_upload(
    file_env: Env,
) -> None:
    ns, p = await file_env.open(persist_delay=1.5)
    try:
        b = await ns.create_bucket(ROOT, "dly")
        kept = os.urandom(100_000)
        await write_file(ns, b.ino, b"kept", kept)
        await write_file(ns, b.ino, b"temp", os.urandom(50_000))
        await asyncio.sleep(0.5)
        assert not file_env.raw_exists("dly/kept")  # still inside the delay
        await ns.unlink(ROOT, b.ino, b"temp")  # created and removed within it
        deadline = time.monotonic() + 10
        while not file_env.raw_exists("dly/kept"):
            assert time.monotonic() < deadline, "never persisted after the delay"
            await asyncio.sleep(0.1)
        assert file_env.raw_get("dly/kept") == kept
        assert await p.drain(timeout=30)  # (the object lands before the upload is counted)
        assert p.stats.uploaded_bytes == len(kept)  # the temporary file never went up
        assert not file_env.raw_exists("dly/temp")
    finally:
        await file_env.close()


async def test_a_rewrite_keeps_the_first_change_time(file_env: Env) -> None:
    """A file rewritten again and again inside the delay is still persisted once the delay
    from its first change is over (the kernel's dirty expiry, not a debounce)."""
    ns, p = await file_env.open(persist_delay=1.0)
    try:
        b = await ns.create_bucket(ROOT, "dly")
        t0 = time.monotonic()
        data = b""
        while not file_env.raw_exists("dly/busy"):
            assert time.monotonic() - t0 < 10, "a busy file was never persisted"
            data = os.urandom(10_000)
            await write_file(ns, b.ino, b"busy", data)  # rewritten every 0.2 s
            await asyncio.sleep(0.2)
        assert time.monotonic() - t0 >= 0.9
        assert await p.drain(timeout=30)
        assert file_env.raw_get("dly/busy") == data
    finally:
        await file_env.close()


async def test_drain_and_dirty_pressure_skip_the_delay(file_env: Env) -> None:
    ns, p = await file_env.open(persist_delay=3600, dirty_limit=1 << 20)
    try:
        b = await ns.create_bucket(ROOT, "dly")
        small = os.urandom(1000)
        await write_file(ns, b.ino, b"small", small)
        t0 = time.monotonic()
        assert await p.drain(timeout=30)  # persist --wait does not wait out an hour
        assert time.monotonic() - t0 < 30
        assert file_env.raw_get("dly/small") == small
        big = os.urandom(600_000)  # more than half the dirty budget
        await write_file(ns, b.ino, b"big", big)
        deadline = time.monotonic() + 20
        while not file_env.raw_exists("dly/big"):
            assert time.monotonic() < deadline, "dirty pressure did not lift the delay"
            await asyncio.sleep(0.1)
        assert file_env.raw_get("dly/big") == big
    finally:
        await file_env.close()


async def _burst(ns: Any, parent: int, names: list[bytes], until: float) -> None:
    """Write a small file every 20 ms, under ``names``, until ``until`` (monotonic): the
    gaps stay well under ``BUSY_QUIET``."""
    i = 0
    while time.monotonic() < until:
        name = b"b%04d" % i
        await write_file(ns, parent, name, name)
        names.append(name)
        i += 1
        await asyncio.sleep(0.02)


async def test_a_burst_holds_write_back_until_it_pauses(file_env: Env) -> None:
    """While files keep coming, those past their delay wait for the burst's first pause
    (their uploads halved the rate of the creates still coming); once it pauses they go."""
    ns, p = await file_env.open(persist_delay=2.0)
    try:
        b = await ns.create_bucket(ROOT, "brst")
        names: list[bytes] = []
        t0 = time.monotonic()
        await _burst(ns, b.ino, names, t0 + 2.8)  # the first file past its delay by 0.8 s
        assert time.monotonic() - t0 < 3.8  # (and not yet at twice it)
        assert not file_env.raw_exists("brst/b0000"), "uploaded during the burst"
        assert p.stats.uploaded_bytes == 0
        deadline = time.monotonic() + 10
        while not all(file_env.raw_exists(f"brst/{n.decode()}") for n in names[:10]):
            assert time.monotonic() < deadline, "the pause did not let write-back go"
            await asyncio.sleep(0.05)
        assert await p.drain(timeout=30)
        for n in names:
            assert file_env.raw_get(f"brst/{n.decode()}") == n
    finally:
        await file_env.close()


async def test_a_long_burst_still_sends_each_file_within_twice_the_delay(
    file_env: Env,
) -> None:
    ns, p = await file_env.open(persist_delay=1.0)
    try:
        b = await ns.create_bucket(ROOT, "brst")
        names: list[bytes] = []
        t0 = time.monotonic()
        burst = asyncio.create_task(_burst(ns, b.ino, names, t0 + 30))
        try:
            while not file_env.raw_exists("brst/b0000"):
                assert time.monotonic() - t0 < 8, "held past twice the delay"
                await asyncio.sleep(0.02)
            sent = time.monotonic() - t0
            assert not burst.done()
            assert sent >= 1.5, sent  # held past its delay (1 s) while files kept coming
        finally:
            burst.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await burst
        assert await p.drain(timeout=30)
    finally:
        await file_env.close()


async def test_a_burst_of_unlinks_holds_write_back_too(file_env: Env) -> None:
    """Removals count as a burst as creates do: files past their delay are not uploaded
    while a process goes on unlinking (10,000 files unlinked through the mount ran at
    about half the rate while the persister sent the files about to go)."""
    ns, p = await file_env.open(persist_delay=3.0)
    try:
        b = await ns.create_bucket(ROOT, "unl")
        names = [b"u%04d" % i for i in range(400)]
        t0 = time.monotonic()
        for n in names:
            await write_file(ns, b.ino, n, n)
        assert time.monotonic() - t0 < 2.5, "the creates took too long for this test"
        gone = 0
        while time.monotonic() - t0 < 4.0:  # the first files past their delay by 1 s
            await ns.unlink(ROOT, b.ino, names[gone])
            gone += 1
            await asyncio.sleep(0.01)
        assert time.monotonic() - t0 < 5.5  # (and not yet at twice it)
        assert gone < len(names), "every file was removed: slow the unlinks"
        assert p.stats.uploaded_bytes == 0, "uploaded while files were being removed"
        assert await p.drain(timeout=30)
        for n in names[:gone]:
            assert not file_env.raw_exists(f"unl/{n.decode()}")
        for n in names[gone:]:
            assert file_env.raw_get(f"unl/{n.decode()}") == n
    finally:
        await file_env.close()


async def test_a_create_burst_does_not_wake_the_persister_per_file(file_env: Env) -> None:
    """A sleeping persister is not woken by each new file (it looks at the hints within
    half the delay anyway: ``Placement.nudge``), yet every file still goes when its delay
    is over, and a waiter for persistence still wakes it at once."""
    ns, p = await file_env.open(persist_delay=4.0)
    try:
        b = await ns.create_bucket(ROOT, "nudge")
        await asyncio.sleep(0.3)  # asleep
        rounds = 0
        watch = p._watch

        def counted() -> None:
            nonlocal rounds
            rounds += 1
            watch()

        p._watch = counted  # type: ignore[method-assign]  # once per round of the loop
        t0 = time.monotonic()
        for i in range(40):
            await write_file(ns, b.ino, b"n%02d" % i, b"z" * i)
            await asyncio.sleep(0)
        made = time.monotonic() - t0
        assert rounds <= 3, rounds  # before: a round per file
        await asyncio.sleep(max(0.0, 3.0 - (time.monotonic() - t0)))
        assert not file_env.raw_exists("nudge/n00")  # its delay is not over
        deadline = t0 + 4.0 + made + 3.0  # its delay, then a round (or a probe) at most
        while not all(file_env.raw_exists(f"nudge/n{i:02d}") for i in range(40)):
            assert time.monotonic() < deadline, "a file stayed past its delay"
            await asyncio.sleep(0.05)
        p._watch = watch  # type: ignore[method-assign]
        # a waiter for persistence is not left waiting for the next timed round
        await asyncio.sleep(0.3)
        t1 = time.monotonic()
        ino = await write_file(ns, b.ino, b"now", b"now")
        await asyncio.wait_for(p.wait_persisted(ino), 5)
        assert time.monotonic() - t1 < 1.5  # under the 2 s the loop may sleep
        assert file_env.raw_get("nudge/now") == b"now"
    finally:
        await file_env.close()
