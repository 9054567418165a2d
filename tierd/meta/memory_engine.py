"""An in-memory engine with snapshot isolation, for tests and for proving the contract.

A write transaction works on a private copy of the sorted map and publishes it on commit, so
readers that began earlier keep their snapshot (as lmdb's do).  Copying is O(n) per write
transaction: this engine is for test-sized data, never for the daemon.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from itertools import islice

from sortedcontainers import SortedDict

from tierd.meta.kv import KVStore, KVTxn

_SCAN_BATCH = 64


class MemoryTxn(KVTxn):
    def __init__(self, store: MemoryStore, write: bool) -> None:
        self.write = write
        self._store = store
        self._data: SortedDict = store._root
        self._copied = False
        self._done = False

    def _writable(self) -> SortedDict:
        if not self.write:
            raise PermissionError("write in a read-only transaction")
        if not self._copied:
            self._data = self._data.copy()
            self._copied = True
        return self._data

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self._data.get(key)
        return value

    def put(self, key: bytes, value: bytes) -> None:
        self._writable()[bytes(key)] = bytes(value)

    def delete(self, key: bytes) -> bool:
        data = self._writable()
        if key in data:
            del data[key]
            return True
        return False

    def scan(
        self, start: bytes, end: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        # Lazy and tolerant of this transaction's own writes during the scan: take the keys
        # in small batches from the current view, resuming after the last key returned.
        lo, lo_inclusive, hi = start, True, end
        while True:
            batch = list(
                islice(
                    self._data.irange(lo, hi, inclusive=(lo_inclusive, False), reverse=reverse),
                    _SCAN_BATCH,
                )
            )
            for k in batch:
                value: bytes | None = self._data.get(k)
                if value is not None:
                    yield k, value
            if len(batch) < _SCAN_BATCH:
                return
            if reverse:
                hi = batch[-1]
            else:
                lo, lo_inclusive = batch[-1], False

    def commit(self) -> None:
        if self._done:
            return
        self._done = True
        if self.write:
            if self._copied:
                self._store._root = self._data
            self._store._writer.release()

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        if self.write:
            self._store._writer.release()


class MemoryStore(KVStore):
    name = "memory"

    def __init__(self) -> None:
        self._root: SortedDict = SortedDict()
        self._writer = threading.Lock()

    def begin(self, write: bool = False) -> KVTxn:
        if write:
            self._writer.acquire()
        return MemoryTxn(self, write)

    def sync(self) -> None:
        return None

    def close(self) -> None:
        self._root = SortedDict()

    def stat(self) -> dict[str, int]:
        return {"entries": len(self._root)}
