"""Any other fsspec URL as the cold tier (``memory://`` in tests, ``gcs://``, ``az://`` ...).

The generic engine: correct on every fsspec file system, tuned for none.  ``file://`` and
``s3://`` have native engines; use this for stores tierd does not know.

* Layout: the object ``<bucket>/<key>`` is the path ``<url path>/<bucket>/<key>``.
* ETags: the store's own (``ETag``/``etag``/``md5``/``md5Hash`` in the file info) where it has
  one, else a weak ``<mtime_ns hex>-<size hex>`` from the info's modification time (µs).
* ``if_match`` is checked with a metadata call before reading: best effort, since fsspec has
  no conditional read.  Writes are as atomic as the file system's ``open("wb")`` (object
  stores commit at close; the memory file system too).
* Listing walks directories with the shared :class:`~tierd.tiers.tree_list.TreeLister`.
"""

from __future__ import annotations

import builtins
import datetime as dt
import functools
import os
import threading
from collections.abc import Sequence
from typing import Any

import fsspec

from tierd.tiers.object_tier import (
    KEY_ERRNOS,
    MAX_LIST,
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
    read_exact,
    split_ranges,
    write_dest,
)
from tierd.tiers.tree_list import TreeEntry, TreeLister

_WRITE_CHUNK = 8 << 20


def _mtime_ns(info: dict[str, Any]) -> int:
    for name in ("mtime", "LastModified", "last_modified", "updated", "created"):
        v = info.get(name)
        if isinstance(v, dt.datetime):
            if v.tzinfo is None:
                v = v.replace(tzinfo=dt.UTC)
            return int(v.replace(microsecond=0).timestamp()) * 10**9 + v.microsecond * 1000
        if isinstance(v, int | float) and not isinstance(v, bool):
            return round(float(v) * 1e6) * 1000
        if isinstance(v, str) and v:
            try:
                return _mtime_ns({"t": dt.datetime.fromisoformat(v.replace("Z", "+00:00"))})
            except ValueError:
                continue
    return 0


def _info_etag(info: dict[str, Any]) -> str:
    for name in ("ETag", "etag", "md5", "md5Hash"):
        v = info.get(name)
        if isinstance(v, str) and v:
            return v.strip('"')
    return f"{_mtime_ns(info):x}-{int(info.get('size') or 0):x}"


class FsspecObjectTier(ObjectTier):
    """Objects as files of an fsspec file system (see the module docstring)."""

    def __init__(self, url: str, *, transfer: TransferOptions | None = None,
                 **storage_options: Any) -> None:
        """``storage_options`` go to the fsspec file system (credentials, endpoints)."""
        super().__init__(url, transfer)
        self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        self.root = str(root).rstrip("/")

    def path(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def _err(self, e: Exception, key: str | None, what: str) -> TierError:
        if isinstance(e, TierError):
            return e
        if isinstance(e, FileNotFoundError):
            return ObjectNotFound(f"no object {key!r} in {self.url}", key=key)
        if isinstance(e, OSError) and e.errno in KEY_ERRNOS:
            return KeyRejected(f"cold store {self.url} cannot take {key!r}: {e}", key=key)
        return TierUnavailable(f"cold store {self.url}: cannot {what} {key or ''}: {e}", key=key)

    def _info(self, key: str) -> ObjectInfo:
        try:
            info = self.fs.info(self.path(key))
        except Exception as e:
            raise self._err(e, key, "stat") from None
        if info.get("type") != "file":
            raise ObjectNotFound(f"{key!r} is a prefix, not an object", key=key)
        return ObjectInfo(key, int(info.get("size") or 0), _info_etag(info), _mtime_ns(info))

    def _checked(self, key: str, if_match: str | None) -> ObjectInfo:
        info = self._info(key)
        if if_match is not None and info.etag != if_match:
            raise ObjectChanged(f"{key!r} changed: ETag {info.etag}, expected {if_match}",
                                key=key)
        return info

    def _cat(self, key: str, start: int, end: int) -> bytes:
        try:
            return bytes(self.fs.cat_file(self.path(key), start=start, end=end))
        except Exception as e:
            raise self._err(e, key, "read") from None

    async def head(self, key: str) -> ObjectInfo | None:
        check_key(key)
        try:
            return await self._meta(self._info, key)
        except ObjectNotFound:
            return None

    async def get_range(self, key: str, offset: int, length: int, *,
                        if_match: str | None = None) -> bytes:
        check_key(key)
        check_range(offset, length)
        info = await self._run(self._checked, key, if_match)
        n = max(0, min(length, info.size - offset))
        ranges = split_ranges(offset, n, self.transfer.range_size)
        jobs = [functools.partial(self._cat_job, key, o, ln) for o, ln in ranges]
        return b"".join(await self._parallel(jobs))

    def _cat_job(self, key: str, start: int, length: int, stop: threading.Event) -> bytes:
        return self._cat(key, start, start + length)

    async def read_into(self, key: str, offset: int, length: int, fd: int, fd_offset: int, *,
                        if_match: str | None = None, range_size: int | None = None) -> int:
        check_key(key)
        check_range(offset, length)
        info = await self._run(self._checked, key, if_match)
        n = max(0, min(length, info.size - offset))
        def fetch(dst: int, start: int, ln: int, stop: threading.Event) -> int:
            data = self._cat(key, start, start + ln)
            write_dest(dst, data, fd_offset + (start - offset))
            return len(data)

        return await self._fill(fd, offset, n, fetch, range_size)

    async def put_file(self, key: str, source: Source, size: int, *,
                       md5_hex: str | None = None) -> ObjectInfo:
        check_key(key)
        src = os.dup(source) if isinstance(source, int) else os.open(
            source, os.O_RDONLY | os.O_CLOEXEC
        )
        try:
            job = functools.partial(self._put_sync, key, src, size)
            return (await self._parallel([job]))[0]
        finally:
            os.close(src)

    def _put_sync(self, key: str, src: int, size: int, stop: threading.Event) -> ObjectInfo:
        # read_exact's OSError is the caller's source file and passes through unchanged;
        # fsspec's own failures go through _guard and become TierUnavailable
        path = self.path(key)
        if size < self.transfer.multipart_threshold:
            self._guard(self.fs.pipe_file, path, read_exact(src, 0, size))
            return self._info(key)
        f = self._guard(self.fs.open, path, "wb", block_size=self.transfer.part_size)
        try:
            done = 0
            while done < size:
                if stop.is_set():
                    raise TierUnavailable(f"upload of {key!r} abandoned", key=key)
                data = read_exact(src, done, min(_WRITE_CHUNK, size - done))
                self._guard(f.write, data)
                done += len(data)
                self.health.progress()
        except BaseException:
            # discard rather than commit a partial object where fsspec allows it
            if hasattr(f, "discard"):
                f.discard()
            raise
        self._guard(f.close)
        return self._info(key)

    def _guard(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call into fsspec; its failures are the store's (TierUnavailable)."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if isinstance(e, OSError) and e.errno in KEY_ERRNOS:
                raise KeyRejected(f"cold store {self.url} cannot take this key: {e}") from None
            raise TierUnavailable(f"cold store {self.url}: write failed: {e}") from None

    async def delete(self, key: str) -> None:
        check_key(key)
        await self._meta(self._rm, key)

    async def delete_many(self, keys: Sequence[str]) -> dict[str, TierError | None]:
        """One thread call for the batch; fsspec's bulk ``rm`` would not tell which key
        failed, so it is a loop of :meth:`_rm` there."""
        return await self._meta(each_key, keys, self._rm)

    def _rm(self, key: str) -> None:
        try:
            self.fs.rm_file(self.path(key))
        except FileNotFoundError:
            pass
        except Exception as e:
            raise self._err(e, key, "delete") from None

    async def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        check_key(src_key)
        check_key(dst_key)

        def cp() -> ObjectInfo:
            self._info(src_key)  # ObjectNotFound before the file system's own error
            try:
                self.fs.copy(self.path(src_key), self.path(dst_key))
            except Exception as e:
                raise self._err(e, src_key, "copy") from None
            return self._info(dst_key)

        return await self._run(cp)

    async def list(self, prefix: str, start_after: str = "", delimiter: str = "",
                   limit: int = MAX_LIST) -> ListPage:
        check_list_args(prefix, delimiter, limit)

        def run() -> ListPage:
            try:
                lister = TreeLister(self._listdir, self._make_info)
                return lister.list(prefix, start_after, delimiter, limit)
            except TierError:
                raise
            except Exception as e:
                raise self._err(e, prefix, "list") from None

        return await self._meta(run)

    def _listdir(self, rel: str) -> builtins.list[TreeEntry]:
        path = f"{self.root}/{rel}".rstrip("/") if rel or self.root else ""
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
        out = []
        for info in entries:
            name = str(info["name"]).rstrip("/").rsplit("/", 1)[-1]
            if not rel and name.startswith("."):
                continue
            out.append(TreeEntry(name, info.get("type") == "directory", info))
        return out

    def _make_info(self, key: str, info: dict[str, Any]) -> ObjectInfo | None:
        try:
            check_key(key)
        except TierError:
            return None
        return ObjectInfo(key, int(info.get("size") or 0), _info_etag(info), _mtime_ns(info))
