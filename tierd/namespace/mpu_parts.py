"""Where the parts of a multipart upload are written, so that completing copies nothing.

An upload owns the directory ``<hot>/mpu/<upload id>/`` (on a cluster, one on each node that
took a part of it, laid out alike for the parts that node holds: :mod:`.mpu_remote`):

* ``data`` -- the upload's **data file**.  The first part that arrives with a known size of
  at least the minimum part size (or part 1, whatever its size) fixes the upload's **slot
  size** S; part n of at most S bytes is then written straight into ``data`` at
  ``(n - 1) * S``.  Clients upload fixed-size parts and a shorter last one, so when
  Complete lists parts 1..k of S bytes each (the last ≤ S), ``data`` already *is* the object
  and it is linked into place: no byte is copied.
* ``p<n>-<token>`` -- a part that cannot use its slot: no slot size yet, larger than S, a
  size not announced, its slot taken (an acknowledged part or another upload of the same
  number still in flight), or Complete running.  Other layouts are assembled with
  ``copy_file_range`` (in the kernel).
* ``<n>`` -- parts written before slots existed (records without a location).

The part record (:class:`~tierd.meta.UploadPart`) says where the bytes are, so a re-upload
never overwrites the bytes of the acknowledged part it replaces: the record switches to the
new bytes in one transaction, and a failed upload leaves the old part intact.

**Invariant**: while a record places part n in its slot, nobody writes that slot; a slot is
written only by the single in-flight upload of that part number that found it free.  During
Complete (which links ``data`` into the object, so the two share one inode) writes into
``data`` pause between batches; they resume if Complete fails, and fail with NoSuchUpload if
it succeeded, so the object is never written through the upload.

Everything in memory here (:class:`UploadState`) is rebuilt from the records after a restart;
:meth:`PartStore.recover` removes what a crash left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import secrets
import shutil
from collections.abc import AsyncIterable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tierd.errors import FsError, Reason
from tierd.meta import UploadPart
from tierd.meta.uploads import UPLOAD_ID
from tierd.tiers.fileio import COPY_CHUNK, copy_range, pwritev_all

DATA = "data"
BATCH = 1 << 20  # bytes gathered before one thread job writes and hashes them
MAX_DATA_END = 4 << 40  # slots end below this offset (ext4's file size limit is 16 TiB)

Buffer = bytes | memoryview


class Hasher(Protocol):
    def update(self, data: Buffer, /) -> None: ...


@dataclass
class Payload:
    """A part's bytes as a door hands them over, for the namespace to write and hash in one
    pass: ``hashers`` (the door's digests: payload SHA-256, checksums) are updated in the
    same thread job as the MD5 and the write, and ``verify`` runs once every byte was
    hashed, before the part is acknowledged (it raises to refuse the part).  ``size`` is the
    announced length: a part can go into its slot only if it is known."""

    chunks: AsyncIterable[Buffer]
    size: int | None = None
    hashers: Sequence[Hasher] = ()
    verify: Callable[[], None] | None = None


def no_such_upload(upload_id: str, why: str = "was completed or aborted") -> FsError:
    return FsError(errno.ENOENT, f"upload {upload_id!r} {why}", reason=Reason.NO_SUCH_UPLOAD)


@dataclass
class UploadState:
    """What is in flight for one upload (memory only; see the module doc)."""

    slot_size: int = 0
    writing: set[int] = field(default_factory=set)  # part numbers being written to slots
    files: set[str] = field(default_factory=set)  # own part files being written
    active: int = 0  # thread jobs writing ``data`` now, and part records being committed
    completing: int = 0  # Complete calls past validation
    gone: bool = False  # completed or aborted: writers must stop
    #: one Complete at a time: two with different part lists could otherwise both write
    #: into ``data`` (a short last part copied into its slot) after the other linked it
    complete_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: held while a part's record is read and its slot claimed, and while a part's record
    #: is committed: a claim never sees a record from before a commit and ``writing``
    #: from after it (the slot would look free while it holds acknowledged bytes)
    claim: asyncio.Lock = field(default_factory=asyncio.Lock)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)
    _resumed: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._idle.set()
        self._resumed.set()

    def io_started(self) -> None:
        self.active += 1
        self._idle.clear()

    def io_done(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._idle.set()

    async def may_write(self, upload_id: str) -> None:
        """Before a write into ``data``: wait while Complete runs; fail once it is gone."""
        while self.completing and not self.gone:
            await self._resumed.wait()
        if self.gone:
            raise no_such_upload(upload_id)

    def pause(self) -> None:
        """Complete starts: no new write into ``data`` and no part stored until
        :meth:`resume` (pair them with try/finally)."""
        self.completing += 1
        self._resumed.clear()

    async def idle(self) -> None:
        """Wait for the writes into ``data`` already in a thread."""
        while self.active:
            await self._idle.wait()

    def resume(self) -> None:
        self.completing -= 1
        if self.completing == 0:
            self._resumed.set()

    def end(self) -> None:
        """Completed or aborted: paused writers wake up and fail."""
        self.gone = True
        self._resumed.set()


def _write_hash(fd: int, bufs: list[Buffer], offset: int, hashers: Sequence[Hasher]) -> None:
    """One thread job: write a batch at ``offset`` and feed it to every digest (hashlib and
    zlib release the GIL, so this runs beside the event loop)."""
    pwritev_all(fd, bufs, offset)
    for b in bufs:  # each buffer stays in cache while every digest reads it
        for h in hashers:
            h.update(b)


def _copy_hash(src: int, dst: int, first: int, length: int, dst_offset: int,
               hashers: Sequence[Hasher]) -> int:
    """Copy a source range through a buffer (the MD5 must see the bytes); returns bytes
    copied (fewer if the source is shorter)."""
    def feed(data: bytes) -> None:
        for h in hashers:
            h.update(data)

    return copy_range(src, dst, length, first, dst_offset, digest=feed)


class PartTarget:
    """Where one part's bytes are being written: its slot in ``data`` or its own file."""

    def __init__(self, store: PartStore, upload_id: str, number: int, state: UploadState,
                 slot_size: int) -> None:
        self.upload_id = upload_id
        self.number = number
        self.state = state
        self.slot_size = slot_size
        d = store.dir(upload_id)
        if slot_size:
            self.file = ""
            self.path = os.path.join(d, DATA)
            self.offset = (number - 1) * slot_size
            flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
        else:
            self.file = f"p{number}-{secrets.token_hex(8)}"
            self.path = os.path.join(d, self.file)
            self.offset = 0
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            self.fd = os.open(self.path, flags, 0o600)
        except FileNotFoundError:  # the directory is gone: aborted or completed
            raise no_such_upload(upload_id) from None
        if slot_size:
            state.writing.add(number)
        else:
            state.files.add(self.file)  # a reclaim (mpu_remote.Reclaimer) leaves it alone
        self._inflight: asyncio.Future[object] | None = None
        self._closed = False

    async def _submit(self, writes: bool, fn: Callable[..., object], *args: object) -> None:
        """Start ``fn(*args)`` in a thread once the previous job is done.  Every job on
        the descriptor goes through here, so :meth:`close` can wait for the last one (a
        descriptor closed under a running job could be reused by another file)."""
        await self._drain()
        st = self.state
        if writes and self.slot_size:
            await st.may_write(self.upload_id)
            st.io_started()  # no await between the check and this: Complete sees it
        fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        if writes and self.slot_size:
            fut.add_done_callback(lambda _: st.io_done())
        self._inflight = fut

    async def _drain(self) -> object:
        fut = self._inflight
        if fut is None:
            return None
        result = await fut
        self._inflight = None
        return result

    async def receive(self, payload: Payload, md5: Hasher) -> int:
        """Write ``payload`` while hashing it (MD5 and the door's digests); returns its
        size.  Batch N is written and hashed in a thread while batch N+1 is received."""
        hashers = [md5, *payload.hashers]
        limit = payload.size if self.slot_size else None
        batch: list[Buffer] = []
        blen = pos = 0
        async for chunk in payload.chunks:
            n = len(chunk)
            if not n:
                continue
            if limit is not None and pos + blen + n > limit:
                raise FsError(errno.EINVAL, "the body is longer than its announced length",
                              reason=Reason.INCOMPLETE_BODY)
            batch.append(chunk)
            blen += n
            if blen >= BATCH:
                await self._submit(True, _write_hash, self.fd, batch, self.offset + pos,
                                   hashers)
                pos += blen
                batch, blen = [], 0
        if batch:
            await self._submit(True, _write_hash, self.fd, batch, self.offset + pos, hashers)
            pos += blen
        await self._drain()
        return pos

    async def copy_from(self, src: int, first: int, length: int, md5: Hasher) -> int:
        """UploadPartCopy: the source range, in chunks (writes into ``data`` pause for
        Complete between chunks, as a streamed part's do)."""
        done = 0
        while done < length:
            n = min(COPY_CHUNK, length - done)
            await self._submit(True, _copy_hash, src, self.fd, first + done, n,
                               self.offset + done, [md5])
            got = await self._drain()
            assert isinstance(got, int)
            done += got
            if got < n:
                break
        return done

    async def sync(self) -> None:
        """The part is durable before it is acknowledged."""
        await self._submit(False, os.fdatasync, self.fd)
        await self._drain()

    def close(self, failed: bool) -> None:
        """Release the descriptor and the slot once no job runs on them any more, and, if
        the part was not stored, its own file.  Bytes left in a free slot are garbage that
        no record points at."""
        if self._closed:
            return
        self._closed = True
        fut, self._inflight = self._inflight, None
        if fut is not None and not fut.done():
            fut.add_done_callback(lambda f: self._release(failed, f))
        else:
            self._release(failed, fut)

    def _release(self, failed: bool, fut: asyncio.Future[object] | None) -> None:
        if fut is not None and not fut.cancelled():
            fut.exception()  # retrieved: the caller already got (or abandoned) it
        os.close(self.fd)
        if self.slot_size:
            self.state.writing.discard(self.number)
        else:
            self.state.files.discard(self.file)
        if failed and self.file:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


class PartStore:
    """The upload directories under ``<hot>/mpu`` and the in-flight state of each upload."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._states: dict[str, UploadState] = {}

    def dir(self, upload_id: str) -> str:
        """The upload's directory.  The id is checked here, before any path is made of
        it: ids come from requests, records and the cluster's change feed, and an empty
        or dotted one would name the parts root itself or a place outside it."""
        if not UPLOAD_ID.fullmatch(upload_id):
            raise FsError(errno.EINVAL, f"malformed multipart upload id {upload_id[:80]!r}")
        return os.path.join(self.root, upload_id)

    def create(self, upload_id: str) -> None:
        os.makedirs(self.dir(upload_id), exist_ok=True)

    def known(self, upload_id: str) -> UploadState | None:
        """The upload's state if this node has one in memory."""
        return self._states.get(upload_id)

    def state(self, upload_id: str, parts: Iterable[UploadPart]) -> UploadState:
        """The upload's state; after a restart its slot size comes from the records
        (``parts``: this node's, read by the caller)."""
        st = self._states.get(upload_id)
        if st is None:
            st = self._states[upload_id] = UploadState()
            st.slot_size = next((p.slot_size for p in parts if p.slot_size), 0)
        return st

    def target(self, upload_id: str, number: int, size: int | None, st: UploadState,
               current: UploadPart | None, min_part_size: int) -> PartTarget:
        """Open where part ``number`` of ``size`` bytes goes: its slot if the layout allows
        and the slot is free (``current`` is the part's acknowledged record), else its own
        file.  The first part of at least ``min_part_size`` (or part 1) sets the slot size:
        a client's short last part may arrive first, and must not set it."""
        if (not st.slot_size and size and not st.completing
                and (number == 1 or size >= min_part_size)):
            st.slot_size = size
        s = st.slot_size
        use_slot = (size is not None and s > 0 and size <= s and number * s <= MAX_DATA_END
                    and not st.completing and number not in st.writing
                    and not (current is not None and current.slot_size))
        return PartTarget(self, upload_id, number, st, s if use_slot else 0)

    def location(self, upload_id: str, part: UploadPart) -> tuple[str, int]:
        """(file, offset) of an acknowledged part's bytes."""
        d = self.dir(upload_id)
        if part.slot_size:
            return os.path.join(d, DATA), (part.number - 1) * part.slot_size
        return os.path.join(d, part.file or str(part.number)), 0

    def in_place(self, upload_id: str, parts: list[UploadPart]) -> tuple[bool, bool]:
        """(can ``data`` become the object, must the last part be copied into its slot
        first).  It can when ``parts`` (as listed for Complete) are numbers 1..k, all but
        the last in their slots and exactly one slot long, and the last in its slot or
        small enough to be copied there: a short last part that arrived before any part
        set the slot size went to its own file.  Its slot must then be free: no part
        upload of that number paused in it."""
        st = self._states.get(upload_id)
        s = st.slot_size if st is not None else 0
        if s <= 0 or not parts or any(p.number != i or p.slot_size != s or p.size != s
                                      for i, p in enumerate(parts[:-1], 1)):
            return False, False
        last = parts[-1]
        if last.number != len(parts) or last.size > s:
            return False, False
        if last.slot_size == s:
            return True, False
        assert st is not None
        ok = last.number not in st.writing and last.number * s <= MAX_DATA_END
        return ok, ok

    def forget(self, upload_id: str) -> None:
        """The upload was completed or aborted."""
        st = self._states.pop(upload_id, None)
        if st is not None:
            st.end()

    async def remove(self, upload_id: str) -> None:
        await asyncio.to_thread(shutil.rmtree, self.dir(upload_id), True)

    def uploads_here(self) -> list[str]:
        """The uploads that have a directory here (blocking: a directory listing)."""
        try:
            return [e.name for e in os.scandir(self.root) if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return []

    def files(self, upload_id: str) -> list[str] | None:
        """The names in an upload's directory; None when it has none (blocking)."""
        try:
            return os.listdir(self.dir(upload_id))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def in_flight(self, upload_id: str) -> set[str]:
        """The own part files being written now (not yet named by a record)."""
        st = self._states.get(upload_id)
        return set(st.files) if st is not None else set()

    def drop_files(self, upload_id: str, names: Iterable[str]) -> int:
        """Remove these files of an upload's directory (blocking); how many were there."""
        n = 0
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.dir(upload_id), name))
                n += 1
        return n

    def recover(self, uploads: dict[str, list[UploadPart]]) -> int:
        """At start: remove directories of uploads that no longer exist and files no part
        record names (a crash between a commit and the cleanup after it).  Returns how many
        entries were removed."""
        removed = 0
        if not os.path.isdir(self.root):
            return 0
        for entry in os.scandir(self.root):
            parts = uploads.get(entry.name)
            if parts is None or not entry.is_dir(follow_symlinks=False):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                removed += 1
                continue
            keep = {DATA} | {p.file or str(p.number) for p in parts if not p.slot_size}
            for f in os.scandir(entry.path):
                if f.name not in keep:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f.path)
                    removed += 1
        return removed


def md5() -> hashlib._Hash:
    return hashlib.md5(usedforsecurity=False)
