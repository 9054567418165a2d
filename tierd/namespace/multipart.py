"""Objects composed on the server: CopyObject, multipart uploads and UploadPartCopy.

Parts are written into the upload's directory of the hot tier, with one metadata record
each; where each part goes is :mod:`tierd.namespace.mpu_parts`'s business.  When the parts
listed by Complete lie in the upload's data file in order (what every client's fixed-size
parts give), that file becomes the object as it is: it is hard-linked into place and no byte
is copied.  Other layouts are concatenated with ``copy_file_range`` in a thread (the kernel
moves the bytes; Python never holds them).  Either way the result then goes in exactly like a
PUT: one transaction -- which also deletes the upload -- atomic replace, old bytes readable
by open handles.  A part is fdatasynced and its record made durable before it is
acknowledged.  Permission is checked when the upload starts and again when it completes.
On a cluster any node takes any part and completes any upload, fetching the parts other
nodes hold (:mod:`tierd.namespace.mpu_remote`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import itertools
import logging
import os
import secrets
import uuid
from collections.abc import AsyncIterable, Awaitable, Callable

from tierd.acl import Identity
from tierd.acl.s3map import enforce
from tierd.errors import FsError, Reason, no_space
from tierd.meta import Inode, MetaTxn, MultipartUpload, UploadPart
from tierd.meta.uploads import MAX_PART_NUMBER
from tierd.namespace.base import now_ns
from tierd.namespace.mpu_parts import (
    DATA,
    Hasher,
    PartStore,
    PartTarget,
    Payload,
    UploadState,
    md5,
    no_such_upload,
)
from tierd.namespace.mpu_remote import (
    PartFetcher,
    Reclaimer,
    fill_spread,
    holder,
    local_parts,
    part_slice,
)
from tierd.namespace.names import split_key
from tierd.namespace.objects import ObjectOps, ObjectReader
from tierd.namespace.staging import full_error, refuse_over_dirty_limit, retry_full
from tierd.peer.server import FileSlice
from tierd.tiers.fileio import copy_range

log = logging.getLogger("tierd.namespace")

MIN_PART_SIZE = 5 << 20  # S3's minimum size of every part but the last


class MultipartOps(ObjectOps):
    min_part_size = MIN_PART_SIZE
    #: on a cluster: how this node streams the parts other nodes hold (tierd.cluster)
    part_peer: PartFetcher | None = None

    # -- copy ------------------------------------------------------------------------------
    async def copy_object(
        self,
        ident: Identity,
        src_bucket: str,
        src_key: str,
        dst_bucket: str,
        dst_key: str,
        objmeta: dict[str, str] | None = None,
        *,
        src_ident: Identity | None = None,
        src_version: str | None = None,
    ) -> Inode:
        """Server-side copy; ``objmeta`` None keeps the source's metadata (COPY directive).
        ``src_ident`` reads the source when it differs from the writer (a bucket policy
        judges the two sides separately); by default ``ident`` does both.  ``src_version``:
        that version of the source (:meth:`_open_source`)."""
        segments, marker = split_key(dst_key)
        if marker:
            raise FsError(errno.EINVAL, "cannot copy onto a directory marker key")
        refuse_over_dirty_limit(self.placement)
        src = await self._open_source(src_ident or ident, src_bucket, src_key, src_version)
        try:
            if src.inode.is_dir:
                raise FsError(errno.EINVAL, "cannot copy a directory marker")
            reuse = bool(src.inode.etag) and "-" not in src.inode.etag
            size = src.inode.size
            await self.placement.room_for_write(size)
            path, fd = self.hot.new_temp()

            async def copy() -> hashlib._Hash | None:  # repeatable: a fresh digest each time
                digest = None if reuse else hashlib.md5()
                await asyncio.to_thread(functools.partial(
                    copy_range, src.fd, fd, size, 0, 0,
                    digest=None if digest is None else digest.update))
                return digest

            try:
                md5 = await retry_full(self.placement, size, copy, "a copy")
                await retry_full(self.placement, size, lambda: asyncio.to_thread(
                    os.fsync, fd), "a copy", again=False)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # no half copy left in staging
                raise
            finally:
                os.close(fd)
        finally:
            await src.close()
        etag = src.inode.etag if md5 is None else md5.hexdigest()
        meta = dict(src.inode.objmeta) if objmeta is None else objmeta
        return await self._install_put(ident, dst_bucket, dst_key, segments, path, size, etag,
                                       meta)

    async def _open_source(self, ident: Identity, bucket: str, key: str,
                           version: str | None) -> ObjectReader:
        """A copy's source, open; a version of it needs versioning (VersionOps)."""
        if version is not None:
            raise FsError(errno.ENOENT, f"no version {version} of {key!r}",
                          reason=Reason.NO_SUCH_VERSION)
        return await self.get_object(ident, bucket, key)

    # -- multipart -------------------------------------------------------------------------
    @functools.cached_property
    def _parts(self) -> PartStore:
        return PartStore(os.path.join(self.hot.root, "mpu"))

    @functools.cached_property
    def _reclaimer(self) -> Reclaimer:
        return Reclaimer(self.meta, self._parts)

    def _recover_uploads(self) -> None:
        """At start: drop what a crash left in upload directories, and on a cluster what
        other nodes' completions, aborts and re-uploads made garbage here while this node
        was down (see PartStore.recover): only this node's parts are kept."""
        with self.meta.snapshot() as tx:
            uploads = {u.upload_id: local_parts(u, tx.list_parts(u.upload_id),
                                                self.meta.node)
                       for u in tx.list_uploads()}
        removed = self._parts.recover(uploads)
        if removed:
            log.info("recovered: %d leftover multipart files removed", removed)

    def uploads_changed(self, keys: list[bytes] | None) -> None:
        """On the loop, from the change feed: another node committed ``keys`` (None:
        anything); this node reclaims its part files those commits left unneeded."""
        self._reclaimer.changed(keys)

    async def part_slice(self, upload_id: str, number: int, etag: str,
                         size: int) -> FileSlice | None:
        """The peer door's answer for a part this node holds (mpu_remote.part_slice)."""
        return await asyncio.to_thread(part_slice, self.meta, self._parts, upload_id,
                                       number, etag, size)

    async def _upload(self, ident: Identity, upload_id: str, *,
                      bucket_owner: bool = False) -> MultipartUpload:
        """The upload, for its creator or root (EACCES else); with ``bucket_owner`` also
        for the owner of its bucket (listing its parts, aborting it: S3's rights of a
        bucket owner over uploads into its bucket)."""
        async with self.meta.asnapshot() as tx:
            up = tx.get_upload(upload_id)
            b = tx.get_bucket(up.bucket) if up is not None and bucket_owner else None
        if up is None:
            raise FsError(errno.ENOENT, f"upload {upload_id!r} does not exist (completed, "
                          "aborted or never created)", reason=Reason.NO_SUCH_UPLOAD)
        owner = b is not None and b.owner_uid == ident.uid and not ident.anonymous
        if not ident.is_root and ident.uid != up.uid and not owner:
            raise FsError(errno.EACCES, f"upload {upload_id!r} belongs to another user")
        return up

    def check_put_allowed(self, ident: Identity, bucket: str, segments: list[bytes]) -> None:
        """Would a PUT of this key be allowed now?  A door asks before it takes the body
        (``Expect: 100-continue``); the commit checks again."""
        self._check_put_allowed(ident, bucket, segments, "PutObject")

    def _check_put_allowed(self, ident: Identity, bucket: str, segments: list[bytes],
                           action: str) -> None:
        """Would a PUT of this key be allowed now?  (Directories are not created yet.)
        ``action``: CreateMultipartUpload or CompleteMultipartUpload (:mod:`tierd.acl.s3map`)."""
        with self.meta.snapshot() as tx:
            cur = self._bucket_dir(tx, bucket)
            for seg in segments[:-1]:
                child = self._child(tx, ident, cur, seg)
                if child is None:
                    enforce(ident, action, parent=cur)  # the first directory to create
                    return
                if child.is_lnk:
                    child = self._resolve(tx, ident, self._path_of(bucket, segments), True)
                if not child.is_dir:
                    raise FsError(errno.ENOTDIR, f"{seg.decode(errors='replace')!r} is an "
                                  "object, so it cannot also be a prefix of other keys")
                cur = child
            old = self._child(tx, ident, cur, segments[-1])
            if old is not None and old.is_dir:
                raise FsError(errno.EISDIR, "the key is a directory (it has keys below it)")
            enforce(ident, action, parent=cur, obj=old if old is not None and old.is_reg
                    else None)

    async def create_multipart(
        self, ident: Identity, bucket: str, key: str, objmeta: dict[str, str] | None = None
    ) -> MultipartUpload:
        segments, marker = split_key(key)
        if marker:
            raise FsError(errno.EINVAL, "a directory marker key cannot be uploaded in parts")
        self._check_put_allowed(ident, bucket, segments, "CreateMultipartUpload")
        up = MultipartUpload(
            upload_id=secrets.token_urlsafe(32), bucket=bucket, key=key, uid=ident.uid,
            gid=ident.gid, initiated_ns=now_ns(), objmeta=dict(objmeta or {}),
            node=self.meta.node,  # (its parts may go to any node: UploadPart.node)
        )
        self._parts.create(up.upload_id)
        async with self.meta.awrite() as tx:
            tx.put_upload(up)
        await self._sync_meta()
        return up

    def _check_part_number(self, number: int) -> None:
        if not 1 <= number <= MAX_PART_NUMBER:
            raise FsError(errno.EINVAL, f"part number must be 1 to {MAX_PART_NUMBER}",
                          reason=Reason.INVALID_ARGUMENT)

    async def _state(self, upload_id: str) -> UploadState:
        st = self._parts.known(upload_id)
        if st is not None:
            return st
        async with self.meta.asnapshot() as tx:  # the parts this node holds set its slot size
            mine = local_parts(tx.get_upload(upload_id), tx.list_parts(upload_id),
                               self.meta.node)
        return self._parts.state(upload_id, mine)

    async def _target(self, upload_id: str, number: int, size: int | None) -> PartTarget:
        """Where part ``number`` goes.  The part's record is read and its slot claimed
        (``UploadState.writing``) under the upload's ``claim`` lock, which
        :meth:`_store_part` holds over its commit: otherwise another upload of that number
        could store a record in the slot and leave it in between, and this one would
        overwrite acknowledged bytes."""
        st = await self._state(upload_id)
        async with st.claim:
            async with self.meta.asnapshot() as tx:
                up = tx.get_upload(upload_id)
                if up is None:
                    raise no_such_upload(upload_id)
                current = tx.get_part(upload_id, number)
            if current is not None and holder(up, current) != self.meta.node:
                current = None  # held elsewhere: it takes no slot of this node's data file
            if up.node != self.meta.node:  # the first part here of an upload made elsewhere
                self._parts.create(upload_id)
            return self._parts.target(upload_id, number, size, st, current,
                                      self.min_part_size)

    async def upload_part(
        self, ident: Identity, upload_id: str, number: int,
        body: AsyncIterable[bytes] | Payload, checksums: dict[str, str] | None = None,
    ) -> UploadPart:
        """Store part ``number``.  ``body`` is a :class:`Payload` (a door that verifies
        digests of its own, and knows the size) or any async iterable of bytes.
        ``checksums`` is read only after the payload was verified: a door may fill in
        trailing checksums."""
        self._check_part_number(number)
        await self._upload(ident, upload_id)
        refuse_over_dirty_limit(self.placement)
        payload = body if isinstance(body, Payload) else Payload(body)

        async def fill(target: PartTarget, digest: Hasher) -> int:
            size = await target.receive(payload, digest)
            if payload.size is not None and size != payload.size:
                raise FsError(errno.EINVAL, f"received {size} bytes of the {payload.size} "
                              "announced", reason=Reason.INCOMPLETE_BODY)
            return size

        return await self._write_part(upload_id, number, payload.size, fill, checksums,
                                      payload.verify)

    async def _write_part(
        self, upload_id: str, number: int, size: int | None,
        fill: Callable[[PartTarget, Hasher], Awaitable[int]],
        checksums: dict[str, str] | None, verify: Callable[[], None] | None = None,
    ) -> UploadPart:
        """Write a part where :class:`PartStore` puts it (``fill`` writes the bytes and
        feeds the MD5; returns how many), make it durable, verify it, store its record;
        on any failure the bytes are dropped and an earlier upload of the part stays."""
        if size:
            await self.placement.room_for_write(size)
        target = await self._target(upload_id, number, size)
        stored = False
        try:
            digest = md5()
            try:
                got = await fill(target, digest)
                await target.sync()
            except OSError as e:  # (a streamed body cannot be sent again: no retry)
                if no_space(e):
                    raise full_error(e, "a part", size or 0) from e
                raise
            if verify is not None:
                verify()
            # checksums are read only now: a door may fill in trailing checksums
            part = UploadPart(number, digest.hexdigest(), got, now_ns(),
                              dict(checksums or {}), target.slot_size, target.file,
                              self.meta.node)
            await self._store_part(upload_id, target.state, part)
            stored = True
        finally:
            target.close(failed=not stored)
        return part

    async def _store_part(self, upload_id: str, st: UploadState, part: UploadPart) -> None:
        """Record an fdatasynced part, durably, replacing an earlier upload of its number
        (whose own file, if it had one, is removed after the commit).  No part is stored
        while a Complete of the upload runs: it sees the records frozen.  A commit that
        began before the Complete is counted as ``data`` I/O (no await between the check
        and the count), so the Complete waits for it before it reads the records."""
        await st.may_write(upload_id)
        st.io_started()
        try:
            async with st.claim, self.meta.awrite() as tx:
                up = tx.get_upload(upload_id)
                if up is not None:
                    old = tx.get_part(upload_id, part.number)
                    tx.put_part(upload_id, part)
        finally:
            st.io_done()
        if up is None:  # aborted or completed (maybe on another node) while it streamed
            self._parts.forget(upload_id)
            await self._parts.remove(upload_id)
            raise no_such_upload(upload_id, "was aborted or completed")
        await self._sync_meta()
        # own files have unique names; a part on another node is its node's to reclaim
        if old is not None and not old.slot_size and holder(up, old) == self.meta.node:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._parts.location(upload_id, old)[0])

    async def upload_part_copy(
        self, ident: Identity, upload_id: str, number: int, src_bucket: str, src_key: str,
        byte_range: tuple[int, int] | None = None, checksums: dict[str, str] | None = None,
        *, src_ident: Identity | None = None, src_version: str | None = None,
    ) -> UploadPart:
        """A part copied from an existing object; ``byte_range`` is inclusive (first, last).
        ``src_ident`` reads the source (as in :meth:`copy_object`)."""
        self._check_part_number(number)
        await self._upload(ident, upload_id)
        refuse_over_dirty_limit(self.placement)
        src = await self._open_source(src_ident or ident, src_bucket, src_key, src_version)
        try:
            first, last = byte_range if byte_range is not None else (0, src.size - 1)
            if byte_range is not None and (first < 0 or last < first or last >= src.size):
                raise FsError(errno.EINVAL, f"range bytes={first}-{last} is outside the "
                              f"{src.size}-byte source", reason=Reason.INVALID_RANGE)
            length = max(0, last - first + 1)

            async def fill(target: PartTarget, digest: Hasher) -> int:
                return await target.copy_from(src.fd, first, length, digest)

            return await self._write_part(upload_id, number, length, fill, checksums)
        finally:
            await src.close()

    async def list_parts(
        self, ident: Identity, upload_id: str, after: int = 0, limit: int = 1000
    ) -> tuple[MultipartUpload, list[UploadPart], bool]:
        up = await self._upload(ident, upload_id, bucket_owner=True)
        async with self.meta.asnapshot() as tx:
            parts: list[UploadPart] = []
            for p in tx.list_parts(upload_id, after):
                if len(parts) == limit:
                    return up, parts, True
                parts.append(p)
        return up, parts, False

    async def list_multipart_uploads(
        self, ident: Identity, bucket: str, prefix: str = "", key_marker: str = "",
        upload_id_marker: str = "", limit: int = 1000,
    ) -> tuple[list[MultipartUpload], bool]:
        """Uploads of a bucket in (key, initiation) order after the markers.  In-flight
        uploads are few, so they are read whole and sorted."""
        await self.get_bucket(bucket)
        async with self.meta.asnapshot() as tx:
            ups = [u for u in tx.list_uploads() if u.bucket == bucket
                   and u.key.startswith(prefix)]
        ups.sort(key=lambda u: (u.key, u.initiated_ns, u.upload_id))
        if key_marker:
            if upload_id_marker:
                marker_up = next((u for u in ups if u.upload_id == upload_id_marker), None)
                ups = [u for u in ups if u.key > key_marker or (
                    u.key == key_marker and marker_up is not None
                    and (u.initiated_ns, u.upload_id)
                    > (marker_up.initiated_ns, marker_up.upload_id))]
            else:
                ups = [u for u in ups if u.key > key_marker]
        return ups[:limit], len(ups) > limit

    async def abort_multipart(self, ident: Identity, upload_id: str) -> None:
        await self._upload(ident, upload_id, bucket_owner=True)
        async with self.meta.awrite() as tx:
            tx.delete_upload(upload_id)
            tx.delete_parts(upload_id)
        await self._sync_meta()
        self._parts.forget(upload_id)
        await self._parts.remove(upload_id)

    async def get_upload(self, ident: Identity, upload_id: str, *,
                         bucket_owner: bool = False) -> MultipartUpload:
        """The upload (NoSuchUpload if unknown; EACCES if another user's, unless
        ``bucket_owner`` and ``ident`` owns its bucket)."""
        return await self._upload(ident, upload_id, bucket_owner=bucket_owner)

    async def _chosen(self, upload_id: str, parts: list[tuple[int, str]]
                      ) -> tuple[list[UploadPart], list[UploadPart]]:
        """(the listed parts, every stored part); InvalidPart/InvalidPartOrder/
        EntityTooSmall as S3 answers them."""
        if not parts:
            raise FsError(errno.EINVAL, "the part list is empty", reason=Reason.MALFORMED_XML)
        numbers = [n for n, _ in parts]
        if any(b <= a for a, b in itertools.pairwise(numbers)):
            raise FsError(errno.EINVAL, "part numbers must be listed in ascending order",
                          reason=Reason.INVALID_PART_ORDER)
        async with self.meta.asnapshot() as tx:
            every = list(tx.list_parts(upload_id))
        stored = {p.number: p for p in every}
        chosen: list[UploadPart] = []
        for i, (number, etag) in enumerate(parts):
            p = stored.get(number)
            if p is None or p.etag != etag.strip('"').lower():
                raise FsError(errno.EINVAL, f"part {number} was not uploaded or its ETag "
                              "does not match", reason=Reason.INVALID_PART)
            if i < len(parts) - 1 and p.size < self.min_part_size:
                raise FsError(errno.EINVAL, f"part {number} is {p.size} bytes; every part "
                              f"but the last must be at least {self.min_part_size}",
                              reason=Reason.ENTITY_TOO_SMALL)
            chosen.append(p)
        return chosen, every

    async def complete_multipart(
        self, ident: Identity, upload_id: str, parts: list[tuple[int, str]],
        objmeta: dict[str, str] | None = None, *, if_match: str | None = None,
        if_none_match: str | None = None,
    ) -> Inode:
        """Assemble the listed parts, in order, into the object; ETag is MD5-of-MD5s-N.
        ``objmeta`` (e.g. a composite checksum, the part layout) is merged over the
        metadata given at create.  ``if_match`` / ``if_none_match`` (``"*"``) are checked
        in the commit, as for a PUT: a failed condition (reason ``PreconditionFailed``)
        leaves the old object and the upload as they were."""
        up = await self._upload(ident, upload_id)
        await self._chosen(upload_id, parts)  # answer a bad list before pausing the upload
        refuse_over_dirty_limit(self.placement)  # the object's bytes become dirty
        segments, _ = split_key(up.key)
        self._check_put_allowed(ident, up.bucket, segments, "CompleteMultipartUpload")
        if if_match is not None or if_none_match is not None:
            await self._precondition_etag(ident, up.bucket, up.key)
        st = await self._state(upload_id)
        async with st.complete_lock:
            if st.gone:  # another Complete (or an Abort) finished first
                raise no_such_upload(upload_id)
            st.pause()
            try:
                await st.idle()
                chosen, every = await self._chosen(upload_id, parts)  # frozen from here on
                path, size = await self._assemble(
                    up, st, chosen, local_parts(up, every, self.meta.node))
                digest = hashlib.md5(b"".join(bytes.fromhex(p.etag) for p in chosen))

                def finish(tx: MetaTxn) -> None:  # in the transaction installing the object
                    if tx.get_upload(upload_id) is None:
                        raise no_such_upload(upload_id, "was completed or aborted meanwhile")
                    tx.delete_upload(upload_id)
                    tx.delete_parts(upload_id)

                inode = await self._install_put(
                    ident, up.bucket, up.key, segments, path, size,
                    f"{digest.hexdigest()}-{len(chosen)}", {**up.objmeta, **(objmeta or {})},
                    in_txn=finish, if_match=if_match, if_none_match=if_none_match)
                self._parts.forget(upload_id)  # paused writers wake up and fail
            finally:
                st.resume()
        await self._parts.remove(upload_id)
        return inode

    async def _assemble(self, up: MultipartUpload, st: UploadState,
                        chosen: list[UploadPart], mine: list[UploadPart]) -> tuple[str, int]:
        """A staging file holding the object: the upload's data file itself (a hard link,
        so the upload keeps its bytes until the commit) when the parts lie in it in order,
        else a concatenation -- in the kernel for this node's parts, through the peer
        doors for other nodes' (``mine``: every part this node holds).  Returns (path,
        size); the file is fsynced."""
        upload_id = up.upload_id
        size = sum(p.size for p in chosen)
        local = all(holder(up, p) == self.meta.node for p in chosen)
        ok, copy_last = self._parts.in_place(upload_id, chosen) if local else (False, False)
        if ok:
            data = os.path.join(self._parts.dir(upload_id), DATA)
            k = len(chosen)
            # bytes past the object may be cut only if no part is (or is being) stored there
            may_cut = not st.writing and not any(p.slot_size and p.number > k for p in mine)
            last = None
            if copy_last:  # (source, offset, length, offset in data)
                src, off = self._parts.location(upload_id, chosen[-1])
                last = (src, off, chosen[-1].size, size - chosen[-1].size)
            path = os.path.join(self.hot.tmp, uuid.uuid4().hex)
            if await asyncio.to_thread(_link_data, data, path, size, may_cut, last):
                return path, size
        await self.placement.room_for_write(size)
        path, fd = self.hot.new_temp()
        try:
            await retry_full(self.placement, size, lambda: fill_spread(
                self._parts, self.part_peer, self.meta.node, up, chosen, fd),
                "an object's assembly")
            await retry_full(self.placement, size, lambda: asyncio.to_thread(
                os.fsync, fd), "an object's assembly", again=False)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        return path, size


def _link_data(data: str, path: str, size: int, may_cut: bool,
               last: tuple[str, int, int, int] | None) -> bool:
    """Hard-link the upload's data file as the staging file ``path`` once it holds exactly
    the ``size`` bytes of the object: ``last`` (source file, offset, length, offset in
    data) is copied into its slot first, bytes past ``size`` are cut if ``may_cut``, and
    whatever changed is fsynced.  False: the layout does not allow it (assemble by copying
    instead).  Blocking."""
    try:
        have = os.stat(data).st_size
    except FileNotFoundError:
        raise no_such_upload(os.path.basename(os.path.dirname(data))) from None
    if (have > size and not may_cut) or (have < size and last is None):
        return False
    if last is not None or have > size:
        fd = os.open(data, os.O_WRONLY | os.O_CLOEXEC)
        try:
            if last is not None:
                src_path, src_off, length, dst_off = last
                src = os.open(src_path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    if copy_range(src, fd, length, src_off, dst_off) != length:
                        return False
                finally:
                    os.close(src)
            if have > size:
                os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)
    os.link(data, path)
    return True
