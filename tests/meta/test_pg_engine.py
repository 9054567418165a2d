"""What the PostgreSQL engine promises beyond the contract suite (which runs on it too, as
``pg`` and ``group-pg``): writers of several stores (nodes) sharing one database are
serialized, a killed client leaves exactly the committed state and releases its lock, a
server restart costs the next transaction nothing, and the layout version is checked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tierd.errors import FsError
from tierd.meta import MetaStore
from tierd.meta.pg_engine import PG_SCHEMA_VERSION, PgStore

from .pg_server import PgServer
from .test_crash import (
    COMMIT_LOOP,
    HOLD_OPEN_WRITE,
    PARENT,
    committed_state,
    kill,
    read_line,
    run_and_kill,
    spawn,
)

pytestmark = pytest.mark.timeout(180)

# COMMIT_LOOP of test_crash.py over PostgreSQL (its path argument is the database's URL)
PG_COMMIT_LOOP = COMMIT_LOOP.replace("MetaStore.open_lmdb(path,", "MetaStore.open_pg(path,")
assert PG_COMMIT_LOOP != COMMIT_LOOP

# HOLD_OPEN_WRITE of test_crash.py over PostgreSQL: a baseline commit, then a write
# transaction holding the writers' lock, its changes sent to the server (a scan forces the
# buffered puts out), left open until the process is killed.
PG_HOLD_OPEN_WRITE = HOLD_OPEN_WRITE.replace(
    "MetaStore.open_lmdb(sys.argv[1],", "MetaStore.open_pg(sys.argv[1],").replace(
    'print("holding"', 'assert sum(1 for _ in tx.list_dirents(1)) == 5000\nprint("holding"')
assert PG_HOLD_OPEN_WRITE.count("open_pg") == 1 and "== 5000" in PG_HOLD_OPEN_WRITE


@pytest.fixture
def url(pg_server: PgServer, tmp_path: Path) -> str:
    return pg_server.url(str(tmp_path))


def test_writers_of_two_stores_are_serialized(url: str) -> None:
    """Two stores on one database (two nodes) incrementing one key in read-modify-write
    transactions lose no update and never fail: the second writer waits for the first and
    then sees its commit (READ COMMITTED without the lock loses updates; REPEATABLE READ
    fails them with serialization errors), although each node's read cache serves the
    reads between them: a writer never works from a value the other node replaced."""
    stores = [PgStore(url, node="n1"), PgStore(url, node="n2")]
    try:
        with stores[0].begin(write=True) as tx:
            tx.put(b"n", b"0")
        errors: list[BaseException] = []

        def bump(store: PgStore) -> None:
            try:
                for _ in range(60):
                    peek = store.begin()  # fills (or hits) this node's cache
                    peek.get(b"n")
                    peek.abort()
                    with store.begin(write=True) as tx:
                        n = int(tx.get(b"n") or b"0")
                        time.sleep(0.0005)  # widen the race
                        tx.put(b"n", b"%d" % (n + 1))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=bump, args=(s,)) for s in stores for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        tx = stores[1].begin()
        assert tx.get(b"n") == b"240"
        tx.abort()
        assert stores[0].cache.hits + stores[1].cache.hits > 0
    finally:
        for s in stores:
            s.close()


def test_reader_of_another_store_keeps_its_snapshot(url: str) -> None:
    a, b = PgStore(url), PgStore(url)
    try:
        with a.begin(write=True) as tx:
            tx.put(b"k", b"old")
        reader = b.begin()
        with a.begin(write=True) as tx:
            tx.put(b"k", b"new")
            tx.put(b"k2", b"added")
        assert reader.get(b"k") == b"old"
        assert list(reader.scan(b"")) == [(b"k", b"old")]
        reader.abort()
        fresh = b.begin()
        assert list(fresh.scan(b"")) == [(b"k", b"new"), (b"k2", b"added")]
        fresh.abort()
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("mode", ["commit", "group"])
def test_killed_writer_leaves_last_committed_state(url: str, mode: str) -> None:
    """kill -9 of a client committing in a loop: the database holds exactly the state after
    some transaction (never a mix), and every transaction the client reported (commit: each
    one; group: each one a sync covered)."""
    done = 0
    for at_least, delay in [(20, 0.0), (23, 0.002), (17, 0.0003)]:
        last = run_and_kill(url, at_least, delay, mode, script=PG_COMMIT_LOOP)
        assert last >= done + at_least
        n = committed_state(MetaStore(PgStore(url)))
        if mode == "commit":
            assert n in (last, last + 1), (n, last)  # killed after a commit, before its report
        else:
            assert n >= last, (n, last)
        done = n


def test_killed_open_write_txn_leaves_no_trace_and_frees_the_lock(url: str) -> None:
    holder = spawn(PG_HOLD_OPEN_WRITE, url)
    survivor = MetaStore(PgStore(url))
    try:
        assert read_line(holder) == "holding"
        with survivor.read() as tx:  # the open transaction is invisible
            assert [n for n, _, _ in tx.list_dirents(PARENT)] == [b"base"]
        wrote = threading.Event()

        def write() -> None:
            with survivor.write() as tx:
                tx.add_counter("seq", 1)
            wrote.set()

        t = threading.Thread(target=write)
        t.start()
        assert not wrote.wait(1.0), "a second writer got in while the holder held the lock"
        kill(holder)  # the server ends the dead client's transaction and its lock
        t.join(30)
        assert wrote.is_set()
        with survivor.read() as tx:
            assert tx.counter("seq") == 2
            assert [i.ino for i in tx.iter_inodes()] == [100]
            assert [n for n, _, _ in tx.list_dirents(PARENT)] == [b"base"]
            assert tx.lookup(PARENT, b"ghost1000") is None
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.communicate()
        survivor.close()


def test_server_restart_costs_the_next_transaction_nothing(pg_server: PgServer,
                                                          url: str) -> None:
    """Pooled connections die with the server; begin() replaces them instead of failing,
    and a transaction cut by the restart fails with EIO, leaving nothing half-done."""
    store = PgStore(url)
    try:
        with store.begin(write=True) as tx:
            tx.put(b"a", b"1")
        readers = [store.begin() for _ in range(4)]  # the pool grows to 5 connections
        for r in readers:
            r.abort()
        cut = store.begin(write=True)
        cut.put(b"b", b"2")
        pg_server.restart()
        with pytest.raises(FsError) as info:
            cut.commit()
        assert info.value.errno == 5
        for _ in range(6):  # every pooled connection was broken by the restart
            with store.begin(write=True) as tx:
                assert tx.get(b"a") == b"1"
                assert tx.get(b"b") is None
                tx.put(b"c", b"3")
        tx2 = store.begin()
        assert list(tx2.scan(b"")) == [(b"a", b"1"), (b"c", b"3")]
        tx2.abort()
    finally:
        store.close()


def test_layout_version_recorded_and_newer_refused(url: str) -> None:
    PgStore(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM meta_schema").fetchall() == [
            (PG_SCHEMA_VERSION,)]
        PgStore(url).close()  # opening again keeps one row
        assert conn.execute("SELECT count(*) FROM meta_schema").fetchall() == [(1,)]
        conn.execute("UPDATE meta_schema SET version = %s", (PG_SCHEMA_VERSION + 1,))
    with pytest.raises(RuntimeError, match="layout version"):
        PgStore(url)


def test_unreachable_server_is_a_clear_error() -> None:
    with pytest.raises(psycopg.OperationalError, match="refused"):
        PgStore("postgresql://tierd@127.0.0.1:1/none", timeout=3)


def _serve(data_dir: Path, url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "tierd.cli", "serve", "--data-dir", str(data_dir),
             "--s3-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
             "--meta-url", url], stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)


def _status(proc: subprocess.Popen[bytes], data_dir: Path, log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            ep = json.loads((data_dir / "endpoints.json").read_text())
        except (FileNotFoundError, ValueError):
            ep = {}
        if ep.get("pid") == proc.pid:
            break
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    token = (data_dir / "admin-token").read_text().strip()
    req = urllib.request.Request(ep["admin"]["url"] + "/v1/status",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def test_daemon_keeps_its_namespace_in_the_database(url: str, tmp_path: Path) -> None:
    """``meta_url`` selects the engine: the daemon's metadata is in the database (none in
    its meta directory), and a daemon on another data directory finds the same namespace."""
    log = tmp_path / "tierd.log"
    first = _serve(tmp_path / "a", url, log)
    try:
        st = _status(first, tmp_path / "a", log)
        assert st["meta"]["engine"] == "pg" and st["meta"]["entries"] > 0
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0, log.read_text()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert not any((tmp_path / "a" / "meta").iterdir())  # no lmdb store was made
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT count(*) FROM kv").fetchall()
    assert rows[0][0] >= st["meta"]["entries"]
    second = _serve(tmp_path / "b", url, log)
    try:
        again = _status(second, tmp_path / "b", log)
        assert again["inodes"] == st["inodes"] and again["meta"]["engine"] == "pg"
    finally:
        second.kill()
        second.wait()
