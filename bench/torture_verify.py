"""What the crash-torture harness reads after each restart (see ``bench/torture.py``): every
key through S3 and through the mount, both listings, lookups of deleted keys, and the cold
store directly (the ``file://`` directory, or the S3 bucket with boto3).

Every read has a deadline (:func:`bounded`): a read that hangs is a violation, not a hung
harness.  A timed-out FUSE read leaves its thread blocked until the daemon dies at the next
kill, which aborts the request (threads are daemonic: they never hold up the exit).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from torture_model import Seen

T = TypeVar("T")


class Hung(Exception):
    """A bounded call did not return in time."""


def bounded(fn: Callable[[], T], timeout: float) -> T:
    """``fn()`` in a daemon thread; :class:`Hung` after ``timeout`` seconds."""
    box: queue.Queue[tuple[bool, Any]] = queue.Queue(1)

    def run() -> None:
        try:
            box.put((True, fn()))
        except BaseException as e:
            box.put((False, e))

    threading.Thread(target=run, daemon=True, name="bounded").start()
    try:
        ok, value = box.get(timeout=timeout)
    except queue.Empty:
        raise Hung(f"no answer in {timeout:g} s") from None
    if ok:
        return value  # type: ignore[no-any-return]
    raise value


def _error_code(e: Exception) -> str:
    resp = getattr(e, "response", None)
    if isinstance(resp, dict):
        return str(resp.get("Error", {}).get("Code") or
                   resp.get("ResponseMetadata", {}).get("HTTPStatusCode"))
    return f"{type(e).__name__}: {e}"[:200]


class Doors:
    """Reads of the bucket ``bucket`` through the S3 door (``s3``, a boto3 client) and the
    mount (``root`` = the bucket's directory in it)."""

    def __init__(self, s3: Any, bucket: str, root: Path, timeout: float) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.root = root
        self.timeout = timeout

    def _guard(self, fn: Callable[[], Seen]) -> Seen:
        try:
            return bounded(fn, self.timeout)
        except Hung:
            return Seen(True, error="hang")

    def s3_get(self, key: str) -> Seen:
        def get() -> Seen:
            try:
                r = self.s3.get_object(Bucket=self.bucket, Key=key)
                data = r["Body"].read()
            except Exception as e:
                code = _error_code(e)
                if code in ("NoSuchKey", "404"):
                    return Seen(False)
                if "timed out" in code.lower():
                    return Seen(True, error="hang")
                return Seen(True, error=f"GET: {code}")
            if len(data) != r["ContentLength"]:
                return Seen(True, error=f"GET: {len(data)} of {r['ContentLength']} bytes")
            return Seen(True, data, etag=r["ETag"].strip('"'))

        return self._guard(get)

    def s3_head(self, key: str) -> Seen:
        def head() -> Seen:
            try:
                r = self.s3.head_object(Bucket=self.bucket, Key=key)
            except Exception as e:
                code = _error_code(e)
                if code in ("NoSuchKey", "404"):
                    return Seen(False)
                return Seen(True, error=f"HEAD: {code}")
            return Seen(True, etag=r["ETag"].strip('"'))

        return self._guard(head)

    def fuse_read(self, key: str) -> Seen:
        def read() -> Seen:
            try:
                with open(self.root / key, "rb") as f:
                    return Seen(True, f.read())
            except FileNotFoundError:
                return Seen(False)
            except OSError as e:
                return Seen(True, error=f"read: {e}")

        return self._guard(read)

    def fuse_stat(self, key: str) -> Seen:
        def stat() -> Seen:
            try:
                os.stat(self.root / key)
            except FileNotFoundError:
                return Seen(False)
            except OSError as e:
                return Seen(True, error=f"stat: {e}")
            return Seen(True)

        return self._guard(stat)

    def s3_list(self) -> dict[str, tuple[int, str]]:
        """Every object of the bucket (ListObjectsV2, no delimiter) -> (size, ETag);
        empty directories, which S3 lists as ``dir/`` markers, are left out."""
        def listing() -> dict[str, tuple[int, str]]:
            out: dict[str, tuple[int, str]] = {}
            pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
            for page in pages:
                for o in page.get("Contents", []):
                    if not o["Key"].endswith("/"):  # an empty directory made by mkdir
                        out[o["Key"]] = (int(o["Size"]), o["ETag"].strip('"'))
            return out

        return bounded(listing, self.timeout * 3)

    def fuse_list(self) -> dict[str, int]:
        """Every regular file under the bucket's directory -> size."""
        def walk() -> dict[str, int]:
            out: dict[str, int] = {}
            for dirpath, _dirs, files in os.walk(self.root):
                for name in files:
                    p = Path(dirpath) / name
                    out[str(p.relative_to(self.root))] = os.stat(p).st_size
            return out

        return bounded(walk, self.timeout * 3)


def cold_file(root: Path, bucket: str) -> dict[str, Seen]:
    """A ``file://`` cold store's objects of ``bucket`` (its directory ``root/bucket``)."""
    out: dict[str, Seen] = {}
    base = root / bucket
    for dirpath, _dirs, files in os.walk(base):
        for name in files:
            p = Path(dirpath) / name
            out[str(p.relative_to(base))] = Seen(True, p.read_bytes(),
                                                 written=p.stat().st_mtime)
    return out


def cold_s3(client: Any, cold_bucket: str, prefix: str, bucket: str) -> dict[str, Seen]:
    """An ``s3://`` cold store's objects of ``bucket`` (keys ``prefix/bucket/...``), read
    with boto3 straight from the store."""
    base = f"{prefix}/{bucket}/"
    out: dict[str, Seen] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=cold_bucket,
                                                                  Prefix=base):
        for o in page.get("Contents", []):
            key = o["Key"][len(base):]
            if key.endswith("/"):
                continue  # a directory marker names no file
            body = client.get_object(Bucket=cold_bucket, Key=o["Key"])["Body"].read()
            out[key] = Seen(True, body, etag=o["ETag"].strip('"'),
                            written=o["LastModified"].timestamp())
    return out
