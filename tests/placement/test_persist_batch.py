"""The persister's metadata transactions are batched (tierd/placement/upload.py,
``TxnBatch``): persisting a burst of new files paid two write transactions per file (the
put-intention, then the record), and a pass over every pending cold delete after each
one; the reconciles running at once now share their transactions, and a record that
leaves no delete behind kicks no pass.  Merging
changes no outcome: every file is persisted and recorded CLEAN, a body that refuses
(``Superseded``) or fails leaves the others' writes, and its own, as if it had run alone.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from tierd.acl import Identity
from tierd.meta import STATE_CLEAN, MetaStore, MetaTxn
from tierd.placement import intents
from tierd.placement.upload import Superseded, TxnBatch

from .conftest import Env, write_file

ROOT = Identity.ROOT
FILES = 200


def count_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the real ``MetaStore.write`` transactions begun (a one-element list)."""
    calls = [0]
    real = MetaStore.write

    def counted(store: MetaStore) -> MetaTxn:
        calls[0] += 1
        return real(store)

    monkeypatch.setattr(MetaStore, "write", counted)
    return calls


async def test_a_burst_of_new_files_is_persisted_in_shared_transactions(
    env: Env, monkeypatch: pytest.MonkeyPatch,
) -> None:
    writes = count_writes(monkeypatch)
    scans = [0]
    real_scan = intents.scan

    def counted_scan(*args: Any) -> Any:
        scans[0] += 1
        return real_scan(*args)

    monkeypatch.setattr(intents, "scan", counted_scan)
    ns, p = await env.open(persist_delay=3600)
    try:
        b = await ns.create_bucket(ROOT, "bat")
        inos = []
        for i in range(FILES):  # as FUSE creates them: create + close, empty
            inode, fh = await ns.create(ROOT, b.ino, b"e%03d" % i, 0o644, os.O_WRONLY)
            await ns.release(fh)
            inos.append(inode.ino)
        for i in range(20):
            inos.append(await write_file(ns, b.ino, b"d%02d" % i, b"data %d" % i))
        writes[0] = scans[0] = 0
        assert await p.drain(timeout=120)
        per_file = writes[0] / len(inos)
        print(f"{writes[0]} write transactions for {len(inos)} files: {per_file:.2f} per "
              f"file; the batch: {p.txns.transactions} for {p.txns.bodies} bodies")
        # before: 2.00 (both kinds).  Over moto the uploads, not the reconciles, set the
        # pace: records come one by one as uploads finish (0.5 measured, 1.7 at worst)
        limit = 0.5 if env.kind == "file" else 1.8
        assert per_file < limit, f"{writes[0]} write transactions persisted {len(inos)} files"
        # new files leave no cold delete behind: no pass over the pending deletes per
        # persisted file (only the persister's full scans, every few seconds, kick one)
        assert scans[0] <= 5, f"{scans[0]} passes over the pending deletes"
        with ns.meta.snapshot() as tx:
            for ino in inos:
                cur = tx.get_inode(ino)
                assert cur is not None and cur.state == STATE_CLEAN, ino
                assert tx.queued(ino) is None and tx.get_cold(ino) is not None, ino
        assert env.raw_get("bat/e000") == b"" and env.raw_get("bat/d19") == b"data 19"
    finally:
        await env.close()


async def test_a_body_that_refuses_or_fails_leaves_the_others(file_env: Env) -> None:
    """Four bodies handed in at once: one raises Superseded (before writing), one fails
    after writing; the other two commit, the failed one's write is gone, and each caller
    gets its own answer.  The ``after`` hooks run once each."""
    store = MetaStore.open_lmdb(file_env.meta_dir)
    try:
        batch = TxnBatch(store)
        afters: list[str] = []

        def put(name: str) -> Any:
            def body(tx: MetaTxn) -> str:
                tx.kv.put(b"\x01test" + name.encode(), b"1")
                if name == "boom":
                    raise RuntimeError("boom")
                return name
            return body

        def refuse(tx: MetaTxn) -> str:
            raise Superseded("k")

        got = await asyncio.gather(
            batch.run(put("a"), after=lambda: afters.append("a")),
            batch.run(refuse, after=lambda: afters.append("refuse")),
            batch.run(put("boom"), after=lambda: afters.append("boom")),
            batch.run(put("b"), after=lambda: afters.append("b")),
            return_exceptions=True)
        assert got[0] == "a" and got[3] == "b"
        assert isinstance(got[1], Superseded) and isinstance(got[2], RuntimeError)
        assert sorted(afters) == ["a", "b", "boom", "refuse"]
        with store.snapshot() as tx:
            assert tx.kv.get(b"\x01testa") == b"1" and tx.kv.get(b"\x01testb") == b"1"
            assert tx.kv.get(b"\x01testboom") is None
        # without a failure, bodies handed in together share one transaction
        before = batch.transactions
        assert await asyncio.gather(*(batch.run(put(f"n{i}")) for i in range(10))) == [
            f"n{i}" for i in range(10)]
        assert batch.transactions == before + 1
    finally:
        store.close()
