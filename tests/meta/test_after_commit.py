"""``MetaTxn.after_commit``: work that must see a transaction's commit runs after it, on
every engine, synchronous and asynchronous transactions alike, and never after an abort.
Over PostgreSQL other coroutines run while an async commit is in flight, so a callback the
body scheduled with ``call_soon`` could run before the commit landed (the persister's
warm-copy reaping and pool admission did)."""

from __future__ import annotations

import asyncio

import pytest

from tierd.meta import MetaStore


def _seen(store: MetaStore, key: bytes) -> bytes | None:
    with store.snapshot() as tx:
        return tx.kv.get(key)


def test_sync_callbacks_run_after_the_commit_and_never_on_abort(store: MetaStore) -> None:
    got: list[bytes | None] = []
    with store.write() as tx:
        tx.kv.put(b"Xa", b"1")
        tx.after_commit(lambda: got.append(_seen(store, b"Xa")))
        assert got == []
    assert got == [b"1"]
    with pytest.raises(RuntimeError), store.write() as tx:
        tx.kv.put(b"Xb", b"1")
        tx.after_commit(lambda: got.append(b"aborted"))
        raise RuntimeError("abort")
    assert got == [b"1"] and _seen(store, b"Xb") is None


def test_async_callbacks_see_the_commit(store: MetaStore) -> None:
    async def go() -> list[bytes | None]:
        got: list[bytes | None] = []

        async def other() -> None:  # runs while an async commit is in flight (PostgreSQL)
            await asyncio.sleep(0)

        async with store.awrite() as tx:
            tx.kv.put(b"Xc", b"2")
            tx.after_commit(lambda: got.append(_seen(store, b"Xc")))
            task = asyncio.ensure_future(other())
        await task
        try:
            async with store.awrite() as tx:
                tx.kv.put(b"Xd", b"2")
                tx.after_commit(lambda: got.append(b"aborted"))
                raise RuntimeError("abort")
        except RuntimeError:
            pass
        return got

    assert asyncio.run(go()) == [b"2"]
    assert _seen(store, b"Xd") is None
