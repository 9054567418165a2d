"""Transparent import: objects in the cold store that tierd does not know appear in the
namespace without a copy -- and objects tierd knows that cold lost.

This is placement's half: listing cold and deciding what may be imported or must be
dropped.  The tree changes in the namespace (:mod:`tierd.namespace.imports`, reached
through :class:`Tree`, which the namespace attaches), inside this module's write
transactions, so a check of pending deletes and the entries it allows commit together.

A directory is refreshed (cold listed with delimiter ``/`` at its prefix) when its import
stamp (``S`` key) is older than ``import_ttl``; missing files become CLEAN inodes with the
object's size, ETag and mtime, no local blocks (an empty ``hot`` bitmap) and a cold record;
missing common prefixes become implicit directories.  Local entries are never replaced: what
tierd wrote wins over what it finds.

**Never resurrect**: a key with a pending delete (``intents``), or one this node deleted
after the listing began (:class:`~tierd.placement.intents.RecentDeletes`), is not imported,
nor a common prefix holding such keys.

**Lost objects** (a clean file the listing no longer has, or a read that got NoSuchKey) are
judged by :func:`lost`: re-uploaded when a complete local copy exists, dropped ("deleted
outside tierd", with the evidence) only when the content exists nowhere local.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from tierd.meta import STATE_CLEAN, STATE_DIRTY, Inode, MetaStore, MetaTxn
from tierd.placement import bitmap, intents
from tierd.placement.intents import RecentDeletes
from tierd.placement.paths import file_keys, files_under, is_version_key, queue_token
from tierd.tiers import ListPage, ObjectInfo, ObjectTier

#: what placement says about an inode: open with unflushed writes / wholly local
Judge = Callable[[Inode], bool]


class Tree(Protocol):
    """What import asks of the namespace (:mod:`tierd.namespace.imports`), inside the
    importer's write transaction: the file tree changes only through the namespace."""

    def import_buckets(self, tx: MetaTxn, names: Iterable[str]) -> int:
        """Buckets for the names the namespace lacks; returns how many were created."""
        ...

    def import_objects(self, tx: MetaTxn, objects: Iterable[tuple[str, ObjectInfo | None]]
                       ) -> int:
        """Entries for cold keys (files, or directories for None); returns the count."""
        ...

    def vanished(self, tx: MetaTxn, ino: int) -> None:
        """File ``ino`` loses its names (and emptied implicit directories): an orphan."""
        ...


def _local_blocks(inode: Inode) -> int:
    hot, warm = inode.blocks.get("hot"), inode.blocks.get("warm", b"")
    blocks = set(bitmap.present(hot, inode.size)) | set(bitmap.present(warm, inode.size))
    return len(blocks)


def _stamp(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))


def lost(tx: MetaTxn, tree: Tree, ino: int, key: str, *, busy: bool, local: Judge,
         evidence: str, listed_after: int | None = None) -> tuple[str, str] | None:
    """File ``ino``'s cold object ``key`` is gone.  Only a file that loses nothing is
    touched: a regular file, CLEAN, not queued, not open with unflushed writes (``busy``),
    whose cold record is its current version under that one key (and, for a listing that
    missed it, recorded before the listing began: ``listed_after``).  Then:

    * with a **complete local copy** (``local``: hot, warm or the memory tier hold every
      block) it is **re-uploaded**: DIRTY, queued, its record's version reset -- a cold store
      that came back empty or lost objects never makes tierd drop its own data;
    * otherwise its content exists nowhere tierd can reach: it was **deleted outside
      tierd**, and is dropped: the namespace removes its names (``tree.vanished``: an
      orphan, reaped at its last release or the next start), its record goes and its
      bitmap is cleared, so a reader still holding it gets ENOENT, never the zeros of a
      punched hole (placement frees the blocks once this commits).

    Returns ``("reupload" | "dropped", evidence)`` or None when nothing was done; the
    evidence (``evidence``: what showed the object gone, plus the record and local blocks)
    is for the log."""
    inode = tx.get_inode(ino)
    rec = tx.get_cold(ino)
    if (inode is None or not inode.is_reg or inode.nlink == 0 or busy
            or inode.state != STATE_CLEAN or tx.queued(ino) is not None or rec is None
            or rec.version != inode.version or list(rec.keys) != [key]):
        return None
    if listed_after is not None and rec.mtime_ns >= listed_after:
        return None
    whole = local(inode)
    why = (f"{evidence}; tierd stored it as version {rec.version} (ETag {rec.keys[key]}, "
           f"{rec.size} bytes) at {_stamp(rec.mtime_ns)}; "
           + (f"a complete local copy exists ({inode.size} bytes)" if whole else
              f"{_local_blocks(inode)} of {bitmap.nblocks(inode.size)} blocks local"))
    if whole:
        inode.state = STATE_DIRTY
        tx.put_inode(inode)
        rec.version = 0  # cold no longer has this version: the persister uploads it
        tx.put_cold(ino, rec)
        tx.enqueue(ino, queue_token(None))
        return "reupload", why
    tree.vanished(tx, ino)
    tx.delete_cold(ino)
    inode = tx.get_inode(ino)
    assert inode is not None
    inode.blocks = {"hot": b""}
    tx.put_inode(inode)
    return "dropped", why


def _lookups(tx: MetaTxn, key: str) -> None:
    """The lookups an import of ``bucket/key`` makes down to the first name missing (where
    it starts writing): a ``warm`` for the import's transaction."""
    bucket, _, rest = key.partition("/")
    b = tx.get_bucket(bucket)
    ino = b.ino if b is not None else 0
    for name in rest.split("/") if ino else ():
        ent = tx.lookup(ino, name.encode("utf-8", "surrogateescape")) if name else None
        if ent is None:
            return
        ino = ent.ino
        tx.get_inode(ino)


class Importer:
    """Imports what cold has and judges what it lost (see the module docstring).

    ``busy(ino)`` (open with unflushed writes) and ``local(inode)`` (a complete local copy)
    are placement's; ``recent`` is the delete worker's record of keys it deleted."""

    def __init__(self, meta: MetaStore, cold: ObjectTier, ttl: float, *,
                 busy: Callable[[int], bool], local: Judge, recent: RecentDeletes) -> None:
        self.meta, self.cold, self.ttl = meta, cold, ttl
        self.busy, self.local, self.recent = busy, local, recent
        self._tree: Tree | None = None  # the namespace (attach)
        # (inode, evidence) judged lost, for placement to forget (dropped) or count dirty
        # and log (re-uploaded)
        self.dropped: list[tuple[int, str]] = []
        self.reuploaded: list[tuple[int, str]] = []
        #: directory -> when this node last stamped it (ns): a look-up within the TTL
        #: needs no transaction to learn it is fresh (the stamp only grows)
        self._stamped: dict[int, int] = {}

    def attach(self, tree: Tree) -> None:
        """The namespace that imported entries go into (it calls this when it loads)."""
        self._tree = tree

    @property
    def tree(self) -> Tree:
        if self._tree is None:
            raise RuntimeError("import needs the namespace: none is attached")
        return self._tree

    async def import_buckets(self) -> int:
        """Create buckets for top-level prefixes of the cold store (at start); a prefix
        whose keys are all pending deletes (a bucket removed here) is not one."""
        n, after = 0, ""
        while True:
            page = await self.cold.list("", start_after=after, delimiter="/")
            stale = set()
            for cp in page.common_prefixes:
                async with self.meta.asnapshot() as tx:
                    pending = intents.pending_under(tx, cp)
                if pending and not await self._live_key_under(cp):
                    stale.add(cp)
            async with self.meta.awrite() as tx:
                n += self.tree.import_buckets(
                    tx, [cp.rstrip("/") for cp in page.common_prefixes if cp not in stale])
            if not page.truncated:
                return n
            after = page.next_start_after

    async def _live_key_under(self, prefix: str) -> bool:
        """Whether cold has a key under ``prefix`` that is not pending delete."""
        after = ""
        while True:
            page = await self.cold.list(prefix, start_after=after)
            async with self.meta.asnapshot() as tx:
                if any(not intents.pending(tx, o.key) for o in page.objects):
                    return True
            if not page.truncated:
                return False
            after = page.next_start_after

    async def stale(self, dir_ino: int) -> bool:
        """Whether the directory's last look at cold is older than the TTL (this node's
        own looks are remembered: no read for them)."""
        if self.ttl <= 0:
            return True  # (no stamp is ever fresh: no read needed to learn it)
        now = time.time_ns()
        if now - self._stamped.get(dir_ino, 0) <= self.ttl * 1e9:
            return False
        async with self.meta.asnapshot(warm=lambda tx: tx.get_stamp(dir_ino)) as tx:
            return now - tx.get_stamp(dir_ino) > self.ttl * 1e9

    def _wanted(self, tx: MetaTxn, key: str, started: int) -> bool:
        """Not a key this node is deleting or deleted since the listing began, nor a
        noncurrent version's object (those are records, :mod:`tierd.namespace.versions`)."""
        return not (is_version_key(key) or intents.pending(tx, key)
                    or self.recent.deleted_since(key, started))

    def _wanted_entries(self, tx: MetaTxn, page: ListPage, started: int
                        ) -> list[tuple[str, ObjectInfo | None]]:
        """What of a listing's page to import: its wanted objects, and its wanted common
        prefixes as directories (None)."""
        found: list[tuple[str, ObjectInfo | None]] = [
            (o.key, o) for o in page.objects if self._wanted(tx, o.key, started)]
        found.extend((cp.rstrip("/"), None) for cp in page.common_prefixes
                     if self._wanted_prefix(tx, cp, started))
        return found

    def _import_reads(self, tx: MetaTxn, page: ListPage, started: int) -> None:
        """The reads of the import of ``page`` (a ``warm``: off the loop, pg_warm)."""
        for key, _ in self._wanted_entries(tx, page, started):
            _lookups(tx, key)

    def _wanted_prefix(self, tx: MetaTxn, cp: str, started: int) -> bool:
        return not (is_version_key(cp + "x") or intents.pending_under(tx, cp)
                    or self.recent.any_since_under(cp, started))

    def _judge(self, tx: MetaTxn, ino: int, key: str, evidence: str,
               listed_after: int | None) -> None:
        inode = tx.get_inode(ino)
        busy = inode is not None and (self.busy(ino) or self._others(inode))
        got = lost(tx, self.tree, ino, key, busy=busy, local=self.local, evidence=evidence,
                   listed_after=listed_after)
        if got is not None:
            (self.dropped if got[0] == "dropped" else self.reuploaded).append((ino, got[1]))

    async def refresh_dir(self, dir_ino: int, path: str) -> int:
        """List ``path/`` in cold (one level) and add what is missing; clean files the
        listing no longer has are judged lost (:func:`lost`).  Returns entries added."""
        n, after, prefix = 0, "", path + "/"
        started = time.time_ns()
        listed: set[bytes] = set()
        with self.recent.listing() as mono:
            while True:
                page = await self.cold.list(prefix, start_after=after, delimiter="/")
                if not after and self._idle(page) and await self._nothing_unlisted(
                        dir_ino, listed):
                    return 0
                listed.update(o.key[len(prefix):].encode("utf-8", "surrogateescape")
                              for o in page.objects)

                def reads(tx: MetaTxn, page: ListPage = page) -> None:
                    self._import_reads(tx, page, mono)
                    if not page.truncated:
                        self._unlisted(tx, dir_ino, listed)
                async with self.meta.awrite(warm=reads) as tx:
                    n += self.tree.import_objects(tx, self._wanted_entries(tx, page, mono))
                    if not page.truncated:
                        self._judge_unlisted(tx, dir_ino, prefix, listed, started)
                        stamp = time.time_ns()
                        tx.set_stamp(dir_ino, stamp)
                if not page.truncated:  # (committed)
                    if len(self._stamped) >= 10_000:
                        self._stamped.clear()
                    self._stamped[dir_ino] = stamp
                    return n
                after = page.next_start_after

    def _idle(self, page: ListPage) -> bool:
        """With an ``import_ttl`` of 0 (every look-up of a missing name lists cold), whether
        this listing -- the directory's whole one, and empty -- has nothing to import, so
        that the refresh needs no write transaction: it would only have stamped the
        directory (a stamp is never fresh at TTL 0) and judged unlisted files, which
        :meth:`_nothing_unlisted` rules out first.  A write transaction for each such
        look-up took the cluster's writer lock and a commit for every new name made
        through FUSE."""
        return (self.ttl <= 0 and not page.truncated and not page.objects
                and not page.common_prefixes)

    async def _nothing_unlisted(self, dir_ino: int, listed: set[bytes]) -> bool:
        """Whether no file of the directory would be judged lost by this listing
        (:meth:`_unlisted`), read in a snapshot: then nothing is, and nothing is written."""
        async with self.meta.asnapshot(
                warm=lambda tx: self._unlisted(tx, dir_ino, listed)) as tx:
            return not self._unlisted(tx, dir_ino, listed)

    @staticmethod
    def _unlisted(tx: MetaTxn, dir_ino: int, listed: set[bytes]) -> list[tuple[bytes, int]]:
        """The directory's files the listing lacks that :func:`lost` may judge."""
        gone = []
        for name, _, ent in tx.list_dirents(dir_ino):
            # a queued file (new or changed, not yet persisted: most of a directory being
            # written) is never judged lost (:func:`lost`); asking costs a key lookup, not
            # the records' decoding, on every refresh of a large directory
            if (stat.S_ISREG(ent.kind) and name not in listed
                    and tx.queued(ent.ino) is None):
                gone.append((name, ent.ino))
        return gone

    def _judge_unlisted(self, tx: MetaTxn, dir_ino: int, prefix: str, listed: set[bytes],
                        started: int) -> None:
        for name, ino in self._unlisted(tx, dir_ino, listed):
            key = prefix + name.decode("utf-8", "surrogateescape")
            self._judge(tx, ino, key, f"the cold store's listing of {prefix!r} begun at "
                        f"{_stamp(started)} lacks {key!r}", started)

    async def import_prefix(self, prefix: str) -> int:
        """Everything under ``bucket/prefix`` (recursive), eagerly; clean files under the
        prefix that the listing no longer has are judged lost (see :meth:`refresh_dir`)."""
        n, after = 0, ""
        started = time.time_ns()
        listed: set[str] = set()
        with self.recent.listing() as mono:
            while True:
                page = await self.cold.list(prefix, start_after=after)
                listed.update(o.key for o in page.objects)

                def reads(tx: MetaTxn, page: ListPage = page) -> None:
                    self._import_reads(tx, page, mono)
                async with self.meta.awrite(warm=reads) as tx:
                    n += self.tree.import_objects(tx, self._wanted_entries(tx, page, mono))
                if not page.truncated:
                    if "/" in prefix:  # a bucket's subtree, walked only
                        await self._judge_missing(prefix, listed, started)
                    return n
                after = page.next_start_after

    async def _judge_missing(self, prefix: str, listed: set[str], started: int) -> None:
        """Judge the files under ``prefix`` whose one key the whole listing lacked.  The
        walk is a snapshot of its own, after the import committed (a file imported is
        listed), its reads made off the loop over PostgreSQL (``warm``; inside the
        import's write transaction they were a query each on the loop, with the cluster's
        writer lock held); only the files it finds -- usually none -- are judged, in a
        write transaction that looks at their keys again."""
        def walk(tx: MetaTxn) -> list[tuple[int, str]]:
            out = []
            for f in list(files_under(tx, prefix)):
                if tx.queued(f.ino) is not None:
                    continue  # never judged lost (:func:`lost`): most files being written
                keys = file_keys(tx, f.ino)
                if len(keys) == 1 and keys[0] not in listed:
                    out.append((f.ino, keys[0]))
            return out
        async with self.meta.asnapshot(fresh=True, warm=walk) as tx:
            missing = walk(tx)
        if not missing:
            return
        async with self.meta.awrite(warm=lambda tx: [file_keys(tx, i) for i, _ in missing]) \
                as tx:
            for ino, key in missing:
                if file_keys(tx, ino) == [key]:
                    self._judge(tx, ino, key, f"the cold store's listing of {prefix!r} "
                                f"begun at {_stamp(started)} lacks {key!r}", started)

    def _others(self, inode: Inode) -> bool:
        """On a cluster, whether another node persists this file: only that node changes
        its cold objects, so only it may judge one missing (here it may be mid-upload)."""
        node = self.meta.node
        return bool(node) and inode.home not in ("", node)

    async def judge_read_miss(self, ino: int, key: str) -> tuple[str, str] | None:
        """A read of ``ino`` got NoSuchKey for ``key``: judge it lost (:func:`lost`).  An
        open that could start using the file waits for this commit (``MetaStore.awrite``
        marks it in flight), as it would for a synchronous one."""
        async with self.meta.awrite() as tx:
            inode = tx.get_inode(ino)
            return lost(tx, self.tree, ino, key,
                        busy=inode is not None and (self.busy(ino) or self._others(inode)),
                        local=self.local, evidence=f"a read of {key!r} got NoSuchKey")
