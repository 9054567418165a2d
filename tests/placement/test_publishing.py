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
