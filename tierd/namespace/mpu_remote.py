"""Multipart uploads on a cluster: parts on the hot tiers of several nodes.

Behind a load balancer the requests of one multipart upload reach every node of a cluster
(docs/cluster.md), so any node takes any part: a part is written to the hot tier of the node
that received it (its upload directory there, laid out by :mod:`tierd.namespace.mpu_parts`)
and its record names that node (:attr:`UploadPart.node`; ``""`` names the upload's own
node, as every part was before).  Records stay the one truth of which part files must exist.

* **Complete** on node C assembles the object in C's staging: C's own parts are copied in
  the kernel, the others are streamed from their holders' peer doors (``GET
  /v1/part/<upload>/<n>``: :mod:`tierd.peer.server`), each part's bytes hashed on the way
  and compared with the MD5 and size of the record Complete chose.  A holder that is down
  fails the Complete with ServiceUnavailable naming the node, before anything is
  committed: the upload is untouched and completes once the node is back.  Bytes that do
  not match their record (a re-upload raced the Complete) fail it the same way, never
  making a wrong object.  From the fsynced staging file on, Complete is what it is on one
  node: one transaction installs the object and deletes the upload and its records.
* **Reclaiming**: the node that completes, aborts or replaces a part removes its own files
  at once, as on one node.  Every other node reconciles its upload directories with the
  records when the change feed (:func:`tierd.cluster.follow_cluster`) reports a commit of
  an upload or part record (``M``/``P`` keys), or "everything" after a gap, and again at
  start (:meth:`PartStore.recover`): a directory of an upload that no longer exists goes,
  and so does a part file no record of this node names and no upload here is writing.
  Why the records and the feed rather than per-node ``G``-style marks: the records
  already say exactly which files must exist, so a reconcile needs no new key kind,
  cannot lose a mark, and leaves nothing in the database for a node that never returns.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from tierd.errors import FsError, Reason
from tierd.meta import MetaStore, MultipartUpload, UploadPart
from tierd.namespace.mpu_parts import BATCH, DATA, PartStore, md5
from tierd.peer.server import FileSlice
from tierd.tiers.fileio import copy_range, pwritev_all

log = logging.getLogger("tierd.namespace")

#: remote parts fetched at once by one Complete
FETCH_PARALLEL = 4


class PartFetcher(Protocol):
    """Streams a part another node holds (:class:`tierd.peer.client.PeerClient`)."""

    async def stream_part(self, home: str, upload_id: str, number: int, etag: str,
                          size: int, sink: Callable[[bytes], Awaitable[None]]) -> int:
        """Hand the part's bytes to ``sink`` in order; returns how many.  FsError EIO
        (ServiceUnavailable) naming ``home`` when it cannot answer, ESTALE when it does not
        hold that part (any more)."""
        ...


def holder(up: MultipartUpload, part: UploadPart) -> str:
    """The node whose hot tier holds ``part``'s bytes."""
    return part.node or up.node


def local_parts(up: MultipartUpload | None, parts: Iterable[UploadPart],
                node: str) -> list[UploadPart]:
    """The parts of ``up`` held by ``node`` (none when the upload is gone)."""
    if up is None:
        return []
    return [p for p in parts if holder(up, p) == node]


def part_slice(meta: MetaStore, store: PartStore, upload_id: str, number: int, etag: str,
               size: int) -> FileSlice | None:
    """The peer door's answer for one part held here (blocking): its bytes as an open
    file slice if this node's current record of part ``number`` is this ``etag`` and
    ``size``, else None (another upload of it replaced it, or the upload ended)."""
    with meta.snapshot() as tx:
        up = tx.get_upload(upload_id)
        part = tx.get_part(upload_id, number) if up is not None else None
    if (up is None or part is None or holder(up, part) != meta.node or part.etag != etag
            or part.size != size):
        return None
    path, offset = store.location(upload_id, part)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    if os.fstat(fd).st_size < offset + size:  # (the answer is cut, never other bytes)
        os.close(fd)
        return None
    return FileSlice(fd, offset, size)


class _Writer:
    """One remote part streamed into the staging file at ``offset``: batches written and
    hashed in a thread while the next one arrives."""

    def __init__(self, fd: int, offset: int) -> None:
        self.fd, self.pos = fd, offset
        self.md5 = md5()
        self.batch: list[bytes] = []
        self.blen = 0
        self.job: asyncio.Future[None] | None = None

    def _write(self, bufs: list[bytes], at: int) -> None:
        pwritev_all(self.fd, bufs, at)
        for b in bufs:
            self.md5.update(b)

    async def _flush(self) -> None:
        if self.job is not None:  # (shielded: a cancel must not orphan the thread's job)
            await asyncio.shield(self.job)
            self.job = None
        if self.batch:
            bufs, at = self.batch, self.pos
            self.pos += self.blen
            self.batch, self.blen = [], 0
            self.job = asyncio.ensure_future(asyncio.to_thread(self._write, bufs, at))

    async def take(self, chunk: bytes) -> None:
        self.batch.append(chunk)
        self.blen += len(chunk)
        if self.blen >= BATCH:
            await self._flush()

    async def done(self) -> str:
        await self._flush()
        await self._flush()  # the last batch's job
        return self.md5.hexdigest()

    async def settle(self) -> None:
        """A failed fetch: wait for a job still in its thread (the caller closes the
        descriptor next, and a write must never land in a file that reused it)."""
        job, self.job = self.job, None
        if job is not None:
            await asyncio.wait([job])
            if not job.cancelled():
                job.exception()  # retrieved: the fetch's own error is the one raised


async def _fetch(peer: PartFetcher | None, up: MultipartUpload, part: UploadPart, fd: int,
                 offset: int) -> None:
    home = holder(up, part)
    if peer is None:
        raise FsError(errno.EIO, f"part {part.number} of upload {up.upload_id!r} is on "
                      f"node {home!r}, and this node has no peer door",
                      reason=Reason.SERVICE_UNAVAILABLE)
    w = _Writer(fd, offset)
    try:
        got = await peer.stream_part(home, up.upload_id, part.number, part.etag, part.size,
                                     w.take)
        digest = await w.done()
    except FsError as e:
        await w.settle()
        if e.errno == errno.ESTALE:
            raise FsError(errno.EINVAL, f"part {part.number} was uploaded again while the "
                          f"upload completed (node {home!r} no longer holds the one listed)"
                          f": list the parts and complete again",
                          reason=Reason.INVALID_PART) from e
        raise
    except BaseException:
        await w.settle()
        raise
    if got != part.size or digest != part.etag:
        raise FsError(errno.EIO, f"part {part.number} as node {home!r} sent it ({got} bytes, "
                      f"MD5 {digest}) is not the part listed ({part.size} bytes, MD5 "
                      f"{part.etag}): it changed meanwhile; complete again",
                      reason=Reason.SERVICE_UNAVAILABLE)


async def fill_spread(store: PartStore, peer: PartFetcher | None, node: str,
                      up: MultipartUpload, chosen: list[UploadPart], fd: int) -> int:
    """Write ``chosen`` (in order) into ``fd``: this node's parts copied in the kernel,
    the others fetched from their holders (:data:`FETCH_PARALLEL` at a time) and checked
    against their records.  Returns the size written; raises before returning when any
    part is missing or wrong (the caller drops the staging file)."""
    offsets: list[int] = []
    pos = 0
    for p in chosen:
        offsets.append(pos)
        pos += p.size
    mine = [(p, off) for p, off in zip(chosen, offsets, strict=True) if holder(up, p) == node]
    others = [(p, off) for p, off in zip(chosen, offsets, strict=True)
              if holder(up, p) != node]

    def copy_mine() -> None:
        for p, off in mine:
            path, at = store.location(up.upload_id, p)
            src = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if copy_range(src, fd, p.size, at, off) != p.size:
                    raise FsError(errno.EIO, f"part {p.number} of upload {up.upload_id!r} "
                                  "is shorter on this node's hot tier than its record")
            finally:
                os.close(src)

    gate = asyncio.Semaphore(FETCH_PARALLEL)

    async def one(p: UploadPart, off: int) -> None:
        async with gate:
            await _fetch(peer, up, p, fd, off)

    copy = asyncio.ensure_future(asyncio.to_thread(copy_mine))
    tasks = [asyncio.ensure_future(one(p, off)) for p, off in others]
    try:
        await asyncio.gather(asyncio.shield(copy), *tasks)
    finally:
        for t in tasks:  # one failed: the others stop ...
            t.cancel()
        await asyncio.wait([copy, *tasks])  # ... and nothing writes into fd any more
        for t in (copy, *tasks):
            if not t.cancelled():
                t.exception()  # retrieved (the first failure is the one raised)
    return pos


#: what to look at in one upload's directory: the files of these part numbers, or (None)
#: every file (its upload was created or ended, or the feed had a gap)
Scope = set[int] | None


def _part_of(name: str) -> int | None:
    """The part number a part file's name carries (``p<n>-<token>`` or ``<n>``)."""
    head = name[1:].partition("-")[0] if name.startswith("p") else name
    return int(head) if head.isdigit() else None


class Reclaimer:
    """Reconciles this node's upload directories with the records (see the module doc):
    :meth:`changed` hears the change feed's keys, a task sweeps what they name.  A part
    record's change looks at that part's files alone (a record read each), so an upload
    of many parts costs each node a constant per part, not a scan of every record."""

    def __init__(self, meta: MetaStore, store: PartStore) -> None:
        self.meta, self.store = meta, store
        self._pending: dict[str, Scope] = {}
        self._all = False
        self._task: asyncio.Task[None] | None = None
        self.removed = 0  # entries removed so far (tests, logs)

    def _want(self, upload_id: str, number: int | None) -> None:
        if number is None:
            self._pending[upload_id] = None
            return
        scope = self._pending.setdefault(upload_id, set())
        if scope is not None:  # (None: the whole directory is looked at already)
            scope.add(number)

    def changed(self, keys: list[bytes] | None) -> None:
        """On the loop: another node committed ``keys`` (None: anything)."""
        if keys is None:
            self._all = True
        else:
            for k in keys:
                if k[:1] == b"M":
                    self._want(k[1:].decode(errors="replace"), None)
                elif k[:1] == b"P" and len(k) > 5 and k[-5:-4] == b"\0":
                    self._want(k[1:-5].decode(errors="replace"),
                               int.from_bytes(k[-4:], "big"))
        if (self._all or self._pending) and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self._all or self._pending:
            if self._all:
                self._all = False
                for upload_id in await asyncio.to_thread(self.store.uploads_here):
                    self._pending[upload_id] = None
            todo, self._pending = self._pending, {}
            for upload_id, scope in todo.items():
                try:
                    self.removed += await self.sweep(upload_id, scope)
                except Exception:
                    log.exception("reclaiming the part files of upload %r failed",
                                  upload_id)

    async def sweep(self, upload_id: str, scope: Scope = None) -> int:
        """Remove what of ``upload_id``'s directory here (the files of the part numbers
        in ``scope``; None: all) no record needs any more.  The order matters: the files
        are listed first, then the ones being written are taken, then the records are
        read; a file stored meanwhile has its record by then, and one created after the
        listing is not touched."""
        names = await asyncio.to_thread(self.store.files, upload_id)
        if names is None:
            return 0
        if scope is not None:
            names = [n for n in names if _part_of(n) in scope]
        writing = self.store.in_flight(upload_id)
        up, keep = await asyncio.to_thread(self._needed, upload_id, scope)
        if up is None:
            self.store.forget(upload_id)  # ended elsewhere: writers here fail
            await self.store.remove(upload_id)
            log.info("upload %r ended on another node: its part files here removed",
                     upload_id)
            return 1
        drop = [n for n in names if n not in keep and n not in writing]
        return await asyncio.to_thread(self.store.drop_files, upload_id, drop) if drop else 0

    def _needed(self, upload_id: str,
                scope: Scope) -> tuple[MultipartUpload | None, set[str]]:
        """(the upload, the names of this node's part files its records name)."""
        with self.meta.snapshot() as tx:
            up = tx.get_upload(upload_id)
            if up is None:
                return None, set()
            if scope is None:
                got = list(tx.list_parts(upload_id))
            else:
                got = [p for p in (tx.get_part(upload_id, n) for n in scope) if p is not None]
        parts = local_parts(up, got, self.meta.node)
        return up, {DATA} | {p.file or str(p.number) for p in parts if not p.slot_size}
