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

**Adoption** (``load(..., node=NAME)``, ``tierd meta load --node NAME``).  A single node's
records name no node; a cluster's carry the name of the node whose hot tier holds what they
describe (:mod:`tierd.meta.nodes`).  Loaded as they are into a cluster's database, a single
node's files not yet in cold would be held by nobody.  Adopting rewrites them, in the same
one transaction, into the form node NAME would have written: every regular file's ``home``
is NAME, its ``hot``/``warm`` bitmaps become ``hot@NAME``/``warm@NAME``, the ``O``, ``V``,
``G`` and ``W`` keys move into NAME's scope, the running mark becomes ``running@NAME`` and
multipart uploads name NAME as the holder of their parts.  Started as node NAME on the same
data directory, the daemon finds its files where its records say they are, serves them to
the other nodes through its peer door and persists them.  The S3 secrets, sealed with the
data directory's ``secrets.key`` on a single node, are sealed again with the key every node
derives from ``cluster_secret`` (:func:`reseal_keys`).

The reverse (``load`` into lmdb with ``node=NAME`` of a cluster's dump) makes node NAME a
single node again: its records lose the name, the other nodes' residency and garbage are
dropped (their tiers are not here), and a file whose bytes only another node holds (not in
cold) or a multipart upload whose parts another node holds makes the load refuse, naming
them, since the single node could never read them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from tierd.meta import nodes
from tierd.meta.kv import KVStore, KVTxn
from tierd.meta.records import STATE_CLEAN, AccessKey, Inode, MultipartUpload, UploadPart

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


#: re-seals an access key's secret (access key id, sealed secret) -> sealed with the other
#: key: from the data directory's ``secrets.key`` to the cluster's, or back (tierd.cli)
Reseal = Callable[[str, bytes], bytes]
_SCOPED = (b"O", b"V", b"G", b"W")
_RUNNING = b"Crunning"  # the counter that says a single node's daemon runs
_TOMB_HEAD = b"\xff" * 8  # a cluster's tombstone of a carried-out cold delete (placement)
_NAMED = 20  # inodes named in a refusal


def _node_of_running(k: bytes) -> str | None:
    """The node of a ``running@NODE`` counter key, else None."""
    return k[len(_RUNNING) + 1:].decode() if k.startswith(_RUNNING + b"@") else None


class _Adopt:
    """Rewrites a single node's records into node ``node``'s form (module docstring);
    refuses (DumpError) a record that already names a node.  With the node ``""`` it only
    checks: a cluster's records loaded as they are into a single node's store would read
    as "the whole file is here" wherever a bitmap names another node."""

    def __init__(self, node: str, reseal: Reseal | None) -> None:
        self.node, self.reseal = node, reseal

    def _already(self, what: str) -> DumpError:
        if not self.node:
            return DumpError(f"the dump is of a cluster ({what}): into a single node's store "
                             "load it with --node NAME, the node whose data directory "
                             "this is")
        return DumpError(f"the dump is of a cluster already ({what}): --node adopts a single "
                         "node's namespace; load a cluster's dump without --node")

    def __call__(self, k: bytes, v: bytes) -> list[tuple[bytes, bytes]]:
        kind, node = k[:1], self.node
        if kind == b"I":
            inode = Inode.decode(v)
            if inode.home or any("@" in t for t in inode.blocks):
                raise self._already(f"inode {inode.ino} names a node")
            if not node:
                return [(k, v)]
            if inode.is_reg:
                inode.home = node  # its bytes are in this data directory's tiers
            inode.blocks = {f"{t}@{node}": bm for t, bm in inode.blocks.items()
                            if t in nodes.LOCAL_TIERS}
            return [(k, inode.encode())]
        if kind in _SCOPED:
            if len(k) != 9:
                raise self._already(f"a node's {kind.decode()} record")
            if not node:
                return [(k, v)]
            return [(nodes.scoped_key(kind, node, int.from_bytes(k[1:], "big")), v)]
        if k == _RUNNING and node:
            return [(_RUNNING + b"@" + node.encode(), v)]
        if kind == b"M":
            upload = MultipartUpload.decode(v)
            if upload.node:
                raise self._already(f"multipart upload {upload.upload_id} names a node")
            if not node:
                return [(k, v)]
            upload.node = node  # its parts are in this data directory's hot tier
            return [(k, upload.encode())]
        if kind == b"K" and self.reseal is not None:
            return [(k, _resealed(v, self.reseal))]
        if kind in (b"A", b"T") or _node_of_running(k) is not None:
            raise self._already(f"key {k[:40]!r}")
        if kind == b"Z" and v[:8] == _TOMB_HEAD:
            raise self._already("a cold-delete tombstone")
        return [(k, v)]

    def finish(self) -> None:
        """Nothing to check at the end of an adoption."""


class _Leave:
    """Rewrites a cluster's records into the form a single node ``node`` would have
    written, dropping the other nodes' per-node state; collects what another node alone
    holds, refused at :meth:`finish`."""

    def __init__(self, node: str, reseal: Reseal | None) -> None:
        self.node, self.reseal = node, reseal
        self.clustered = False  # a record in a cluster's form was seen
        self.stranded: dict[str, list[int]] = {}  # node -> inodes only it holds
        self.problems: list[str] = []

    def __call__(self, k: bytes, v: bytes) -> list[tuple[bytes, bytes]]:
        kind, node = k[:1], self.node
        if kind == b"I":
            return self._inode(k, Inode.decode(v))
        if kind in _SCOPED and len(k) > 9:
            self.clustered = True
            prefix = nodes.scoped_prefix(kind, node)
            if k.startswith(prefix) and len(k) == len(prefix) + 8:
                return [(kind + k[len(prefix):], v)]
            if kind != b"G":  # another node's garbage is on its own disks
                owner = k[1:k.index(b"\x00", 1)].decode(errors="replace")
                self.problems.append(f"node {owner!r} has {kind.decode()} records (files "
                                     "open, being written or logged): stop it cleanly")
            return []
        running = _node_of_running(k)
        if running is not None:
            self.clustered = True
            if running == node:
                return [(_RUNNING, v)]
            if v.strip(b"\x00"):
                self.problems.append(f"node {running!r} is running or did not stop cleanly")
            return []
        if kind == b"M":
            upload = MultipartUpload.decode(v)
            if upload.node not in ("", node):
                self.problems.append(f"multipart upload {upload.upload_id} has its parts on "
                                     f"node {upload.node!r}: complete or abort it there")
            self.clustered |= bool(upload.node)
            upload.node = ""
            return [(k, upload.encode())]
        if kind == b"P":
            return [(k, self._part(v))]
        if kind == b"K" and self.reseal is not None:
            self._need_cluster()  # the registry, counters and inodes sort before keys
            return [(k, _resealed(v, self.reseal))]
        if kind in (b"A", b"T") or (kind == b"Z" and v[:8] == _TOMB_HEAD):
            self.clustered = True
            return []  # the registry, upload marks, tombstones: only between nodes
        return [(k, v)]

    def _inode(self, k: bytes, inode: Inode) -> list[tuple[bytes, bytes]]:
        node, stored = self.node, inode.blocks
        self.clustered |= bool(inode.home) or any("@" in t for t in stored)
        if (inode.is_reg and inode.home not in ("", node) and inode.state != STATE_CLEAN
                and inode.size):
            self.stranded.setdefault(inode.home, []).append(inode.ino)
        view: dict[str, bytes] = {}
        for tier in nodes.LOCAL_TIERS:
            bm = stored.get(f"{tier}@{node}")
            if bm is not None:
                view[tier] = bm
            elif tier == "hot" and inode.is_reg and inode.home != node:
                view[tier] = b""  # a single node reads a missing hot bitmap as "all here"
        inode.blocks, inode.home = view, ""
        return [(k, inode.encode())]

    def _part(self, v: bytes) -> bytes:
        """A part whose bytes another node holds (a part record may name its node) is
        refused; one of this node's names none, as a single node's do."""
        part = UploadPart.decode(v)
        holder = getattr(part, "node", "")
        if not holder:
            return v
        if holder != self.node:
            self.problems.append(f"a multipart upload has parts on node {holder!r}: "
                                 "complete or abort it there")
        setattr(part, "node", "")  # noqa: B010  # a field some record versions lack
        return part.encode()

    def _need_cluster(self) -> None:
        if not self.clustered:
            raise DumpError("the dump is a single node's already (no record names a node): "
                            "load it without --node")

    def finish(self) -> None:
        """Refuse what a single node could never serve, naming it."""
        self._need_cluster()
        out = list(dict.fromkeys(self.problems))
        for owner, inos in sorted(self.stranded.items()):
            named = ", ".join(map(str, inos[:_NAMED])) + (", ..." if len(inos) > _NAMED
                                                          else "")
            out.append(f"{len(inos)} files hold bytes only node {owner!r} has (not yet in "
                       f"cold): inodes {named}; persist them on {owner!r} first "
                       "(tierctl persist --wait)")
        if out:
            raise DumpError(f"node {self.node!r} cannot leave the cluster as a single node: "
                            + "; ".join(out))


def _resealed(v: bytes, reseal: Reseal) -> bytes:
    key = AccessKey.decode(v)
    if not key.secret_enc:
        return v
    key.secret_enc = reseal(key.access_key, key.secret_enc)
    return key.encode()


def _refuse_non_empty(tx: KVTxn) -> None:
    """DumpError when the target holds anything, saying what (a cluster's nodes)."""
    if next(iter(tx.scan(b"")), None) is None:
        return
    registered = [k[1:].decode(errors="replace") for k, _ in tx.scan(b"A", b"B")]
    what = (f"it already serves a cluster (nodes {', '.join(registered)})" if registered
            else "it already holds a namespace (loaded before?)")
    raise DumpError(f"the target metadata store is not empty: {what}; load into a new "
                    "database or metadata directory")


def load(engine: KVStore, src: BinaryIO, *, node: str = "", cluster: bool = False,
         reseal: Reseal | None = None) -> int:
    """Write the dump in ``src`` into the empty ``engine`` in one transaction; return the
    number of keys read.  With ``node``: into a cluster's database (``cluster``) a single
    node's namespace is adopted by that node; into a single node's store (not
    ``cluster``) a cluster's namespace becomes that node's alone (module docstring).
    Without: into a single node's store a cluster's namespace is refused.
    ``reseal`` re-seals the access keys' secrets on the way.  ``node`` must be a valid
    ``node_name`` (the CLI checks it as the settings do).  DumpError (nothing written)
    for a non-empty store, a bad file, or a dump the conversion refuses."""
    convert: _Adopt | _Leave | None = None  # a cluster's records into PostgreSQL: as they are
    if node or not cluster:
        convert = _Adopt(node, reseal) if cluster or not node else _Leave(node, reseal)
    records = _records(src)
    head = next(records, None)
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise DumpError("not a tierd metadata dump (no header)")
    if head.get("version") != VERSION:
        raise DumpError(f"dump version {head.get('version')} is not supported "
                        f"(this tierd reads version {VERSION})")
    tx = engine.begin(write=True)
    try:
        _refuse_non_empty(tx)
        n = 0
        for rec in records:
            if isinstance(rec, dict):
                if rec.get("end") != n:
                    raise DumpError(f"the dump says {rec.get('end')} keys, it holds {n}")
                if convert is not None:
                    convert.finish()
                tx.commit()
                return n
            if not (isinstance(rec, list) and len(rec) == 2
                    and isinstance(rec[0], bytes) and isinstance(rec[1], bytes)):
                raise DumpError(f"malformed record after {n} keys")
            for k, v in (convert(rec[0], rec[1]) if convert is not None else [rec]):
                tx.put(k, v)
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
