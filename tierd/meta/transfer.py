"""``tierd meta dump`` / ``tierd meta load``: move a namespace between engines.

A node grows into a cluster by moving its lmdb metadata into PostgreSQL (and back, to leave
one).  The dump is engine-neutral: every key and value of the store, in key order, read from
one snapshot, streamed into a file and never held in memory whole::

    msgpack {"format": "tierd-meta-dump", "version": 1}
    msgpack [key, value]            (one per key)
    msgpack {"end": number of keys}

A load writes into an **empty** store in one write transaction (the PostgreSQL engine sends
its puts in bounded batches), so a failed or interrupted load -- a truncated file, a broken
connection, a kill -- leaves the store empty, never half loaded.  Both work on the raw engine
(no group commit) of a stopped daemon: the data directory's lock is taken, so a running
daemon on it refuses them and they refuse a running daemon.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from tierd.meta.kv import KVStore

FORMAT = "tierd-meta-dump"
VERSION = 1
#: bytes read from the dump at a time
_CHUNK = 1 << 20


class DumpError(ValueError):
    """The file is not a complete dump this tierd reads."""


def open_engine(meta_url: str, meta_dir: Path, map_size: int = 0) -> KVStore:
    """The engine the settings name, without group commit: PostgreSQL for a ``meta_url``,
    else lmdb in ``meta_dir`` (durable commits) with the ``meta_map_size`` map (0: the
    default), as the daemon opens it."""
    if meta_url:
        from tierd.meta.pg_engine import PgStore

        return PgStore(meta_url)
    from tierd.meta.lmdb_engine import DEFAULT_MAP_SIZE, LmdbStore

    return LmdbStore(meta_dir, map_size or DEFAULT_MAP_SIZE)


def dump(engine: KVStore, out: BinaryIO) -> int:
    """Write every key of ``engine`` (one snapshot) to ``out``; return how many."""
    pack = msgpack.Packer(use_bin_type=True)
    out.write(pack.pack({"format": FORMAT, "version": VERSION}))
    n = 0
    tx = engine.begin()
    try:
        for k, v in tx.scan(b""):
            out.write(pack.pack([k, v]))
            n += 1
    finally:
        tx.abort()
    out.write(pack.pack({"end": n}))
    return n


def _records(src: BinaryIO) -> Iterator[Any]:
    unpacker = msgpack.Unpacker(raw=False, use_list=True, max_buffer_size=1 << 30)
    while chunk := src.read(_CHUNK):
        unpacker.feed(chunk)
        yield from unpacker


def load(engine: KVStore, src: BinaryIO) -> int:
    """Write the dump in ``src`` into the empty ``engine`` in one transaction; return the
    number of keys.  DumpError (nothing written) for a non-empty store or a bad file."""
    records = _records(src)
    head = next(records, None)
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise DumpError("not a tierd metadata dump (no header)")
    if head.get("version") != VERSION:
        raise DumpError(f"dump version {head.get('version')} is not supported "
                        f"(this tierd reads version {VERSION})")
    tx = engine.begin(write=True)
    try:
        if next(iter(tx.scan(b"")), None) is not None:
            raise DumpError("the target metadata store is not empty: load into a new "
                            "database or metadata directory")
        n = 0
        for rec in records:
            if isinstance(rec, dict):
                if rec.get("end") != n:
                    raise DumpError(f"the dump says {rec.get('end')} keys, it holds {n}")
                tx.commit()
                return n
            if not (isinstance(rec, list) and len(rec) == 2
                    and isinstance(rec[0], bytes) and isinstance(rec[1], bytes)):
                raise DumpError(f"malformed record after {n} keys")
            tx.put(rec[0], rec[1])
            n += 1
        raise DumpError(f"the dump is truncated after {n} keys (no end record)")
    finally:
        tx.abort()  # a no-op after the commit


def dump_file(engine: KVStore, path: Path) -> int:
    """:func:`dump` into ``path`` through a temporary file renamed when complete and
    synced, so ``path`` is only ever a whole dump."""
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        n = dump(engine, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return n
