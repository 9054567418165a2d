"""``tierd meta dump`` / ``tierd meta load`` (tierd/meta/transfer.py) through the real CLI:
a namespace goes lmdb -> PostgreSQL -> lmdb unchanged, and a load that cannot finish leaves
the target empty."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tierd.meta import Dirent, Inode, MetaStore
from tierd.meta.kv import KVStore
from tierd.meta.lmdb_engine import LmdbStore
from tierd.meta.pg_engine import PgStore

from .pg_server import PgServer

pytestmark = pytest.mark.timeout(300)
NFILES = 6000  # more inodes than the PostgreSQL engine buffers before it sends


def tierd(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    return subprocess.run([sys.executable, "-m", "tierd.cli", *args], capture_output=True,
                          text=True, env=env, timeout=240)


def everything(engine: KVStore) -> list[tuple[bytes, bytes]]:
    tx = engine.begin()
    try:
        return list(tx.scan(b""))
    finally:
        tx.abort()


def make_namespace(data_dir: Path) -> list[tuple[bytes, bytes]]:
    store = MetaStore.open_lmdb(data_dir / "meta", sync="commit")
    try:
        with store.write() as tx:
            for i in range(NFILES):
                ino = tx.next_ino()
                tx.put_inode(Inode(ino=ino, mode=0o100644, uid=1, gid=2, size=i,
                                   objmeta={"k": "v" * (i % 50)}))
                tx.add_dirent(1, b"file-%05d" % i, Dirent(ino, 0o100000))
                tx.set_xattr(ino, b"user.\xff\x00bin", bytes(range(i % 256)))
        return everything(store.engine)
    finally:
        store.close()


def test_lmdb_to_pg_to_lmdb_round_trip(pg_server: PgServer, tmp_path: Path) -> None:
    url = pg_server.url(str(tmp_path))
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    want = make_namespace(a)
    assert len(want) > 3 * NFILES

    r = tierd("meta", "dump", str(tmp_path / "one.dump"), "--data-dir", str(a))
    assert r.returncode == 0, r.stderr
    assert f"dumped {len(want)} keys" in r.stdout
    r = tierd("meta", "load", str(tmp_path / "one.dump"), "--data-dir", str(b),
              "--meta-url", url)
    assert r.returncode == 0, r.stderr
    pg = PgStore(url)
    try:
        assert everything(pg) == want
    finally:
        pg.close()
    assert not (b / "meta").exists() or not any((b / "meta").iterdir())

    r = tierd("meta", "dump", str(tmp_path / "two.dump"), "--data-dir", str(b),
              "--meta-url", url)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "one.dump").read_bytes() == (tmp_path / "two.dump").read_bytes()
    r = tierd("meta", "load", str(tmp_path / "two.dump"), "--data-dir", str(c))
    assert r.returncode == 0, r.stderr
    back = LmdbStore(c / "meta")
    try:
        assert everything(back) == want
    finally:
        back.close()

    store = MetaStore(PgStore(url))  # and the loaded database is a namespace MetaStore opens
    try:
        with store.read() as tx:
            assert tx.lookup(1, b"file-05999") is not None
    finally:
        store.close()

    # into a store that is not empty: refused, nothing changed
    r = tierd("meta", "load", str(tmp_path / "two.dump"), "--data-dir", str(c))
    assert r.returncode == 1 and "not empty" in r.stderr
    back = LmdbStore(c / "meta")
    try:
        assert everything(back) == want
    finally:
        back.close()


def test_load_that_cannot_finish_loads_nothing(pg_server: PgServer, tmp_path: Path) -> None:
    url = pg_server.url(str(tmp_path))
    make_namespace(tmp_path / "a")
    r = tierd("meta", "dump", str(tmp_path / "full.dump"), "--data-dir", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    full = (tmp_path / "full.dump").read_bytes()
    (tmp_path / "cut.dump").write_bytes(full[: len(full) * 2 // 3])
    r = tierd("meta", "load", str(tmp_path / "cut.dump"), "--data-dir", str(tmp_path / "b"),
              "--meta-url", url)
    assert r.returncode == 1 and "truncated" in r.stderr, r.stderr
    pg = PgStore(url)
    try:
        assert everything(pg) == []  # one transaction: none of the keys sent before the end
    finally:
        pg.close()
    (tmp_path / "junk.dump").write_bytes(b"not a dump")
    r = tierd("meta", "load", str(tmp_path / "junk.dump"), "--data-dir", str(tmp_path / "b"),
              "--meta-url", url)
    assert r.returncode == 1 and "not a tierd metadata dump" in r.stderr, r.stderr

    # into lmdb, the load honours meta_map_size: a map too small for the dump fills up
    # (a load ignoring it would take the default 64 GiB map, whatever the operator set)
    r = tierd("meta", "load", str(tmp_path / "full.dump"), "--data-dir", str(tmp_path / "c"),
              "--meta-map-size", "1M")
    assert r.returncode == 1 and "meta_map_size" in r.stderr, r.stderr
    back = LmdbStore(tmp_path / "c" / "meta")
    try:
        assert everything(back) == []
    finally:
        back.close()
