"""MetaStore: tierd's metadata records on top of any :class:`~tierd.meta.kv.KVStore` engine.

Key layout (documented for operators in ``docs/metadata.md``); integers are 8-byte big-endian
so numeric order is byte order:

==========================  ===================================================
``\\x00schema``              schema version (msgpack int)
``C<name>``                 counters: ``next_ino``, ``next_version``, ``inodes``, ``bytes``
``I<ino>``                  :class:`Inode`
``D<parent><name>[/]``      :class:`Dirent`; a directory's name carries a trailing ``/`` so
                            entries sort in S3 key order (``a-b`` < ``a.txt`` < ``a/``) and a
                            listing is one range scan
``X<ino><name>``            xattr value
``B<bucket>``               :class:`Bucket`
``K<access key>``           :class:`AccessKey`
``N<user name>``            :class:`User`
``M<upload id>``            :class:`MultipartUpload`
``P<upload id>\0<part>``    :class:`UploadPart` (part number 4-byte big-endian)
``O<ino>``                  orphan: unlinked but still open; removed at release or restart
                            (``O``, ``V``, ``G``, ``W``: ``<kind><node>\0<ino>`` on a node of a
                            cluster, :mod:`tierd.meta.nodes`)
``L<ino><parent><name>``    reverse link index: one key per name of an inode (hard links
                            are several), maintained by ``add_dirent``/``remove_dirent``
``Q<ino>``                  persist queue: the inode's content or names changed (value: a
                            token; the persister removes the key only if it is unchanged)
``R<ino>``                  :class:`ColdRecord`: what cold holds (kept past inode deletion)
``S<ino>``                  import stamp of a directory: when cold was last listed (ns)
``Y<prefix>``               :class:`PlacementPolicy`
``U<uid>``                  memory-pool quota of a tenant (u64 bytes)
``W<ino>``                  small-write log: version and bytes of a small PUT's data file
``G<ino>``                  garbage: the inode's data file is unreachable (written in the
                            transaction that dropped the inode); removed once that
                            transaction is durable, or at the next start
``V<ino>``                  in-place write intention: the data file may differ from the
                            recorded version (a durable ``V`` at start bumps the version)
``Z<cold key head>``        pending delete of a cold object (the key's first 400 bytes, plus a
                            digest when longer; value: u64 inode, token, the key), managed by
                            :mod:`tierd.placement.intents` through ``MetaTxn.kv``
``A<node name>``            node registry: msgpack [peer_url, heartbeat_ns, started_ns], managed by
                            :mod:`tierd.peer.registry` through ``MetaTxn.kv``
==========================  ===================================================
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import msgpack

from tierd.meta import nodes
from tierd.meta.atxn import AsyncTxn
from tierd.meta.kv import KVStore, KVTxn, prefix_end
from tierd.meta.records import (
    AccessKey,
    Bucket,
    ColdRecord,
    Dirent,
    Inode,
    PlacementPolicy,
    User,
)
from tierd.meta.uploads import UploadRecords

SYNC_MODES = ("group", "commit", "durability-points")

SCHEMA_VERSION = 1
ROOT_INO = 1
S_IFDIR = 0o040000

_U64 = struct.Struct(">Q")
#: the counters' keys (``C<name>``): every create writes several of them, so over
#: PostgreSQL a writer's begin fetches those another node changed (PgStore's ``hot``)
COUNTER_KEYS = tuple(b"C" + n for n in (b"next_ino", b"next_version", b"inodes", b"bytes"))
_SCHEMA_KEY = b"\x00schema"
_LINKS_KEY = b"\x00links"  # present once every dirent has its reverse-index key


def _u64(n: int) -> bytes:
    return _U64.pack(n)


def sort_name(name: bytes, is_dir: bool) -> bytes:
    """The dirent key suffix: directories carry a trailing slash (see the module doc)."""
    return name + b"/" if is_dir else name


class SchemaError(RuntimeError):
    """The store was written by an incompatible tierd version."""


class MetaTxn(UploadRecords):
    """Typed access to one engine transaction.  Never hold one across an ``await``."""

    def __init__(self, txn: KVTxn, node: str = "") -> None:
        self.kv = txn
        self.write = txn.write
        self.node = node  # this node's name in a cluster ("": one node; meta.nodes)
        self._after: list[Callable[[], None]] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def after_commit(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once this transaction committed (never when it aborts).  For work
        that must see the commit: over PostgreSQL other coroutines run while a commit is
        in flight, so a callback scheduled from the body could run before it lands."""
        if self._after is None:
            self._after = []
        self._after.append(fn)

    def committed(self) -> None:
        """The commit landed: run the :meth:`after_commit` callbacks."""
        after, self._after = self._after, None
        for fn in after or ():
            fn()

    def commit(self) -> None:
        self.kv.commit()
        self.committed()

    def abort(self) -> None:
        self.kv.abort()

    def __enter__(self) -> MetaTxn:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.kv.abort()

    # -- counters --------------------------------------------------------------------------
    def counter(self, name: str) -> int:
        raw = self.kv.get(b"C" + name.encode())
        return 0 if raw is None else int(_U64.unpack(raw)[0])

    def add_counter(self, name: str, delta: int) -> int:
        value = max(0, self.counter(name) + delta)
        self.kv.put(b"C" + name.encode(), _u64(value))
        return value

    def next_ino(self) -> int:
        return self.add_counter("next_ino", 1)

    def reserve_inos(self, n: int) -> range:
        """``n`` inode numbers the counter moves past: nothing else is handed them."""
        last = self.add_counter("next_ino", n)
        return range(last - n + 1, last + 1)

    def next_version(self) -> int:
        return self.add_counter("next_version", 1)

    # -- inodes ----------------------------------------------------------------------------
    def get_inode(self, ino: int) -> Inode | None:
        """The inode as this node sees it (its own residency: :mod:`tierd.meta.nodes`)."""
        raw = self.kv.get(b"I" + _u64(ino))
        return None if raw is None else nodes.local_view(Inode.decode(raw), self.node)

    def prefetch_inodes(self, inos: list[int], cold: bool = False) -> None:
        """The inodes ``inos`` (with ``cold``, their cold records) will be read next: over
        PostgreSQL one query for all the node's cache lacks, instead of a round trip each
        (``KVTxn.prefetch``)."""
        self.kv.prefetch([(b"R" if cold else b"I") + _u64(ino) for ino in inos])

    def get_stored_inode(self, ino: int) -> Inode | None:
        """The inode as stored, with every node's residency (one node: :meth:`get_inode`)."""
        raw = self.kv.get(b"I" + _u64(ino))
        return None if raw is None else Inode.decode(raw)

    def put_inode(self, inode: Inode) -> None:
        """Store ``inode``; keeps the inode and byte counters of the status page exact."""
        key = b"I" + _u64(inode.ino)
        old = self.kv.get(key)
        prev = None if old is None else Inode.decode(old)
        if prev is None:
            self.add_counter("inodes", 1)
            old_size = 0
        else:
            old_size = prev.size if prev.is_reg else 0
        new_size = inode.size if inode.is_reg else 0
        if new_size != old_size:
            self.add_counter("bytes", new_size - old_size)
        self.kv.put(key, nodes.stored_form(inode, prev, self.node).encode())

    def delete_inode(self, ino: int) -> None:
        key = b"I" + _u64(ino)
        old = self.kv.get(key)
        if old is None:
            return
        prev = Inode.decode(old)
        self.add_counter("inodes", -1)
        for other in nodes.holders(prev) - {self.node}:
            # another node may hold a data file of it: that node reclaims it (its G key)
            self.kv.put(nodes.scoped_key(b"G", other, ino), b"")
        if prev.is_reg and prev.size:
            self.add_counter("bytes", -prev.size)
        self.kv.delete(key)
        for name, _ in list(self.list_xattrs(ino)):
            self.kv.delete(b"X" + _u64(ino) + name)
        self.kv.delete(self._scoped(b"O", ino))
        self.kv.delete(self._scoped(b"V", ino))  # this node's intention (add_intent's key)

    def iter_inodes(self) -> Iterator[Inode]:
        for _, raw in self.kv.scan(b"I", prefix_end(b"I")):
            if self.node:
                yield nodes.local_view(Inode.decode(raw), self.node)
                continue
            yield Inode.decode(raw)

    # -- directory entries -----------------------------------------------------------------
    def new_inode(self, ino: int, is_dir: bool) -> None:
        """``ino`` is an inode this transaction creates (its number was never used): it has
        no extended attributes, cold record, intention or open mark and, a directory, no
        entries but those this transaction writes (a hint for the engine's read cache,
        :meth:`KVTxn.empty_prefix`), and no record or queue mark yet
        (:meth:`KVTxn.absent`: over PostgreSQL, ``put_inode`` and the persister's queue
        learn so without a round trip)."""
        self.kv.absent(b"I" + _u64(ino))
        self.kv.absent(b"Q" + _u64(ino))
        self.kv.empty_prefix(b"X" + _u64(ino))
        # nor a cold record, an intention or an open mark: the rename, unlink or first
        # write that looks for them later costs no round trip either
        for key in (b"R" + _u64(ino), self._scoped(b"V", ino), self._scoped(b"O", ino)):
            self.kv.empty_prefix(key)
        if is_dir:
            self.kv.empty_prefix(b"D" + _u64(ino))

    def lookup(self, parent: int, name: bytes) -> Dirent | None:
        """The entry called ``name`` in ``parent``, whatever its type."""
        base = b"D" + _u64(parent) + name
        raw = self.kv.get(base)
        if raw is None:
            raw = self.kv.get(base + b"/")
        return None if raw is None else Dirent.decode(raw)

    def add_dirent(self, parent: int, name: bytes, dirent: Dirent) -> None:
        key = b"D" + _u64(parent) + sort_name(name, dirent.kind == S_IFDIR)
        self.kv.put(key, dirent.encode())
        self.kv.put(b"L" + _u64(dirent.ino) + _u64(parent) + name, b"")

    def remove_dirent(self, parent: int, name: bytes) -> bool:
        base = b"D" + _u64(parent) + name
        for key in (base, base + b"/"):
            raw = self.kv.get(key)
            if raw is not None:
                self.kv.delete(key)
                self.kv.delete(b"L" + _u64(Dirent.decode(raw).ino) + _u64(parent) + name)
                return True
        return False

    def links(self, ino: int) -> list[tuple[int, bytes]]:
        """Every (parent, name) naming ``ino`` (the reverse index: hard links are several)."""
        prefix = b"L" + _u64(ino)
        return [(int(_U64.unpack(k[9:17])[0]), k[17:])
                for k, _ in self.kv.scan(prefix, prefix_end(prefix))]

    def rebuild_links(self) -> int:
        """Create the reverse index of a store written before it existed; returns entries."""
        n = 0
        for key, raw in list(self.kv.scan(b"D", prefix_end(b"D"))):
            skey = key[9:]
            name = skey[:-1] if skey.endswith(b"/") else skey
            self.kv.put(b"L" + _u64(Dirent.decode(raw).ino) + key[1:9] + name, b"")
            n += 1
        self.kv.put(_LINKS_KEY, b"")
        return n

    def list_dirents(
        self,
        parent: int,
        start_after: bytes = b"",
        end: bytes | None = None,
        *,
        start: bytes = b"",
    ) -> Iterator[tuple[bytes, bytes, Dirent]]:
        """(name, sort key, entry) in S3 key order, strictly after the sort key
        ``start_after``, at or after ``start``, and before ``end`` when given.  Lazy: stop
        iterating when done."""
        prefix = b"D" + _u64(parent)
        first = start_after + b"\x00" if start_after else b""
        start = prefix + max(first, start)
        stop = prefix_end(prefix) if end is None else prefix + end
        for key, raw in self.kv.scan(start, stop):
            skey = key[len(prefix) :]
            name = skey[:-1] if skey.endswith(b"/") else skey
            yield name, skey, Dirent.decode(raw)

    def has_any_dirent(self) -> bool:
        return any(True for _ in self.kv.scan(b"D", prefix_end(b"D")))

    def has_children(self, parent: int) -> bool:
        for _ in self.list_dirents(parent):
            return True
        return False

    # -- xattrs ----------------------------------------------------------------------------
    def get_xattr(self, ino: int, name: bytes) -> bytes | None:
        return self.kv.get(b"X" + _u64(ino) + name)

    def set_xattr(self, ino: int, name: bytes, value: bytes) -> None:
        self.kv.put(b"X" + _u64(ino) + name, value)

    def remove_xattr(self, ino: int, name: bytes) -> bool:
        return self.kv.delete(b"X" + _u64(ino) + name)

    def list_xattrs(self, ino: int) -> Iterator[tuple[bytes, bytes]]:
        prefix = b"X" + _u64(ino)
        for key, value in self.kv.scan(prefix, prefix_end(prefix)):
            yield key[len(prefix) :], value

    # -- buckets, keys, multipart uploads, orphans -----------------------------------------
    def get_bucket(self, name: str) -> Bucket | None:
        # surrogateescape: names from a door may carry undecodable bytes (no such bucket)
        raw = self.kv.get(b"B" + name.encode("utf-8", "surrogateescape"))
        return None if raw is None else Bucket.decode(raw)

    def put_bucket(self, bucket: Bucket) -> None:
        self.kv.put(b"B" + bucket.name.encode(), bucket.encode())

    def delete_bucket(self, name: str) -> bool:
        return self.kv.delete(b"B" + name.encode())

    def list_buckets(self) -> Iterator[Bucket]:
        for _, raw in self.kv.scan(b"B", prefix_end(b"B")):
            yield Bucket.decode(raw)

    def get_access_key(self, access_key: str) -> AccessKey | None:
        raw = self.kv.get(b"K" + access_key.encode())
        return None if raw is None else AccessKey.decode(raw)

    def put_access_key(self, key: AccessKey) -> None:
        self.kv.put(b"K" + key.access_key.encode(), key.encode())

    def delete_access_key(self, access_key: str) -> bool:
        return self.kv.delete(b"K" + access_key.encode())

    def list_access_keys(self) -> Iterator[AccessKey]:
        for _, raw in self.kv.scan(b"K", prefix_end(b"K")):
            yield AccessKey.decode(raw)

    def get_user(self, name: str) -> User | None:
        raw = self.kv.get(b"N" + name.encode())
        return None if raw is None else User.decode(raw)

    def put_user(self, user: User) -> None:
        self.kv.put(b"N" + user.name.encode(), user.encode())

    def delete_user(self, name: str) -> bool:
        return self.kv.delete(b"N" + name.encode())

    def list_users(self) -> Iterator[User]:
        for _, raw in self.kv.scan(b"N", prefix_end(b"N")):
            yield User.decode(raw)

    def _scoped(self, kind: bytes, ino: int) -> bytes:
        """The key of this node's ``kind`` record of ``ino`` (:mod:`tierd.meta.nodes`)."""
        return nodes.scoped_key(kind, self.node, ino)

    def _list_scoped(self, kind: bytes) -> list[int]:
        prefix = nodes.scoped_prefix(kind, self.node)
        return [nodes.scoped_ino(k, prefix) for k, _ in self.kv.scan(prefix, prefix_end(prefix))
                if len(k) == len(prefix) + 8]

    def add_orphan(self, ino: int) -> None:
        self.kv.put(self._scoped(b"O", ino), b"")

    def remove_orphan(self, ino: int) -> None:
        self.kv.delete(self._scoped(b"O", ino))

    def list_orphans(self) -> list[int]:
        return self._list_scoped(b"O")

    # -- small-write log: data of small files not yet known durable in their data file ----
    def put_logged(self, ino: int, version: int, data: bytes) -> None:
        """Log ``data`` as content ``version`` of ``ino`` (namespace: small PUTs)."""
        self.kv.put(self._scoped(b"W", ino), _u64(version) + data)

    def delete_logged(self, ino: int) -> None:
        self.kv.delete(self._scoped(b"W", ino))

    def list_logged(self) -> Iterator[tuple[int, int, bytes]]:
        """(ino, version, data) of every file this node logged, in inode order."""
        prefix = nodes.scoped_prefix(b"W", self.node)
        for k, v in self.kv.scan(prefix, prefix_end(prefix)):
            if len(k) == len(prefix) + 8:
                yield nodes.scoped_ino(k, prefix), int(_U64.unpack(v[:8])[0]), bytes(v[8:])

    # -- crash safety of data files (docs/durability.md) ------------------------------------
    def add_garbage(self, ino: int) -> None:
        """``ino``'s data file is unreachable once this transaction commits; its space is
        reclaimed after the commit is durable (a crash before that rolls the drop back, and
        the bytes must still be there)."""
        self.kv.put(self._scoped(b"G", ino), b"")

    def remove_garbage(self, ino: int) -> None:
        self.kv.delete(self._scoped(b"G", ino))

    def list_garbage(self) -> list[int]:
        return self._list_scoped(b"G")

    def add_intent(self, ino: int, kernel: bool = False) -> None:
        """``ino``'s data file is about to change in place: until :meth:`remove_intent`
        (in the commit that records the change) its bytes may differ from the recorded
        version, and recovery gives it a new one.  ``kernel``: the kernel writes it
        (FUSE write passthrough), so recovery also gives it a new data file."""
        self.kv.put(self._scoped(b"V", ino), b"k" if kernel else b"")

    def remove_intent(self, ino: int) -> bool:
        return self.kv.delete(self._scoped(b"V", ino))

    def has_intent(self, ino: int) -> bool:
        return self.kv.get(self._scoped(b"V", ino)) is not None

    def list_intents(self, kernel: bool = False) -> list[int]:
        """The inodes with an intention (``kernel``: only those the kernel wrote)."""
        prefix = nodes.scoped_prefix(b"V", self.node)
        return [nodes.scoped_ino(k, prefix) for k, v in self.kv.scan(prefix, prefix_end(prefix))
                if len(k) == len(prefix) + 8 and (v == b"k" or not kernel)]

    # -- placement: persist queue, cold records, import stamps, policies -------------------
    def enqueue(self, ino: int, token: bytes) -> None:
        self.kv.put(b"Q" + _u64(ino), token)

    def queued(self, ino: int) -> bytes | None:
        return self.kv.get(b"Q" + _u64(ino))

    def dequeue(self, ino: int) -> None:
        self.kv.delete(b"Q" + _u64(ino))

    def list_queue(self) -> list[int]:
        return list(self.iter_queue())

    def iter_queue(self) -> Iterator[int]:
        """The queued inodes, read lazily: ``persist --wait`` asks after every persisted
        file whether any is left, and stops at the first."""
        for k, _ in self.kv.scan(b"Q", prefix_end(b"Q")):
            yield int(_U64.unpack(k[1:])[0])

    def get_cold(self, ino: int) -> ColdRecord | None:
        raw = self.kv.get(b"R" + _u64(ino))
        return None if raw is None else ColdRecord.decode(raw)

    def put_cold(self, ino: int, rec: ColdRecord) -> None:
        self.kv.put(b"R" + _u64(ino), rec.encode())

    def delete_cold(self, ino: int) -> None:
        self.kv.delete(b"R" + _u64(ino))

    def get_stamp(self, ino: int) -> int:
        raw = self.kv.get(b"S" + _u64(ino))
        return 0 if raw is None else int(_U64.unpack(raw)[0])

    def set_stamp(self, ino: int, ns: int) -> None:
        self.kv.put(b"S" + _u64(ino), _u64(ns))

    def get_policy(self, prefix: str) -> PlacementPolicy | None:
        raw = self.kv.get(b"Y" + prefix.encode())
        return None if raw is None else PlacementPolicy.decode(raw)

    def put_policy(self, policy: PlacementPolicy) -> None:
        self.kv.put(b"Y" + policy.prefix.encode(), policy.encode())

    def delete_policy(self, prefix: str) -> bool:
        return self.kv.delete(b"Y" + prefix.encode())

    def list_policies(self) -> list[PlacementPolicy]:
        return [PlacementPolicy.decode(v) for _, v in self.kv.scan(b"Y", prefix_end(b"Y"))]

    def get_pool_quota(self, tenant: int) -> int | None:
        raw = self.kv.get(b"U" + _u64(tenant))
        return None if raw is None else int(_U64.unpack(raw)[0])

    def put_pool_quota(self, tenant: int, nbytes: int) -> None:
        self.kv.put(b"U" + _u64(tenant), _u64(nbytes))

    def delete_pool_quota(self, tenant: int) -> bool:
        return self.kv.delete(b"U" + _u64(tenant))

    def list_pool_quotas(self) -> dict[int, int]:
        return {int(_U64.unpack(k[1:])[0]): int(_U64.unpack(v)[0])
                for k, v in self.kv.scan(b"U", prefix_end(b"U"))}


def _check_sync(sync: str) -> None:
    if sync not in SYNC_MODES:
        raise ValueError(f"meta_sync must be one of {', '.join(SYNC_MODES)}, not {sync!r}")


class MetaStore:
    """The metadata of one tierd namespace, over a pluggable engine."""

    def __init__(self, engine: KVStore, node: str = "") -> None:
        self.engine = engine
        #: this node's name in a cluster ("": a single node); its transactions see the
        #: per-node records as this node's (:mod:`tierd.meta.nodes`)
        self.node = node
        self._check_schema()

    @classmethod
    def open_lmdb(cls, path: Path | str, *, sync: str = "group",
                  map_size: int = 0) -> MetaStore:
        """The daemon's store.  ``sync`` is the ``meta_sync`` setting: ``group`` (group
        commit, durable at the durability points: see :mod:`tierd.meta.group_engine`),
        ``commit`` (every transaction fdatasynced before it returns) or
        ``durability-points`` (lmdb without sync: scratch only); ``map_size`` is
        ``meta_map_size`` (0: lmdb_engine's default)."""
        from tierd.meta.lmdb_engine import DEFAULT_MAP_SIZE, LmdbStore

        _check_sync(sync)
        return cls._over(LmdbStore(path, map_size or DEFAULT_MAP_SIZE,
                                   durable=sync != "durability-points",
                                   metasync=sync == "group"), sync)

    @classmethod
    def open_pg(cls, url: str, *, sync: str = "group", node: str = "") -> MetaStore:
        """The store in a PostgreSQL database (``meta_url``, :mod:`tierd.meta.pg_engine`)
        shared by every node that names it; ``node``: this node's name in its change log.
        Never behind group commit, whatever ``sync`` says (only checked): that overlay is
        per process, so two nodes would allocate the same inode numbers from their own
        unflushed counters.  Every transaction is one server transaction, durable when it
        commits."""
        from tierd.meta.pg_engine import PgStore

        _check_sync(sync)
        return cls._over(PgStore(url, node=node, hot=COUNTER_KEYS), "commit")

    @classmethod
    def _over(cls, inner: KVStore, sync: str) -> MetaStore:
        """The store over the engine ``inner`` opened, behind group commit for ``sync =
        group``; the engine is closed again when the store refuses it (SchemaError)."""
        from tierd.meta.group_engine import GroupCommitStore

        engine: KVStore = GroupCommitStore(inner) if sync == "group" else inner
        try:
            return cls(engine)
        except BaseException:  # do not leave the environment or the pool open
            engine.close()
            raise

    @classmethod
    def open_memory(cls) -> MetaStore:
        from tierd.meta.memory_engine import MemoryStore

        return cls(MemoryStore())

    def _check_schema(self) -> None:
        with self.write() as tx:
            raw = tx.kv.get(_SCHEMA_KEY)
            if raw is None:
                tx.kv.put(_SCHEMA_KEY, msgpack.packb(SCHEMA_VERSION))
                return
            found = msgpack.unpackb(raw)
            if found != SCHEMA_VERSION:
                raise SchemaError(
                    f"metadata schema version {found} is not supported "
                    f"(this tierd reads version {SCHEMA_VERSION})"
                )
            if tx.kv.get(_LINKS_KEY) is None and tx.has_any_dirent():
                tx.rebuild_links()  # idempotent: also for stores made before the index

    def schema_version(self) -> int:
        with self.read() as tx:
            raw = tx.kv.get(_SCHEMA_KEY)
        return int(msgpack.unpackb(raw)) if raw is not None else 0

    def read(self) -> MetaTxn:
        return MetaTxn(self.engine.begin(write=False), self.node)

    def write(self) -> MetaTxn:
        return MetaTxn(self.engine.begin(write=True), self.node)

    @contextmanager
    def snapshot(self) -> Iterator[MetaTxn]:
        """A read transaction that is always aborted (reads need no commit)."""
        tx = self.read()
        try:
            yield tx
        finally:
            tx.abort()

    def awrite(self, keys: Iterable[bytes] = (),
               warm: Callable[[MetaTxn], object] | None = None) -> AsyncTxn:
        """``async with meta.awrite() as tx``: :meth:`write` for coroutines, never blocking
        the event loop (:mod:`tierd.meta.atxn`); ``keys`` and ``warm``: what the body will
        read, prefetched off the loop (:mod:`tierd.meta.pg_warm`)."""
        return AsyncTxn(self, True, keys=keys, warm=warm)

    def asnapshot(self, fresh: bool = False, keys: Iterable[bytes] = (),
                  warm: Callable[[MetaTxn], object] | None = None,
                  bounded: bool = False) -> AsyncTxn:
        """``async with meta.asnapshot() as tx``: :meth:`snapshot` for coroutines; ``fresh``:
        after a write commit of this process in flight (:mod:`tierd.meta.pg_async`); ``keys``,
        ``warm``: as for :meth:`awrite`; ``bounded``: see :mod:`tierd.meta.pg_quiet`."""
        return AsyncTxn(self, False, True, fresh, keys, warm, bounded)

    def sync(self) -> None:
        """Make every committed transaction survive a machine crash (blocking)."""
        self.engine.sync()

    async def flush(self, upto: int | None = None, *, urgent: bool = True) -> None:
        """:meth:`sync` for the event loop: the durability point of every door.  ``upto``
        (a :meth:`last_commit`): only the commits up to that one need to be durable (with
        group commit, a wait that adds no flush when they already are).  ``urgent=False``
        (background paths: the persister): with group commit, wait for the next regular
        group flush instead of starting one now."""
        sync_async = getattr(self.engine, "sync_async", None)
        if sync_async is not None:
            await sync_async(upto, urgent=urgent)
        else:
            await asyncio.to_thread(self.engine.sync)

    def last_commit(self) -> int | None:
        """A mark of the commits made so far, for :meth:`flush` (None: the engine has no
        such marks; a flush then covers everything, as without one)."""
        mark: int | None = getattr(self.engine, "last_commit", None)
        return mark

    def close(self) -> None:
        self.engine.close()
