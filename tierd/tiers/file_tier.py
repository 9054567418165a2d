"""``file:///path``: the embedded cold store, objects as plain files ``<root>/<bucket>/<key>``.

Zero configuration runs the cold tier here (``DATA_DIR/cold``).  The layout is the
transparent one every engine shares, so ``ls``, ``cp`` or an S3 server pointed at the same
directory (MinIO's file mode) see the objects as they are.

* **Atomic puts**: content goes to ``<root>/.tierd-tmp/<random>`` (same file system), is
  fsynced, then renamed over the key and the directory fsynced: a crash leaves the old object
  or the whole new one, never half of one.  Temp files older than an hour are removed when
  the store opens (a crash's leftovers; younger ones may belong to another node sharing the
  directory).
* **ETags** are the content MD5, kept in the xattr ``user.tierd.etag`` together with the size
  and mtime it was computed for.  A file written by someone else (or on a file system without
  user xattrs) gets a weak ETag ``<mtime_ns hex>-<size hex>``: it still changes when the
  content changes, and ``head`` never has to read a whole file.
* **No escape**: keys pass :func:`~tierd.tiers.object_tier.check_key` (no ``..``, no empty
  segment, no leading ``/``), and the final component is opened with ``O_NOFOLLOW``.
* **Deletes** remove directories left empty up to the bucket, as prefixes vanish in S3.
* **Holes stay holes**: an upload copies only the source's data extents (SEEK_DATA /
  SEEK_HOLE) and sets the size, so a sparse file costs the store what it costs the hot
  tier (the MD5 still covers the zeros).
* **A key the file system refuses** (a name or path over its limits: ENAMETOOLONG) is a
  :class:`~tierd.tiers.object_tier.KeyRejected` of that key, not an unavailable store.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import contextlib
import errno
import functools
import hashlib
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tierd.tiers.fileio import COPY_CHUNK, copy_range, fsync_dir, pwrite_all
from tierd.tiers.local_tier import data_ranges
from tierd.tiers.object_tier import (
    KEY_ERRNOS,
    MAX_LIST,
    InvalidKey,
    KeyConflict,
    KeyRejected,
    ListPage,
    ObjectChanged,
    ObjectInfo,
    ObjectNotFound,
    ObjectTier,
    Source,
    TierError,
    TierUnavailable,
    TransferOptions,
    check_key,
    check_list_args,
    check_range,
    each_key,
    split_ranges,
)
from tierd.tiers.tree_list import TreeEntry, TreeLister

TMP_DIR = ".tierd-tmp"
ETAG_XATTR = "user.tierd.etag"
_STALE_TMP_SECONDS = 3600


def _weak_etag(st: os.stat_result) -> str:
    return f"{st.st_mtime_ns:x}-{st.st_size:x}"


def _read_etag(fd_or_path: int | str, st: os.stat_result) -> str:
    """The MD5 ETag if the xattr was written for this very size and mtime, else weak."""
    try:
        raw = os.getxattr(fd_or_path, ETAG_XATTR)
        size_s, mtime_s, etag = raw.decode().split(":", 2)
        if int(size_s) == st.st_size and int(mtime_s) == st.st_mtime_ns and etag:
            return etag
    except (OSError, ValueError):
        pass
    return _weak_etag(st)


def _tag(fd: int, etag: str) -> str:
    """Record ``etag`` for the file's current size and mtime; returns the ETag ``head``
    will report (the weak one where xattrs are not supported)."""
    st = os.fstat(fd)
    try:
        os.setxattr(fd, ETAG_XATTR, f"{st.st_size}:{st.st_mtime_ns}:{etag}".encode())
    except OSError:
        return _weak_etag(st)
    return etag


class _SideError(Exception):
    """An ``OSError`` from one side of a copy: ``side`` is ``"src"`` or ``"dst"``.

    The engine needs to know whose fault it is: the cold store's (a ``TierUnavailable``) or
    the caller's descriptor (its ``OSError`` passes through, e.g. ENOSPC on the hot tier)."""

    def __init__(self, side: str, error: OSError) -> None:
        super().__init__(side, error)
        self.side = side
        self.error = error


#: errors of copy_file_range that can only come from the destination
_DST_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _pwrite_all(fd: int, data: bytes, pos: int) -> None:
    try:
        pwrite_all(fd, data, pos)
    except OSError as e:
        raise _SideError("dst", e) from None


def _pread(fd: int, n: int, pos: int) -> bytes:
    try:
        return os.pread(fd, n, pos)
    except OSError as e:
        raise _SideError("src", e) from None


Tick = Callable[[], None]


def _copy_range(src: int, dst: int, count: int, src_off: int, dst_off: int,
                stop: threading.Event | None = None, tick: Tick | None = None,
                digest: Callable[[bytes], object] | None = None) -> int:
    """:func:`~tierd.tiers.fileio.copy_range` raising :class:`_SideError`: the buffered
    path's faults by the call that failed, ``copy_file_range``'s by errno."""
    try:
        return copy_range(src, dst, count, src_off, dst_off,
                          stop=None if stop is None else stop.is_set, tick=tick, digest=digest,
                          read=_pread, write=_pwrite_all)
    except OSError as e:
        raise _SideError("dst" if e.errno in _DST_ERRNOS else "src", e) from None


_ZEROS = bytes(COPY_CHUNK)


def _extents(src: int, size: int) -> list[tuple[int, int]]:
    """The source's data extents within ``size`` (holes left out), read on a descriptor of
    its own: SEEK_DATA moves the file position, which the caller's may not share."""
    try:
        own = os.open(f"/proc/self/fd/{src}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return [(0, size)] if size else []
    try:
        return [(a, min(b, size)) for a, b in data_ranges(own, 0, size) if a < size]
    except OSError:
        return [(0, size)] if size else []
    finally:
        os.close(own)


def _copy_sparse(src: int, out: int, size: int, stop: threading.Event, tick: Tick,
                 md5: Any | None) -> int:
    """Copy the first ``size`` bytes of ``src`` into the empty file ``out``, leaving holes
    where ``src`` has them; feed every byte (zeros of holes too) to ``md5`` when given.
    Returns the bytes accounted for (``size`` unless stopped); a source shorter than
    ``size`` (before or after: holes are not bytes it promised) is the source's error."""
    _long_enough(src, size)
    pos = 0
    for start, end in [*_extents(src, size), (size, size)]:
        while pos < start and not stop.is_set():  # a hole: nothing written
            n = min(COPY_CHUNK, start - pos)
            if md5 is not None:
                md5.update(_ZEROS[:n])
            pos += n
            tick()
        while pos < end and not stop.is_set():
            n = min(COPY_CHUNK, end - pos)
            got = _copy_range(src, out, n, pos, pos,
                              digest=None if md5 is None else md5.update)
            if got == 0:
                return pos
            pos += got
            tick()
    if not stop.is_set():
        _long_enough(src, size)
        try:
            os.ftruncate(out, size)  # a trailing hole
        except OSError as e:
            raise _SideError("dst", e) from None
    return pos


def _long_enough(src: int, size: int) -> None:
    try:
        have = os.fstat(src).st_size
    except OSError as e:
        raise _SideError("src", e) from None
    if have < size:
        raise _SideError("src", OSError(errno.EIO, f"source has {have} bytes, expected {size}"))


class FileObjectTier(ObjectTier):
    """Objects as files under a local directory (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str], *,
                 transfer: TransferOptions | None = None) -> None:
        self.root = os.path.abspath(os.fspath(root))
        super().__init__("file://" + self.root, transfer)
        self.tmp = os.path.join(self.root, TMP_DIR)
        os.makedirs(self.tmp, exist_ok=True)
        self._clear_stale_temps()

    def _clear_stale_temps(self) -> None:
        limit = time.time() - _STALE_TMP_SECONDS
        for entry in os.scandir(self.tmp):
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_mtime < limit:
                    os.unlink(entry.path)

    def path(self, key: str) -> str:
        """The file holding ``key`` (validated: always inside the root)."""
        return os.path.join(self.root, *check_key(key).split("/"))

    # -- errors ------------------------------------------------------------------------------

    def _unavailable(self, e: OSError, what: str, key: str | None) -> TierError:
        """The store's failure -- or, for an errno of the key's path (a name too long), the
        key's (:class:`KeyRejected`: the store stays usable for every other key)."""
        msg = f"cold store {self.url}: cannot {what} {key or ''}: {e.strerror or e}"
        if e.errno in KEY_ERRNOS:
            return KeyRejected(msg, key=key)
        return TierUnavailable(msg, key=key)

    def _open_ro(self, key: str) -> int:
        try:
            # O_NONBLOCK: a FIFO someone left in the store must not hang a thread
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            return os.open(self.path(key), flags)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(f"no object {key!r} in {self.url}", key=key) from None
        except IsADirectoryError:
            raise ObjectNotFound(f"{key!r} is a prefix, not an object", key=key) from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ObjectNotFound(f"{key!r} is a symlink, not an object", key=key) from None
            raise self._unavailable(e, "read", key) from None

    def _info_fd(self, key: str, fd: int) -> ObjectInfo:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ObjectNotFound(f"{key!r} is not a regular file", key=key)
        return ObjectInfo(key, st.st_size, _read_etag(fd, st), st.st_mtime_ns)

    def _open_checked(self, key: str, if_match: str | None) -> tuple[int, ObjectInfo]:
        fd = self._open_ro(key)
        try:
            info = self._info_fd(key, fd)
            if if_match is not None and info.etag != if_match:
                raise ObjectChanged(
                    f"{key!r} changed: ETag {info.etag}, expected {if_match}", key=key
                )
        except BaseException:
            os.close(fd)
            raise
        return fd, info

    # -- operations --------------------------------------------------------------------------

    async def head(self, key: str) -> ObjectInfo | None:
        check_key(key)
        return await self._meta(self._head_sync, key)

    def _head_sync(self, key: str) -> ObjectInfo | None:
        try:
            fd = self._open_ro(key)
        except ObjectNotFound:
            return None
        try:
            return self._info_fd(key, fd)
        except ObjectNotFound:
            return None
        finally:
            os.close(fd)

    async def get_range(self, key: str, offset: int, length: int, *,
                        if_match: str | None = None) -> bytes:
        check_key(key)
        check_range(offset, length)
        return await self._run(self._get_range_sync, key, offset, length, if_match)

    def _get_range_sync(self, key: str, offset: int, length: int, if_match: str | None) -> bytes:
        fd, info = self._open_checked(key, if_match)
        try:
            n = max(0, min(length, info.size - offset))
            out = bytearray()
            while len(out) < n:
                piece = os.pread(fd, n - len(out), offset + len(out))
                if not piece:
                    break
                out += piece
            return bytes(out)
        except OSError as e:
            raise self._unavailable(e, "read", key) from None
        finally:
            os.close(fd)

    async def read_into(self, key: str, offset: int, length: int, fd: int, fd_offset: int, *,
                        if_match: str | None = None, range_size: int | None = None) -> int:
        check_key(key)
        check_range(offset, length)
        src, info = await self._open_owned(key, if_match)
        try:
            n = max(0, min(length, info.size - offset))
            if n == 0:
                return 0
            dst = os.dup(fd)
            try:
                jobs = [
                    functools.partial(_copy_range, src, dst, ln, o, fd_offset + (o - offset),
                                      tick=self.health.progress)
                    for o, ln in split_ranges(offset, n, range_size or self.transfer.range_size)
                ]
                return sum(await self._parallel(jobs))
            finally:
                os.close(dst)
        except _SideError as e:
            if e.side == "dst":
                raise e.error from None  # the caller's file (e.g. a full hot tier)
            raise self._unavailable(e.error, "read", key) from None
        finally:
            os.close(src)

    async def _open_owned(self, key: str, if_match: str | None) -> tuple[int, ObjectInfo]:
        """Open in a thread; if we are cancelled meanwhile, the descriptor the thread still
        returns is closed rather than leaked."""
        if self._closed:
            raise TierUnavailable(f"cold store {self.url} is closed")
        cf = self._pool.submit(self._open_checked, key, if_match)
        try:
            return await self._tracked(asyncio.wrap_future(cf))
        except asyncio.CancelledError:
            cf.add_done_callback(_close_result)
            raise

    async def put_file(self, key: str, source: Source, size: int, *,
                       md5_hex: str | None = None) -> ObjectInfo:
        check_key(key)
        try:
            job = functools.partial(self._put_from, key, source, size, md5_hex)
            return (await self._parallel([job]))[0]
        except _SideError as e:
            if e.side == "src":
                raise e.error from None  # the caller's file
            raise self._unavailable(e.error, "write", key) from None

    def _put_from(self, key: str, source: Source, size: int, md5_hex: str | None,
                  stop: threading.Event) -> ObjectInfo:
        """The source is opened (a path) or duplicated (a descriptor: ``_parallel`` waits
        for the job before the caller can close it) here, in the worker: on the event
        loop each was a system call that gave the GIL to the upload threads, and the loop
        waited to get it back (~180 us a file in a profile of a create burst's uploads)."""
        try:
            src = os.dup(source) if isinstance(source, int) else os.open(
                source, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise _SideError("src", e) from None
        try:
            return self._put_sync(key, src, size, md5_hex, stop)
        finally:
            os.close(src)

    def _put_sync(self, key: str, src: int, size: int, md5_hex: str | None,
                  stop: threading.Event) -> ObjectInfo:
        final = self.path(key)
        tmp = os.path.join(self.tmp, uuid.uuid4().hex)
        try:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise self._unavailable(e, "write", key) from None
        try:
            md5 = None if md5_hex is not None else hashlib.md5(usedforsecurity=False)
            done = _copy_sparse(src, out, size, stop, self.health.progress, md5)
            etag = md5_hex.lower() if md5_hex is not None else md5.hexdigest()  # type: ignore[union-attr]
            if stop.is_set():
                raise TierUnavailable(f"upload of {key!r} abandoned", key=key)
            if done != size:
                raise _SideError(
                    "src", OSError(errno.EIO, f"source has {done} bytes, expected {size}")
                )
            try:
                etag = _tag(out, etag)
                os.fsync(out)
                st = os.fstat(out)
            except OSError as e:
                raise self._unavailable(e, "write", key) from None
            os.close(out)
            out = -1
            self._install(tmp, final, key)
            return ObjectInfo(key, st.st_size, etag, st.st_mtime_ns)
        finally:
            if out >= 0:
                os.close(out)
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _install(self, tmp: str, final: str, key: str) -> None:
        """Rename a finished temp file over ``final`` and make the rename durable."""
        parent = os.path.dirname(final)
        try:
            os.makedirs(parent, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise KeyConflict(
                f"cannot store {key!r}: a parent path is an object in {self.url}", key=key
            ) from None
        except OSError as e:
            raise self._unavailable(e, "write", key) from None
        try:
            os.rename(tmp, final)
        except IsADirectoryError:
            raise KeyConflict(
                f"cannot store {key!r}: keys exist below it in {self.url}", key=key
            ) from None
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise KeyConflict(
                    f"cannot store {key!r}: keys exist below it in {self.url}", key=key
                ) from None
            raise self._unavailable(e, "write", key) from None
        with contextlib.suppress(OSError):
            fsync_dir(parent)

    async def delete(self, key: str) -> None:
        check_key(key)
        await self._meta(self._delete_sync, key)

    async def delete_many(self, keys: Sequence[str]) -> dict[str, TierError | None]:
        """One thread call for the batch, and each directory left synced once (a ``rm -r``
        of one directory's files: one ``fsync`` of it, not one per file)."""
        def run() -> dict[str, TierError | None]:
            dirs: set[str | None] = set()
            out = each_key(keys, lambda key: dirs.add(self._unlink(key)))
            for d in filter(None, dirs):
                with contextlib.suppress(OSError):
                    fsync_dir(d)
            return out

        return await self._meta(run)

    def _delete_sync(self, key: str) -> None:
        d = self._unlink(key)
        if d is not None:
            with contextlib.suppress(OSError):
                fsync_dir(d)

    def _unlink(self, key: str) -> str | None:
        """Remove ``key``'s file and the directories it leaves empty; the directory whose
        entries changed last (to sync), or None when there was nothing to remove."""
        p = self.path(key)
        try:
            if stat.S_ISDIR(os.lstat(p).st_mode):
                return None  # a prefix, not an object: nothing to delete
            os.unlink(p)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise self._unavailable(e, "delete", key) from None
        bucket_dir = os.path.join(self.root, key.split("/", 1)[0])
        d = os.path.dirname(p)
        while d != bucket_dir and d.startswith(bucket_dir + os.sep):
            try:
                os.rmdir(d)
            except OSError:
                break
            d = os.path.dirname(d)
        return d

    async def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        check_key(src_key)
        check_key(dst_key)
        job = functools.partial(self._copy_sync, src_key, dst_key)
        return (await self._parallel([job]))[0]  # no deadline: progress is tracked

    def _copy_sync(self, src_key: str, dst_key: str, stop: threading.Event) -> ObjectInfo:
        src, info = self._open_checked(src_key, None)
        tmp = os.path.join(self.tmp, uuid.uuid4().hex)
        out = -1
        try:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            done = _copy_sparse(src, out, info.size, stop, self.health.progress, None)
            if done != info.size:
                raise OSError(errno.EIO, f"{src_key!r} shrank while being copied")
            weak = info.etag == _weak_etag(os.fstat(src))
            etag = _weak_etag(os.fstat(out)) if weak else _tag(out, info.etag)
            os.fsync(out)
            st = os.fstat(out)
            os.close(out)
            out = -1
            self._install(tmp, self.path(dst_key), dst_key)
            return ObjectInfo(dst_key, st.st_size, etag, st.st_mtime_ns)
        except _SideError as e:
            raise self._unavailable(e.error, "copy", src_key) from None
        except OSError as e:
            raise self._unavailable(e, "copy", src_key) from None
        finally:
            os.close(src)
            if out >= 0:
                os.close(out)
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    async def list(self, prefix: str, start_after: str = "", delimiter: str = "",
                   limit: int = MAX_LIST) -> ListPage:
        check_list_args(prefix, delimiter, limit)
        return await self._meta(self._list_sync, prefix, start_after, delimiter, limit)

    def _list_sync(self, prefix: str, start_after: str, delimiter: str, limit: int) -> ListPage:
        try:
            lister = TreeLister(self._listdir, self._make_info)
            return lister.list(prefix, start_after, delimiter, limit)
        except OSError as e:
            raise self._unavailable(e, "list", prefix) from None

    def _listdir(self, rel: str) -> builtins.list[TreeEntry]:
        path = os.path.join(self.root, *rel.split("/")[:-1]) if rel else self.root
        out: builtins.list[TreeEntry] = []
        try:
            it = os.scandir(path)
        except (FileNotFoundError, NotADirectoryError):
            return out
        except OSError as err:
            if err.errno in KEY_ERRNOS:
                return out  # a prefix deeper than the file system takes holds no object
            raise
        with it:
            for e in it:
                if not rel and e.name.startswith("."):
                    continue  # housekeeping (.tierd-tmp), never a bucket
                try:
                    e.name.encode()
                except UnicodeEncodeError:
                    continue  # not UTF-8: cannot be a key
                # d_type answers these without a stat; symlinks are neither (never followed)
                if e.is_dir(follow_symlinks=False):
                    out.append(TreeEntry(e.name, True, None))
                elif e.is_file(follow_symlinks=False):
                    out.append(TreeEntry(e.name, False, e))
        return out

    def _make_info(self, key: str, entry: os.DirEntry[str]) -> ObjectInfo | None:
        """Stat only the entries a page returns (the lister skips the rest unstatted)."""
        try:
            check_key(key)
            st = entry.stat(follow_symlinks=False)
        except (InvalidKey, FileNotFoundError):
            return None
        return ObjectInfo(key, st.st_size, _read_etag(entry.path, st), st.st_mtime_ns)

    async def probe(self) -> None:
        def check() -> None:
            if not os.access(self.root, os.W_OK | os.X_OK):
                raise TierUnavailable(f"cold store {self.url} is not writable")

        await self._meta(check)


def _close_result(cf: concurrent.futures.Future[tuple[int, ObjectInfo]]) -> None:
    if not cf.cancelled() and cf.exception() is None:
        os.close(cf.result()[0])


def file_tier_from_url(url: str, transfer: TransferOptions | None = None) -> FileObjectTier:
    """``file:///abs/path`` (or ``file://relative``) to a :class:`FileObjectTier`."""
    rest = url.removeprefix("file://")
    if not rest:
        raise ValueError(f"cold URL {url!r} names no directory")
    return FileObjectTier(Path(rest), transfer=transfer)
