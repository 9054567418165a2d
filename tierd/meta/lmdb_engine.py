"""The embedded metadata engine: one lmdb environment in the data directory.

lmdb gives readers lock-free MVCC snapshots and one writer at a time, which fits an asyncio
daemon: transactions are short and never span an ``await``.

Two durability modes (setting ``meta_sync``):

* ``durable=True`` (default): ``sync=True, metasync=False``.  Each commit fdatasyncs the data
  pages before the meta page is written, so the file stays intact through a machine crash
  and at most the last commit is undone; :meth:`LmdbStore.sync` (called at the durability
  points: fsync, close, S3 acknowledgement) also flushes that meta page.  Costs one
  fdatasync per commit (~4,000 commits/s measured on this machine kind).
* ``durable=False``: ``sync=False``.  Commits reach only the OS page cache (a killed process
  still loses nothing) and are flushed at the durability points; a machine crash between
  them can corrupt the file unless the file system preserves write order.  For scratch
  nodes and benchmarks of the rest of the stack (~150,000 commits/s).

See docs/metadata.md, "Transactions and durability".
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import lmdb

from tierd.meta.kv import KVStore, KVTxn

DEFAULT_MAP_SIZE = 64 << 30  # address space only; the file grows as needed


class LmdbTxn(KVTxn):
    def __init__(self, env: lmdb.Environment, write: bool) -> None:
        self.write = write
        self._txn = env.begin(write=write, buffers=False)
        self._done = False

    def get(self, key: bytes) -> bytes | None:
        value = self._txn.get(key)
        return None if value is None else bytes(value)

    def put(self, key: bytes, value: bytes) -> None:
        if not self.write:
            raise PermissionError("write in a read-only transaction")
        self._txn.put(key, value)

    def delete(self, key: bytes) -> bool:
        if not self.write:
            raise PermissionError("write in a read-only transaction")
        return bool(self._txn.delete(key))

    def scan(
        self, start: bytes, end: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        cur = self._txn.cursor()
        try:
            if reverse:
                if end is None:
                    ok = cur.last()
                else:
                    ok = cur.set_range(end)
                    ok = cur.prev() if ok else cur.last()
                while ok:
                    k = bytes(cur.key())
                    if k < start:
                        break
                    yield k, bytes(cur.value())
                    ok = cur.prev()
            else:
                ok = cur.set_range(start)
                while ok:
                    k = bytes(cur.key())
                    if end is not None and k >= end:
                        break
                    yield k, bytes(cur.value())
                    ok = cur.next()
        finally:
            cur.close()

    def commit(self) -> None:
        if not self._done:
            self._done = True
            self._txn.commit()

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self._txn.abort()


class LmdbStore(KVStore):
    name = "lmdb"

    def __init__(
        self,
        path: Path | str,
        map_size: int = DEFAULT_MAP_SIZE,
        *,
        durable: bool = True,
        metasync: bool = False,
    ) -> None:
        self.durable = durable
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o700)
        self._env = lmdb.open(
            str(path),
            map_size=map_size,
            subdir=True,
            sync=durable,
            metasync=metasync,
            max_dbs=0,
            lock=True,
            readahead=False,
        )

    def begin(self, write: bool = False) -> KVTxn:
        return LmdbTxn(self._env, write)

    def sync(self) -> None:
        self._env.sync(True)

    def close(self) -> None:
        self._env.close()

    def stat(self) -> dict[str, int]:
        info = self._env.info()
        st = self._env.stat()
        return {
            "entries": int(st["entries"]),
            "map_size": int(info["map_size"]),
            "used_bytes": int((info["last_pgno"] + 1) * st["psize"]),
        }
