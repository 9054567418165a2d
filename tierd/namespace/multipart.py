"""Objects composed on the server: CopyObject, multipart uploads and UploadPartCopy.

Parts are staged as files of the hot tier (``<hot>/mpu/<upload id>/<part>``) with one
metadata record each.  Completing concatenates them with ``copy_file_range`` in a thread (the
kernel moves the bytes; Python never holds them) into a staging file, which then goes in
exactly like a PUT: one transaction, atomic replace, old bytes readable by open handles.
Permission is checked when the upload starts and again when it completes.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import itertools
import os
import secrets
import shutil
from collections.abc import AsyncIterable

from tierd.acl import W_OK, X_OK, Identity, check_access
from tierd.errors import FsError
from tierd.meta import Inode, MultipartUpload, UploadPart
from tierd.namespace.base import now_ns
from tierd.namespace.names import split_key
from tierd.namespace.objects import ObjectOps
from tierd.namespace.staging import stage_body

MIN_PART_SIZE = 5 << 20  # S3's minimum size of every part but the last
MAX_PART_NUMBER = 10000
_COPY_CHUNK = 8 << 20


def copy_range(src_fd: int, dst_fd: int, offset: int, length: int, dst_offset: int,
               md5: hashlib._Hash | None = None) -> int:
    """Copy ``length`` bytes in the kernel (``copy_file_range``), or through a buffer when
    ``md5`` must see them.  Blocking: run in a thread."""
    done = 0
    while done < length:
        n = min(_COPY_CHUNK, length - done)
        if md5 is None:
            try:
                got = os.copy_file_range(src_fd, dst_fd, n, offset + done, dst_offset + done)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
                md5 = hashlib.md5()  # unused digest: fall back to the buffered path
                continue
        else:
            data = os.pread(src_fd, n, offset + done)
            md5.update(data)
            got = os.pwrite(dst_fd, data, dst_offset + done) if data else 0
        if got <= 0:
            break
        done += got
    return done


class MultipartOps(ObjectOps):
    min_part_size = MIN_PART_SIZE

    # -- copy ------------------------------------------------------------------------------
    async def copy_object(
        self,
        ident: Identity,
        src_bucket: str,
        src_key: str,
        dst_bucket: str,
        dst_key: str,
        objmeta: dict[str, str] | None = None,
    ) -> Inode:
        """Server-side copy; ``objmeta`` None keeps the source's metadata (COPY directive)."""
        segments, marker = split_key(dst_key)
        if marker:
            raise FsError(errno.EINVAL, "cannot copy onto a directory marker key")
        src = await self.get_object(ident, src_bucket, src_key)
        try:
            if src.inode.is_dir:
                raise FsError(errno.EINVAL, "cannot copy a directory marker")
            path, fd = self.hot.new_temp()
            try:
                reuse = bool(src.inode.etag) and "-" not in src.inode.etag
                md5 = None if reuse else hashlib.md5()
                size = src.inode.size
                await asyncio.to_thread(copy_range, src.fd, fd, 0, size, 0, md5)
                await asyncio.to_thread(os.fsync, fd)
            finally:
                os.close(fd)
        finally:
            await src.close()
        etag = src.inode.etag if md5 is None else md5.hexdigest()
        meta = dict(src.inode.objmeta) if objmeta is None else objmeta
        return await self._install_put(ident, dst_bucket, dst_key, segments, path, size, etag,
                                       meta)

    # -- multipart -------------------------------------------------------------------------
    def _mpu_dir(self, upload_id: str) -> str:
        return os.path.join(self.hot.root, "mpu", upload_id)

    def _upload(self, ident: Identity, upload_id: str) -> MultipartUpload:
        with self.meta.snapshot() as tx:
            up = tx.get_upload(upload_id)
        if up is None:
            raise FsError(errno.ENOENT, f"upload {upload_id!r} does not exist (completed, "
                          "aborted or never created)", reason="NoSuchUpload")
        if not ident.is_root and ident.uid != up.uid:
            raise FsError(errno.EACCES, f"upload {upload_id!r} belongs to another user")
        return up

    def _check_put_allowed(self, ident: Identity, bucket: str, segments: list[bytes]) -> None:
        """Would a PUT of this key be allowed now?  (Directories are not created yet.)"""
        with self.meta.snapshot() as tx:
            cur = self._bucket_dir(tx, bucket)
            for seg in segments[:-1]:
                child = self._child(tx, ident, cur, seg)
                if child is None:
                    check_access(ident, cur, W_OK | X_OK, "the key's parent directory")
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
            if old is not None and old.is_reg:
                check_access(ident, old, W_OK, "the existing object")
            else:
                check_access(ident, cur, W_OK | X_OK, "the key's parent directory")

    async def create_multipart(
        self, ident: Identity, bucket: str, key: str, objmeta: dict[str, str] | None = None
    ) -> MultipartUpload:
        segments, marker = split_key(key)
        if marker:
            raise FsError(errno.EINVAL, "a directory marker key cannot be uploaded in parts")
        self._check_put_allowed(ident, bucket, segments)
        up = MultipartUpload(
            upload_id=secrets.token_urlsafe(32), bucket=bucket, key=key, uid=ident.uid,
            gid=ident.gid, initiated_ns=now_ns(), objmeta=dict(objmeta or {}),
        )
        os.makedirs(self._mpu_dir(up.upload_id), exist_ok=True)
        with self.meta.write() as tx:
            tx.put_upload(up)
        return up

    def _check_part_number(self, number: int) -> None:
        if not 1 <= number <= MAX_PART_NUMBER:
            raise FsError(errno.EINVAL, f"part number must be 1 to {MAX_PART_NUMBER}",
                          reason="InvalidArgument")

    async def upload_part(
        self, ident: Identity, upload_id: str, number: int, body: AsyncIterable[bytes],
        checksums: dict[str, str] | None = None,
    ) -> UploadPart:
        self._check_part_number(number)
        self._upload(ident, upload_id)
        path, size, md5hex = await stage_body(self.hot, body)
        # checksums are read after the body: a door may fill in trailing checksums
        part = UploadPart(number, md5hex, size, now_ns(), dict(checksums or {}))
        return self._store_part(upload_id, part, path)

    def _store_part(self, upload_id: str, part: UploadPart, path: str) -> UploadPart:
        with self.meta.write() as tx:
            if tx.get_upload(upload_id) is None:  # aborted while the body streamed
                os.unlink(path)
                raise FsError(errno.ENOENT, f"upload {upload_id!r} was aborted",
                              reason="NoSuchUpload")
            os.replace(path, os.path.join(self._mpu_dir(upload_id), str(part.number)))
            tx.put_part(upload_id, part)
        return part

    async def upload_part_copy(
        self, ident: Identity, upload_id: str, number: int, src_bucket: str, src_key: str,
        byte_range: tuple[int, int] | None = None, checksums: dict[str, str] | None = None,
    ) -> UploadPart:
        """A part copied from an existing object; ``byte_range`` is inclusive (first, last)."""
        self._check_part_number(number)
        self._upload(ident, upload_id)
        src = await self.get_object(ident, src_bucket, src_key)
        try:
            first, last = byte_range if byte_range is not None else (0, src.size - 1)
            if byte_range is not None and (first < 0 or last < first or last >= src.size):
                raise FsError(errno.EINVAL, f"range bytes={first}-{last} is outside the "
                              f"{src.size}-byte source", reason="InvalidRange")
            length = max(0, last - first + 1)
            path, fd = self.hot.new_temp()
            md5 = hashlib.md5()
            try:
                await asyncio.to_thread(copy_range, src.fd, fd, first, length, 0, md5)
                await asyncio.to_thread(os.fsync, fd)
            finally:
                os.close(fd)
        finally:
            await src.close()
        return self._store_part(upload_id, UploadPart(number, md5.hexdigest(), length,
                                                      now_ns(), dict(checksums or {})), path)

    async def list_parts(
        self, ident: Identity, upload_id: str, after: int = 0, limit: int = 1000
    ) -> tuple[MultipartUpload, list[UploadPart], bool]:
        up = self._upload(ident, upload_id)
        with self.meta.snapshot() as tx:
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
        with self.meta.snapshot() as tx:
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
        self._upload(ident, upload_id)
        with self.meta.write() as tx:
            tx.delete_upload(upload_id)
            tx.delete_parts(upload_id)
        await asyncio.to_thread(shutil.rmtree, self._mpu_dir(upload_id), True)

    async def get_upload(self, ident: Identity, upload_id: str) -> MultipartUpload:
        """The upload (NoSuchUpload if unknown; EACCES if another user's)."""
        return self._upload(ident, upload_id)

    async def complete_multipart(
        self, ident: Identity, upload_id: str, parts: list[tuple[int, str]],
        objmeta: dict[str, str] | None = None,
    ) -> Inode:
        """Assemble the listed parts, in order, into the object; ETag is MD5-of-MD5s-N.
        ``objmeta`` (e.g. a composite checksum, the part layout) is merged over the
        metadata given at create."""
        up = self._upload(ident, upload_id)
        if not parts:
            raise FsError(errno.EINVAL, "the part list is empty", reason="MalformedXML")
        numbers = [n for n, _ in parts]
        if any(b <= a for a, b in itertools.pairwise(numbers)):
            raise FsError(errno.EINVAL, "part numbers must be listed in ascending order",
                          reason="InvalidPartOrder")
        with self.meta.snapshot() as tx:
            stored = {p.number: p for p in tx.list_parts(upload_id)}
        chosen: list[UploadPart] = []
        for i, (number, etag) in enumerate(parts):
            p = stored.get(number)
            if p is None or p.etag != etag.strip('"').lower():
                raise FsError(errno.EINVAL, f"part {number} was not uploaded or its ETag "
                              "does not match", reason="InvalidPart")
            if i < len(parts) - 1 and p.size < self.min_part_size:
                raise FsError(errno.EINVAL, f"part {number} is {p.size} bytes; every part "
                              f"but the last must be at least {self.min_part_size}",
                              reason="EntityTooSmall")
            chosen.append(p)
        segments, _ = split_key(up.key)
        self._check_put_allowed(ident, up.bucket, segments)
        path, fd = self.hot.new_temp()
        try:
            size = await asyncio.to_thread(self._concat, upload_id, chosen, fd)
            await asyncio.to_thread(os.fsync, fd)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        digest = hashlib.md5(b"".join(bytes.fromhex(p.etag) for p in chosen)).hexdigest()
        merged = dict(up.objmeta)
        merged.update(objmeta or {})
        inode = await self._install_put(ident, up.bucket, up.key, segments, path, size,
                                        f"{digest}-{len(chosen)}", merged)
        with self.meta.write() as tx:
            tx.delete_upload(upload_id)
            tx.delete_parts(upload_id)
        await asyncio.to_thread(shutil.rmtree, self._mpu_dir(upload_id), True)
        return inode

    def _concat(self, upload_id: str, parts: list[UploadPart], fd: int) -> int:
        pos = 0
        for p in parts:
            src = os.open(os.path.join(self._mpu_dir(upload_id), str(p.number)), os.O_RDONLY)
            try:
                copy_range(src, fd, 0, p.size, pos)
            finally:
                os.close(src)
            pos += p.size
        return pos
