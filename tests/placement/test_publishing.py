"""Atomic publishes (write under a temporary directory, rename into place): the persister
waits for the rename, so cold gets each file once under its final key instead of an upload
of the temporary name, a server-side copy and a delete."""

from __future__ import annotations

import asyncio
import os

from .conftest import ROOT, Env, MiB, body


async def test_files_being_published_reach_cold_once_under_their_final_key(env: Env) -> None:
    ns, p = await env.open()  # persist_delay 0: anything queued is uploaded at once
    try:
        await ns.create_bucket(ROOT, "pub")
        data = os.urandom(7 * MiB)  # multipart on the moto engine
        with p.publishing("pub/run/.tmp-1/"):
            await ns.put_object(ROOT, "pub", "run/.tmp-1/data", body(data))
            await ns.put_object(ROOT, "pub", "run/.tmp-1/manifest.json", body(b"{}"))
            await ns.put_object(ROOT, "pub", "run/other", body(b"not published"))
            await asyncio.sleep(0.5)  # the persister runs meanwhile
            assert not env.raw_exists("pub/run/.tmp-1/data")
            assert env.raw_exists("pub/run/other")  # only the prefix waits
            run = await ns.resolve(ROOT, "pub/run")
            await ns.rename(ROOT, run.ino, b".tmp-1", run.ino, b"step-1")
        assert await p.drain(timeout=60)
        assert env.raw_get("pub/run/step-1/data") == data
        assert env.raw_get("pub/run/step-1/manifest.json") == b"{}"
        assert not env.raw_exists("pub/run/.tmp-1/data")
        # uploaded once each (a copy from the temporary key would have needed that key)
        assert p.stats.uploaded_bytes == len(data) + 2 + len(b"not published")
        assert not p._publishing
    finally:
        await env.close()


async def test_files_held_back_by_a_publish_wait_without_spinning(env: Env) -> None:
    """A file under a prefix being published is looked at once, then left until the
    publish ends (before, every wake of the persister took it again: a round, a wake, a
    round, tens of thousands a second, while the publish lasted); a publish that ends
    without the rename lets the files go to cold under the names they have."""
    ns, p = await env.open()
    try:
        await ns.create_bucket(ROOT, "pub")
        rounds: list[int] = []
        real = p.reconcile

        async def counted(ino: int) -> bool:
            rounds.append(ino)
            return await real(ino)

        p.reconcile = counted  # type: ignore[method-assign]
        with p.publishing("pub/run/.tmp-2/"):
            await ns.put_object(ROOT, "pub", "run/.tmp-2/data", body(b"x" * 1000))
            await ns.put_object(ROOT, "pub", "run/.tmp-2/more", body(b"y" * 10))
            await asyncio.sleep(1.0)  # the persister runs meanwhile
            assert not env.raw_exists("pub/run/.tmp-2/data")
            assert 2 <= len(rounds) <= 6, len(rounds)
            assert len(p.held_back) == 2
        assert await p.drain(timeout=60)  # (the end of the publish hinted them)
        assert env.raw_get("pub/run/.tmp-2/data") == b"x" * 1000
        assert env.raw_get("pub/run/.tmp-2/more") == b"y" * 10
        assert not p.held_back
    finally:
        await env.close()
