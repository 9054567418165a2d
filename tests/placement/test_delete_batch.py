"""The pending deletes' pass handles a batch as a batch (``deletes.py``): for the deletes of
many unlinked files it makes one ``delete_many`` call (one ``DeleteObjects`` request on
S3) and one write transaction per batch, not a ``delete`` call and a transaction per key
(48% of the daemon's event loop while a process unlinked persisted files through the
mount).  And batching keeps the gates' promise: a put of a key in the batch -- one in
flight when the pass looks, or one that starts while the batch's delete runs -- is never
undone by it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import Any

import pytest

from tierd.meta import MetaStore
from tierd.placement import intents
from tierd.placement.deletes import BATCH
from tierd.tiers import TierError, TierUnavailable
from tierd.tiers.s3_tier import S3ObjectTier

from .conftest import ROOT, Env, body

N = BATCH + 10  # two batches


def _pending(env: Env) -> set[str]:
    assert env.p is not None
    with env.p.meta.snapshot() as tx:
        return {it.key for it in intents.scan(tx, "", 10_000)}


async def test_unlinks_cost_one_request_and_one_transaction_per_batch(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    ns, p = await env.open()
    try:
        await ns.create_bucket(ROOT, "dbat")
        for i in range(N):
            await ns.put_object(ROOT, "dbat", f"d/f{i:04}", body(b"x%d" % i))
        assert await p.drain("dbat/", timeout=120)
        assert env.raw_exists("dbat/d/f0000")
        await p.close()  # no pass of its own meanwhile: the one below does all the work
        for i in range(N):
            assert await ns.delete_object(ROOT, "dbat", f"d/f{i:04}")
        assert len(_pending(env)) == N

        batches: list[int] = []
        singles: list[str] = []
        requests: list[int] = []
        writes: list[int] = []
        real_many, real_one = p.cold.delete_many, p.cold.delete

        async def many(keys: Sequence[str]) -> dict[str, TierError | None]:
            batches.append(len(keys))
            return await real_many(keys)

        async def one(key: str) -> None:
            singles.append(key)
            await real_one(key)
        monkeypatch.setattr(p.cold, "delete_many", many)
        monkeypatch.setattr(p.cold, "delete", one)
        if isinstance(p.cold, S3ObjectTier):
            real_call = p.cold._call

            def call(op: str, key: str | None, **kw: Any) -> dict[str, Any]:
                if op.startswith("delete"):  # the S3 requests, by what they carry
                    requests.append(len(kw["Delete"]["Objects"]) if "Delete" in kw else 1)
                return real_call(op, key, **kw)
            monkeypatch.setattr(p.cold, "_call", call)
        real_write = MetaStore.awrite

        def counted(self: MetaStore, *a: Any, **kw: Any) -> Any:
            if sys._getframe(1).f_globals["__name__"] == "tierd.placement.deletes":
                writes.append(1)  # the worker's (not the namespace's garbage collector's)
            return real_write(self, *a, **kw)
        monkeypatch.setattr(MetaStore, "awrite", counted)

        p.kick_deletes()
        assert p._delete_task is not None
        await p._delete_task
        monkeypatch.undo()
        assert _pending(env) == set()
        assert not any(env.raw_exists(f"dbat/d/f{i:04}") for i in range(N))
        assert sorted(batches) == [10, BATCH] and singles == []
        if isinstance(p.cold, S3ObjectTier):
            assert sorted(requests) == [10, BATCH]
        assert len(writes) == 2, len(writes)  # one per batch, not one per key
        assert p.stats.cold_deleted >= N
    finally:
        await env.close()


async def test_a_put_in_flight_is_skipped_not_waited_for_nor_undone(env: Env) -> None:
    """An upload to the key is in flight (its put-intention written, the key in
    ``putting``): the pass leaves the key to the upload's record, without waiting for its
    gate, and the new object stays."""
    ns, p = await env.open()
    entered, release = asyncio.Event(), asyncio.Event()
    real_put = p.cold.put_file

    async def held_put(key: str, *a: Any, **kw: Any) -> Any:
        if key == "dput/k":
            entered.set()
            await release.wait()
        return await real_put(key, *a, **kw)

    p.cold.put_file = held_put  # type: ignore[method-assign]
    try:
        await ns.create_bucket(ROOT, "dput")
        await ns.put_object(ROOT, "dput", "k", body(b"new bytes"))
        await asyncio.wait_for(entered.wait(), 20)
        assert "dput/k" in p.putting and "dput/k" in _pending(env)
        p.kick_deletes()
        assert p._delete_task is not None
        await asyncio.wait_for(asyncio.shield(p._delete_task), 5)  # not stuck on the gate
        assert "dput/k" in _pending(env)  # the upload's intention, left to its record
        release.set()
        assert await p.drain("dput/", timeout=30)
        assert env.raw_get("dput/k") == b"new bytes"
        assert _pending(env) == set()
    finally:
        release.set()
        await env.close()


async def test_a_put_during_the_batch_delete_waits_and_lands_after_it(env: Env) -> None:
    """The batch's ``delete_many`` is under way for an old object when a new file at its
    key is persisted: the upload waits for the key's gate, so it lands after the delete,
    and cold keeps the new bytes (before the gates, the delete could land last and leave
    the new file's record naming an object that is gone)."""
    ns, p = await env.open()
    entered, release = asyncio.Event(), asyncio.Event()
    real_many = p.cold.delete_many
    puts: list[str] = []
    real_put = p.cold.put_file

    async def held_many(keys: Sequence[str]) -> dict[str, TierError | None]:
        if "drace/k" in keys:
            entered.set()
            await release.wait()
        return await real_many(keys)

    async def seen_put(key: str, *a: Any, **kw: Any) -> Any:
        puts.append(key)
        return await real_put(key, *a, **kw)

    p.cold.delete_many = held_many  # type: ignore[method-assign]
    p.cold.put_file = seen_put  # type: ignore[method-assign]
    try:
        await ns.create_bucket(ROOT, "drace")
        await ns.put_object(ROOT, "drace", "k", body(b"old bytes"))
        await ns.put_object(ROOT, "drace", "other", body(b"other"))
        assert await p.drain("drace/", timeout=30)
        assert await ns.delete_object(ROOT, "drace", "k")
        assert await ns.delete_object(ROOT, "drace", "other")
        await asyncio.wait_for(entered.wait(), 20)  # the batch judged "k": delete
        puts.clear()
        await ns.put_object(ROOT, "drace", "k", body(b"new bytes"))
        await asyncio.sleep(0.5)  # the persister's turn: the upload waits on the gate
        assert puts == []
        assert env.raw_get("drace/k") == b"old bytes"
        release.set()
        assert await p.drain("drace/", timeout=30)
        assert puts == ["drace/k"]
        assert env.raw_get("drace/k") == b"new bytes"
        assert not env.raw_exists("drace/other")
        assert _pending(env) == set()
    finally:
        release.set()
        await env.close()


async def test_failed_keys_stay_pending_and_the_rest_are_done(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """One key refused by the store (a TierError of its own), one the store failed
    (TierUnavailable), one left out of the answer: those three stay pending, the refusal
    counted; the others are deleted and cleared in the batch's transaction, and the
    TierUnavailable is raised after it (the pass stops: the store's health decides when to
    go on).  The next pass, with the store answering, carries out the three."""
    ns, p = await env.open()
    try:
        await ns.create_bucket(ROOT, "dfail")
        names = [f"k{i}" for i in range(6)]
        for n in names:
            await ns.put_object(ROOT, "dfail", n, body(n.encode()))
        assert await p.drain("dfail/", timeout=60)
        await p.close()
        for n in names:
            assert await ns.delete_object(ROOT, "dfail", n)
        real_many = p.cold.delete_many

        async def failing(keys: Sequence[str]) -> dict[str, TierError | None]:
            out = await real_many([k for k in keys if k not in (
                "dfail/k1", "dfail/k2", "dfail/k3")])
            out["dfail/k1"] = TierError("refused")
            out["dfail/k2"] = TierUnavailable("down for this one")
            return out  # dfail/k3: not answered
        monkeypatch.setattr(p.cold, "delete_many", failing)
        p.kick_deletes()
        assert p._delete_task is not None
        await p._delete_task  # the TierUnavailable ended the pass (logged, not raised)
        assert _pending(env) == {"dfail/k1", "dfail/k2", "dfail/k3"}
        assert p._delete_errors == {"dfail/k1": 1}
        for n in ("k0", "k4", "k5"):
            assert not env.raw_exists(f"dfail/{n}")
        for n in ("k1", "k2", "k3"):
            assert env.raw_exists(f"dfail/{n}")
        monkeypatch.undo()
        p.kick_deletes()
        assert p._delete_task is not None
        await p._delete_task
        assert _pending(env) == set() and p._delete_errors == {}
        assert not any(env.raw_exists(f"dfail/{n}") for n in names)
    finally:
        await env.close()
