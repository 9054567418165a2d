"""``tierd meta dump`` / ``tierd meta load`` (tierd/meta/transfer.py) through the real CLI:
a namespace goes lmdb -> PostgreSQL -> lmdb unchanged, and a load that cannot finish leaves
the target empty."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tierd.meta import Dirent, Inode, MetaStore
from tierd.meta.kv import KVStore
from tierd.meta.lmdb_engine import LmdbStore
from tierd.meta.memory_engine import MemoryStore
from tierd.meta.pg_engine import PgStore
from tierd.meta.records import STATE_CLEAN, STATE_DIRTY, MultipartUpload
from tierd.meta.transfer import DumpError, dump, load

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


def _single_node_namespace() -> MetaStore:
    """A single node's records of every per-node kind: a dirty file with a partial hot
    bitmap, a clean file evicted from hot, a directory, orphan, intention, garbage and
    small-write log keys, the running mark and an open multipart upload."""
    store = MetaStore(MemoryStore())
    with store.write() as tx:
        tx.put_inode(Inode(ino=1, mode=0o040755, uid=0, gid=0, nlink=2, parent=1))
        tx.put_inode(Inode(ino=10, mode=0o100644, uid=1, gid=1, size=9 << 20, version=5,
                           state=STATE_DIRTY, blocks={"hot": b"\x03", "warm": b"\x01"}))
        tx.put_inode(Inode(ino=11, mode=0o100644, uid=1, gid=1, size=10, version=6,
                           state=STATE_CLEAN, blocks={"hot": b""}))
        tx.add_dirent(1, b"d", Dirent(10, 0o100000))
        tx.add_dirent(1, b"c", Dirent(11, 0o100000))
        tx.add_orphan(12)
        tx.add_intent(10)
        tx.add_garbage(13)
        tx.put_logged(10, 5, b"logged")
        tx.add_counter("running", 1)
        tx.put_upload(MultipartUpload("up1", "b", "k", 1, 1, 7))
    return store


def _dump_of(engine: KVStore) -> io.BytesIO:
    buf = io.BytesIO()
    dump(engine, buf)
    buf.seek(0)
    return buf


def test_adoption_moves_every_per_node_record_into_the_nodes_scope() -> None:
    """``load(node="n1", cluster=True)`` writes what node n1 would have written for the
    same files, and n1 reads it as the single node did; the reverse gives back exactly the
    single node's records.  Each conversion refuses a dump of the wrong form."""
    single = _single_node_namespace()
    src = _dump_of(single.engine)
    adopted = MemoryStore()
    load(adopted, src, node="n1", cluster=True)
    keys = dict(everything(adopted))
    as_loaded = _dump_of(adopted).getvalue()  # before a MetaStore marks what it indexed
    assert b"Crunning" not in keys and keys[b"Crunning@n1"] == (1).to_bytes(8, "big")
    for kind in (b"O", b"V", b"G", b"W"):
        assert not [k for k in keys if k[:1] == kind and len(k) == 9], kind
    n1, n2 = MetaStore(adopted, node="n1"), MetaStore(adopted, node="n2")
    with n1.read() as tx:
        dirty = tx.get_inode(10)
        assert dirty is not None and dirty.home == "n1"
        assert dirty.blocks == {"hot": b"\x03", "warm": b"\x01"}  # n1's view: as before
        clean = tx.get_inode(11)
        assert clean is not None and clean.blocks == {"hot": b""}
        assert tx.get_stored_inode(10).blocks == {"hot@n1": b"\x03",  # type: ignore[union-attr]
                                                  "warm@n1": b"\x01"}
        assert (tx.list_orphans(), tx.list_intents(), tx.list_garbage()) == ([12], [10], [13])
        assert list(tx.list_logged()) == [(10, 5, b"logged")]
        assert tx.get_upload("up1").node == "n1"  # type: ignore[union-attr]
        root = tx.get_inode(1)
        assert root is not None and root.home == ""
    with n2.read() as tx:  # another node holds none of it and recovers none of n1's keys
        assert tx.get_inode(10).blocks == {"hot": b""}  # type: ignore[union-attr]
        assert (tx.list_orphans(), tx.list_intents(), tx.list_garbage()) == ([], [], [])

    with pytest.raises(DumpError, match="cluster already"):  # adopting twice over
        load(MemoryStore(), _dump_of(adopted), node="n2", cluster=True)
    with pytest.raises(DumpError, match="load it with --node NAME"):  # as it is: refused
        load(MemoryStore(), io.BytesIO(as_loaded))
    with pytest.raises(DumpError, match="single node's already"):
        load(MemoryStore(), _dump_of(single.engine), node="n1", cluster=False)
    with pytest.raises(DumpError, match="already holds a namespace"):
        load(adopted, _dump_of(single.engine), node="n1", cluster=True)

    back = MemoryStore()  # the reverse gives the single node's records, byte for byte
    load(back, io.BytesIO(as_loaded), node="n1", cluster=False)
    assert everything(back) == everything(single.engine)
    with pytest.raises(DumpError, match="only node 'n1' has"):  # n2 cannot leave with them
        load(MemoryStore(), io.BytesIO(as_loaded), node="n2", cluster=False)
