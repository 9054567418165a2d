"""``s3://bucket/prefix``: the cold tier on an S3 service (AWS, MinIO, Ceph RGW) via boto3.

Two layouts, both transparent:

* ``s3://cold/tierd`` (a bucket, optional prefix): tierd's ``photos/cat.jpg`` is
  ``s3://cold/tierd/photos/cat.jpg``; the bucket must exist (or ``create_bucket=True``).
* ``s3://`` (no bucket): every tierd bucket *is* an S3 bucket, ``photos/cat.jpg`` is
  ``s3://photos/cat.jpg``; buckets are created on first put.

Retries are botocore's (``standard`` or ``adaptive`` mode: exponential backoff with full
jitter on throttling, 5xx and connection errors, up to ``max_attempts`` tries), not a loop of
ours; what still fails after them is a :class:`TierUnavailable`.  boto3 is synchronous, so
every call runs on the tier's thread pool, and the HTTP connection pool is sized so that
``concurrency`` ranged GETs or part uploads really run in parallel.

Integrity: every single PUT and every part carries ``Content-MD5`` (the store rejects a
corrupted body), reads of several ranges are pinned to one ETag with ``If-Match``, and
multipart copies to the source's ETag with ``x-amz-copy-source-if-match``.  botocore's
newer default CRC trailers are turned off (``when_required``): MinIO/Ceph releases that
predate them reject them, and Content-MD5 already covers the body.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import datetime as dt
import functools
import hashlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from tierd.tiers.object_tier import (
    MAX_CHAR,
    MAX_LIST,
    InvalidKey,
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
    list_lower_bound,
    meta_threads,
    part_size_for,
    read_exact,
    split_ranges,
    write_dest,
)
from tierd.tiers.s3_errors import XML_UNSAFE, bare_503, code_error, delete_errors

_PIECE = 1 << 20
_MAX_SINGLE_COPY = 5 << 30


def _ns(when: dt.datetime | None) -> int:
    if when is None:
        return time.time_ns()
    return int(when.replace(microsecond=0).timestamp()) * 10**9 + when.microsecond * 1000


def _etag(raw: object) -> str:
    return str(raw or "").strip('"')


class S3ObjectTier(ObjectTier):
    """Objects in an S3 bucket under a prefix, or one S3 bucket per tierd bucket."""

    def __init__(
        self,
        bucket: str = "",
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        addressing: str = "auto",
        retry_mode: str = "standard",
        max_attempts: int = 5,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        create_bucket: bool = False,
        checksum: str = "crc32",
        transfer: TransferOptions | None = None,
    ) -> None:
        """``bucket=""`` selects one S3 bucket per tierd bucket.  Empty ``endpoint_url``,
        ``region`` or credentials fall back to boto3's own resolution (environment, config
        files, instance roles).  ``addressing``: ``auto``, ``path`` (MinIO, Ceph) or
        ``virtual``; ``retry_mode``: ``standard`` or ``adaptive`` (client-side rate limiting
        when throttled).  ``checksum``: how multipart parts are checked by the store —
        ``crc32`` (S3's flexible checksums: a CRC32 per part, declared at create, which
        lets the store combine the part checksums instead of hashing the whole object
        again at complete, the default) or ``md5`` (``Content-MD5`` per part, for stores
        without flexible checksums)."""
        if checksum not in ("crc32", "md5"):
            raise ValueError(f"checksum must be crc32 or md5, not {checksum!r}")
        self.checksum = checksum
        if addressing not in ("auto", "path", "virtual"):
            raise ValueError(f"addressing must be auto, path or virtual, not {addressing!r}")
        if retry_mode not in ("standard", "adaptive"):
            raise ValueError(f"retry_mode must be standard or adaptive, not {retry_mode!r}")
        prefix = prefix.strip("/")
        super().__init__(f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}", transfer)
        self.bucket = bucket
        self._pfx = prefix + "/" if prefix else ""
        self.endpoint_url = endpoint_url or None
        self.create_bucket = create_bucket or not bucket
        self._where = f"{self.url}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")
        self._client_args: dict[str, Any] = {
            "endpoint_url": self.endpoint_url,
            "region_name": region or None,
            "aws_access_key_id": access_key or None,
            "aws_secret_access_key": secret_key or None,
            "aws_session_token": session_token or None,
        }
        self._region = region
        conc = self.transfer.concurrency
        self._boto_config = BotoConfig(
            signature_version="s3v4",
            s3={"addressing_style": addressing},
            retries={"mode": retry_mode, "total_max_attempts": max(1, max_attempts)},
            max_pool_connections=2 * conc + meta_threads(conc) + 4,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            tcp_keepalive=True,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            user_agent_extra="tierd",
        )
        self._client_obj: Any = None
        self._probe_obj: Any = None
        self._client_lock = threading.Lock()

    # -- plumbing (all of it runs on pool threads) -------------------------------------------

    def _client(self) -> Any:
        """The boto3 client, made on first use (it takes ~100 ms: not in the constructor,
        which may run on the event loop).  botocore clients are thread-safe."""
        if self._client_obj is None:
            with self._client_lock:
                if self._client_obj is None:
                    session = boto3.session.Session()
                    self._client_obj = session.client(
                        "s3", config=self._boto_config, **self._client_args
                    )
        return self._client_obj

    def _loc(self, key: str) -> tuple[str, str]:
        if self.bucket:
            return self.bucket, self._pfx + key
        b, k = key.split("/", 1)
        return b, k

    def _translate(self, e: Exception, key: str | None, what: str) -> TierError:
        if isinstance(e, ClientError):
            err = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            msg = f"{what} {key or ''} in {self._where}: {code} {err.get('Message', '')}"
            return code_error(code, status, key, msg, self._where, self.bucket)
        if isinstance(e, TierError):
            return e
        # BotoCoreError (connection refused, timeouts, broken streams, no credentials) and
        # the socket/urllib3 errors a body read can raise
        return TierUnavailable(f"cold store {self._where} unreachable: {what} {key or ''}: {e}",
                               key=key)

    def _call(self, op: str, key: str | None, *, make_bucket: bool = False,
              **kwargs: Any) -> dict[str, Any]:
        """One S3 call with botocore's retries; errors translated.  ``make_bucket``: on
        NoSuchBucket create the bucket (when allowed) and try once more."""
        try:
            return cast(dict[str, Any], getattr(self._client(), op)(**kwargs))
        except (ClientError, BotoCoreError, OSError) as e:
            if (
                make_bucket
                and isinstance(e, ClientError)
                and e.response.get("Error", {}).get("Code") == "NoSuchBucket"
                and self.create_bucket
            ):
                self._make_bucket(kwargs["Bucket"])
                return self._call(op, key, **kwargs)
            raise self._translate(e, key, op) from None

    def _make_bucket(self, bucket: str) -> None:
        args: dict[str, Any] = {"Bucket": bucket}
        if self._region and self._region != "us-east-1":
            args["CreateBucketConfiguration"] = {"LocationConstraint": self._region}
        try:
            self._client().create_bucket(**args)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in (
                "BucketAlreadyOwnedByYou", "BucketAlreadyExists"
            ):
                raise self._translate(e, bucket, "create bucket") from None
        except (BotoCoreError, OSError) as e:
            raise self._translate(e, bucket, "create bucket") from None

    # -- head / reads ------------------------------------------------------------------------

    async def head(self, key: str) -> ObjectInfo | None:
        check_key(key)
        return await self._meta(self._head_sync, key)

    def _head_sync(self, key: str) -> ObjectInfo | None:
        b, k = self._loc(key)
        try:
            r = self._call("head_object", key, Bucket=b, Key=k)
        except ObjectNotFound:
            return None
        return ObjectInfo(key, int(r["ContentLength"]), _etag(r.get("ETag")),
                          _ns(r.get("LastModified")))

    def _get(self, key: str, start: int, length: int, if_match: str | None,
             sink: Callable[[int, bytes], None], stop: threading.Event) -> int:
        """GET ``length`` bytes at ``start`` and hand them to ``sink(relative_offset, data)``
        piece by piece; returns the bytes received (0 past the end)."""
        b, k = self._loc(key)
        args: dict[str, Any] = {"Bucket": b, "Key": k,
                                "Range": f"bytes={start}-{start + length - 1}"}
        if if_match is not None:
            args["IfMatch"] = f'"{if_match}"'
        try:
            r = self._client().get_object(**args)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "InvalidRange":
                return 0  # the range starts at or past the end
            raise self._translate(e, key, "get_object") from None
        except (BotoCoreError, OSError) as e:
            raise self._translate(e, key, "get_object") from None
        body = r["Body"]
        expected = int(r.get("ContentLength", length))
        done = 0
        try:
            while done < expected and not stop.is_set():
                try:
                    piece = body.read(min(_PIECE, expected - done))
                except Exception as e:
                    raise self._translate(e, key, "read") from None
                if not piece:
                    break
                sink(done, piece)
                done += len(piece)
                self.health.progress()
        finally:
            body.close()
        if done < expected and not stop.is_set():
            raise TierUnavailable(
                f"cold store {self._where}: {key!r} body ended after {done} of {expected} bytes",
                key=key,
            )
        return done

    async def _plan(self, key: str, offset: int, length: int, if_match: str | None,
                    range_size: int | None = None, *,
                    clamp: bool = True) -> tuple[int, str | None]:
        """Length to fetch and the ETag pinning the ranges.  One range needs no HEAD, and
        neither do several when ``if_match`` already pins the version and the length need
        not be ``clamp``ed to the size (``read_into``: a range past the end is just short or
        empty); otherwise a HEAD clamps the ranges and pins them."""
        if length <= (range_size or self.transfer.range_size):
            return length, if_match
        if if_match is not None and not clamp:
            return length, if_match
        info = await self.head(key)
        if info is None:
            raise ObjectNotFound(f"no object {key!r} in {self._where}", key=key)
        if if_match is not None and info.etag != if_match:
            raise ObjectChanged(f"{key!r} changed in {self._where}", key=key)
        return max(0, min(length, info.size - offset)), info.etag

    async def get_range(self, key: str, offset: int, length: int, *,
                        if_match: str | None = None) -> bytes:
        check_key(key)
        check_range(offset, length)
        if length == 0:
            if await self.head(key) is None:
                raise ObjectNotFound(f"no object {key!r} in {self._where}", key=key)
            return b""
        n, etag = await self._plan(key, offset, length, if_match)
        buf = bytearray(n)
        view = memoryview(buf)

        def job(o: int, ln: int, stop: threading.Event) -> int:
            def sink(rel: int, data: bytes) -> None:
                view[o - offset + rel : o - offset + rel + len(data)] = data

            return self._get(key, o, ln, etag, sink, stop)

        ranges = split_ranges(offset, n, self.transfer.range_size)
        total = sum(await self._parallel([functools.partial(job, o, ln) for o, ln in ranges]))
        with view:
            return bytes(view[:total])

    async def read_into(self, key: str, offset: int, length: int, fd: int, fd_offset: int, *,
                        if_match: str | None = None, range_size: int | None = None) -> int:
        check_key(key)
        check_range(offset, length)
        if length == 0:
            if await self.head(key) is None:
                raise ObjectNotFound(f"no object {key!r} in {self._where}", key=key)
            return 0
        n, etag = await self._plan(key, offset, length, if_match, range_size, clamp=False)
        def fetch(dst: int, o: int, ln: int, stop: threading.Event) -> int:
            def sink(rel: int, data: bytes) -> None:
                write_dest(dst, data, fd_offset + (o - offset) + rel)

            return self._get(key, o, ln, etag, sink, stop)

        return await self._fill(fd, offset, n, fetch, range_size)

    # -- writes ------------------------------------------------------------------------------

    async def put_file(self, key: str, source: Source, size: int, *,
                       md5_hex: str | None = None) -> ObjectInfo:
        check_key(key)
        if size < self.transfer.multipart_threshold:
            # opened or duplicated in the worker (``_parallel`` waits for the job before
            # the caller can close its descriptor): on the loop, the system call hands
            # the GIL to the upload threads and the loop waits to get it back
            job = functools.partial(self._put_single, key, source, size, md5_hex)
            return (await self._parallel([job]))[0]
        src = os.dup(source) if isinstance(source, int) else os.open(
            source, os.O_RDONLY | os.O_CLOEXEC
        )
        try:
            return await self._put_multipart(key, src, size)
        finally:
            os.close(src)

    def _put_single(self, key: str, source: Source, size: int, md5_hex: str | None,
                    stop: threading.Event) -> ObjectInfo:
        if isinstance(source, int):
            data = read_exact(source, 0, size)
        else:
            src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = read_exact(src, 0, size)
            finally:
                os.close(src)
        digest = bytes.fromhex(md5_hex) if md5_hex else hashlib.md5(
            data, usedforsecurity=False).digest()
        b, k = self._loc(key)
        r = self._call("put_object", key, make_bucket=True, Bucket=b, Key=k, Body=data,
                       ContentMD5=base64.b64encode(digest).decode())
        return ObjectInfo(key, size, _etag(r.get("ETag")), time.time_ns())

    async def _put_multipart(self, key: str, src: int, size: int) -> ObjectInfo:
        b, k = self._loc(key)
        crc = self.checksum == "crc32"
        algo: dict[str, Any] = {"ChecksumAlgorithm": "CRC32"} if crc else {}
        r = await self._run(functools.partial(
            self._call, "create_multipart_upload", key, make_bucket=True, Bucket=b, Key=k,
            **algo))
        upload_id = r["UploadId"]
        psize = part_size_for(size, self.transfer.part_size)

        def part(number: int, start: int, length: int, stop: threading.Event) -> dict[str, Any]:
            data = read_exact(src, start, length)
            check: dict[str, Any] = dict(algo) if crc else {"ContentMD5": base64.b64encode(
                hashlib.md5(data, usedforsecurity=False).digest()).decode()}
            # with ChecksumAlgorithm botocore computes the part's CRC32 (awscrt) and the
            # store verifies it, as it verifies Content-MD5
            pr = self._call("upload_part", key, Bucket=b, Key=k, UploadId=upload_id,
                            PartNumber=number, Body=data, **check)
            out = {"PartNumber": number, "ETag": pr["ETag"]}
            if crc:
                out["ChecksumCRC32"] = pr["ChecksumCRC32"]
            return out

        return await self._multipart(key, b, k, upload_id, size, psize, part)

    async def _multipart(
        self, key: str, b: str, k: str, upload_id: str, size: int, psize: int,
        part: Callable[[int, int, int, threading.Event], dict[str, Any]],
    ) -> ObjectInfo:
        """Run the parts of an upload in parallel and complete it; abort it on any failure
        (so no orphaned parts keep costing storage)."""
        jobs = [functools.partial(part, i + 1, o, ln)
                for i, (o, ln) in enumerate(split_ranges(0, size, psize))]
        try:
            parts = await self._parallel(jobs)
            r = await self._run(functools.partial(
                self._call, "complete_multipart_upload", key, Bucket=b, Key=k,
                UploadId=upload_id, MultipartUpload={"Parts": parts}))
        except BaseException:
            await self._quietly(functools.partial(self._abort, b, k, upload_id))
            raise
        return ObjectInfo(key, size, _etag(r.get("ETag")), time.time_ns())

    def _abort(self, b: str, k: str, upload_id: str) -> None:
        # best effort: a lifecycle rule (AbortIncompleteMultipartUpload) cleans up the rest
        with contextlib.suppress(Exception):
            self._client().abort_multipart_upload(Bucket=b, Key=k, UploadId=upload_id)

    async def _quietly(self, fn: Callable[[], None]) -> None:
        # cancelled again, or closed: never mask the error being raised
        with contextlib.suppress(BaseException):
            await self._run(fn)

    async def delete(self, key: str) -> None:
        check_key(key)
        b, k = self._loc(key)
        with contextlib.suppress(ObjectNotFound):  # per-bucket layout, no bucket: nothing there
            await self._meta(functools.partial(self._call, "delete_object", key, Bucket=b, Key=k))

    async def delete_many(self, keys: Sequence[str]) -> dict[str, TierError | None]:
        """``DeleteObjects`` (Quiet: only failures are listed) per bucket, 1000 keys a
        request; a key XML 1.0 cannot carry (a control character) goes alone as a
        ``DeleteObject``.  Per-key errors are mapped as :meth:`delete` maps them."""
        out: dict[str, TierError | None] = {}
        groups: dict[str, dict[str, str]] = {}
        for key in keys:
            try:
                check_key(key)
            except InvalidKey as e:
                out[key] = e
                continue
            if XML_UNSAFE.search(key):
                out.update(await super().delete_many([key]))
                continue
            b, k = self._loc(key)
            groups.setdefault(b, {})[k] = key
        for b, names in groups.items():
            items = list(names.items())
            for i in range(0, len(items), MAX_LIST):
                chunk = dict(items[i : i + MAX_LIST])
                try:
                    out.update(await self._meta(functools.partial(
                        self._delete_objects, b, chunk)))
                except TierUnavailable:
                    raise
                except TierError as e:  # the request's, not the store's: every key's
                    out.update(dict.fromkeys(chunk.values(), e))
        return out

    def _delete_objects(self, b: str, names: dict[str, str]) -> dict[str, TierError | None]:
        """One ``DeleteObjects`` of ``names`` (S3 name -> tierd key) in bucket ``b``."""
        request = {"Objects": [{"Key": k} for k in names], "Quiet": True}
        try:
            r = self._call("delete_objects", None, Bucket=b, Delete=request)
        except ObjectNotFound:  # per-bucket layout, no bucket: nothing there
            r = {}
        return delete_errors(r.get("Errors", []), names, self._where, self.bucket)

    async def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        check_key(src_key)
        check_key(dst_key)
        info = await self.head(src_key)
        if info is None:
            raise ObjectNotFound(f"no object {src_key!r} in {self._where}", key=src_key)
        sb, sk = self._loc(src_key)
        db, dk = self._loc(dst_key)
        source = {"Bucket": sb, "Key": sk}
        if info.size < min(self.transfer.multipart_threshold, _MAX_SINGLE_COPY + 1):
            r = await self._run(functools.partial(
                self._call, "copy_object", dst_key, make_bucket=True, Bucket=db, Key=dk,
                CopySource=source, CopySourceIfMatch=f'"{info.etag}"'))
            res = r.get("CopyObjectResult", {})
            return ObjectInfo(dst_key, info.size, _etag(res.get("ETag")),
                              _ns(res.get("LastModified")))
        r = await self._run(functools.partial(
            self._call, "create_multipart_upload", dst_key, make_bucket=True, Bucket=db, Key=dk))
        upload_id = r["UploadId"]

        def part(number: int, start: int, length: int, stop: threading.Event) -> dict[str, Any]:
            pr = self._call("upload_part_copy", dst_key, Bucket=db, Key=dk, UploadId=upload_id,
                            PartNumber=number, CopySource=source,
                            CopySourceRange=f"bytes={start}-{start + length - 1}",
                            CopySourceIfMatch=f'"{info.etag}"')
            return {"PartNumber": number, "ETag": pr["CopyPartResult"]["ETag"]}

        psize = part_size_for(info.size, self.transfer.part_size)
        return await self._multipart(dst_key, db, dk, upload_id, info.size, psize, part)

    # -- listing -----------------------------------------------------------------------------

    async def list(self, prefix: str, start_after: str = "", delimiter: str = "",
                   limit: int = MAX_LIST) -> ListPage:
        check_list_args(prefix, delimiter, limit)
        lo = list_lower_bound(prefix, start_after, delimiter)
        if self.bucket:
            return await self._meta(self._list_in, self.bucket, self._pfx, "", prefix, lo,
                                    delimiter, limit)
        if "/" in prefix:
            b = prefix.split("/", 1)[0]
            return await self._meta(self._list_in, b, "", b + "/", prefix, lo, delimiter, limit)
        return await self._meta(self._list_buckets, prefix, lo, delimiter, limit)

    def _list_in(self, bucket: str, strip: str, add: str, prefix: str, lo: str,
                 delimiter: str, limit: int) -> ListPage:
        """One ListObjectsV2 page in ``bucket``.  The tierd key of S3 key ``s`` is
        ``add + s[len(strip):]``: prefix layout strips the tier prefix, per-bucket layout
        adds the bucket name."""
        args: dict[str, Any] = {"Bucket": bucket, "MaxKeys": limit,
                                "Prefix": strip + prefix[len(add):] if prefix.startswith(add)
                                else strip}
        if delimiter:
            args["Delimiter"] = delimiter
        if lo.startswith(add):
            args["StartAfter"] = strip + lo[len(add):]
        elif lo > add:
            return ListPage([], [], False)  # every key here sorts before lo
        try:
            r = self._call("list_objects_v2", prefix, **args)
        except ObjectNotFound:
            return ListPage([], [], False)  # per-bucket layout: no such bucket
        objects = [
            ObjectInfo(add + o["Key"][len(strip):], int(o["Size"]), _etag(o.get("ETag")),
                       _ns(o.get("LastModified")))
            for o in r.get("Contents", [])
            if o["Key"].startswith(strip)
        ]
        prefixes = [add + p["Prefix"][len(strip):] for p in r.get("CommonPrefixes", [])]
        return ListPage(objects, prefixes, bool(r.get("IsTruncated")))

    def _list_buckets(self, prefix: str, lo: str, delimiter: str, limit: int) -> ListPage:
        """A listing spanning S3 buckets (per-bucket layout, prefix without ``/``)."""
        if delimiter not in ("", "/"):
            raise InvalidKey("a listing across S3 buckets takes delimiter '/' or none",
                             key=prefix)
        r = self._call("list_buckets", None)
        names = sorted(b["Name"] for b in r.get("Buckets", []) if b["Name"].startswith(prefix))
        objects: builtins.list[ObjectInfo] = []
        prefixes: builtins.list[str] = []
        for name in names:
            top = name + "/"
            if top + MAX_CHAR <= lo:
                continue
            room = limit - len(objects) - len(prefixes)
            if room == 0:
                return ListPage(objects, prefixes, True)
            page = self._list_in(name, "", top, prefix, lo, "", 1 if delimiter else room)
            if delimiter:
                if page.objects:
                    prefixes.append(top)  # a bucket with keys is one common prefix
                continue
            objects.extend(page.objects)
            if page.truncated:
                return ListPage(objects, prefixes, True)
        return ListPage(objects, prefixes, False)

    async def probe(self) -> None:
        """One try, no retries (a client of its own): a probe asks whether the store answers
        now, and a hung store must not keep its thread for every retry's timeout.  A bare
        503 to the HEAD (:func:`~tierd.tiers.s3_errors.bare_503`) is asked again with a
        listing of one key, whose error's code tells throttling from a store that is down."""
        def check() -> None:
            try:
                if not self.bucket:
                    self._probe_client().list_buckets()
                    return
                try:
                    self._probe_client().head_bucket(Bucket=self.bucket)
                except ClientError as e:
                    if not bare_503(e.response):
                        raise
                    self._probe_client().list_objects_v2(Bucket=self.bucket, MaxKeys=1,
                                                         Prefix=self._pfx)
            except (ClientError, BotoCoreError, OSError) as e:
                err = self._translate(e, None, "probe")
                if not isinstance(err, ObjectNotFound):
                    raise err from None
                if not self.create_bucket:
                    raise TierUnavailable(
                        f"cold bucket {self.bucket!r} does not exist at {self._where}"
                    ) from None
                self._make_bucket(self.bucket)

        await self._meta(check)

    def _probe_client(self) -> Any:
        if self._probe_obj is None:
            with self._client_lock:
                if self._probe_obj is None:
                    config = self._boto_config.merge(BotoConfig(
                        retries={"mode": "standard", "total_max_attempts": 1}))
                    self._probe_obj = boto3.session.Session().client(
                        "s3", config=config, **self._client_args)
        return self._probe_obj

    async def close(self) -> None:
        await super().close()
        for client in (self._client_obj, self._probe_obj):
            if client is not None:
                client.close()
        self._client_obj = self._probe_obj = None


def s3_tier_from_url(url: str, transfer: TransferOptions | None = None,
                     **settings: Any) -> S3ObjectTier:
    """``s3://bucket/prefix`` or ``s3://`` (one S3 bucket per tierd bucket)."""
    rest = url.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    return S3ObjectTier(bucket, prefix, transfer=transfer, **settings)
