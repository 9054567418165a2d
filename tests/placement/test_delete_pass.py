"""The pending deletes' pass looks at a tombstone within its TTL (and, on a cluster, at
another node's delete) without a transaction of its own: the pass's snapshot already
says :meth:`_delete_one` would do nothing with it.  A cluster keeps a tombstone for every
delete of the last two minutes, and every node ran one read transaction per tombstone per
pass (bench/cluster_meta.py with write-back running: ~10 per create on every node).

An expired tombstone is still cleared and a pending delete still judged."""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest

from tierd.meta import MetaStore
from tierd.placement import intents

from .conftest import ROOT, Env, write_file


async def test_live_tombstones_cost_the_pass_no_transaction_each(
        file_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    ns, p = await file_env.open()
    try:
        b = await ns.create_bucket(ROOT, "dpass")
        await write_file(ns, b.ino, b"gone", b"bytes")
        assert await p.drain("dpass/", timeout=30)
        assert file_env.raw_exists("dpass/gone")
        now = time.time_ns()
        with p.meta.write() as tx:
            for i in range(50):  # deleted a moment ago on a cluster: kept for imports
                tx.kv.put(intents.record_key(f"dpass/t{i:03}"),
                          struct.pack(">QQ", intents.TOMB, now) + f"dpass/t{i:03}".encode())
            tx.kv.put(intents.record_key("dpass/old"),  # past its TTL: to be cleared
                      struct.pack(">QQ", intents.TOMB, now - 200 * 10**9) + b"dpass/old")
            intents.intend(tx, "dpass/gone", 0)  # a delete the live file made obsolete
        snapshots: list[int] = []
        real = MetaStore.asnapshot

        def counted(self: MetaStore, *a: Any, **kw: Any) -> Any:
            snapshots.append(1)
            return real(self, *a, **kw)
        monkeypatch.setattr(MetaStore, "asnapshot", counted)
        p.kick_deletes()
        assert p._delete_task is not None
        await p._delete_task
        monkeypatch.undo()
        with p.meta.snapshot() as tx:
            left = {it.key for it in intents.scan(tx, "", 1000)}
        assert left == {f"dpass/t{i:03}" for i in range(50)}  # live ones kept, the rest done
        assert file_env.raw_exists("dpass/gone")  # obsolete: the live file's object stays
        # the batch's snapshot, and one each for the two it acts on (not 52)
        assert len(snapshots) <= 4, len(snapshots)
    finally:
        await file_env.close()
