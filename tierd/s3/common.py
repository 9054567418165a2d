"""What every handler shares: the request context, object headers in and out, conditionals,
ranges and copy sources."""

from __future__ import annotations

import email.utils
import errno
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import unquote

from aiohttp import web
from multidict import CIMultiDictProxy, MultiDictProxy

from tierd import preconditions
from tierd.acl import Identity, canned
from tierd.acl.authorize import PolicyStore
from tierd.acl.keys import KeyStore, Owner
from tierd.errors import FsError
from tierd.meta import EMPTY_MD5, Bucket
from tierd.namespace.api import Inode, NamespaceAPI, valid_vid
from tierd.s3 import checksums, tagset
from tierd.s3.errors import S3Error
from tierd.s3.xmlio import el

if TYPE_CHECKING:
    from tierd.s3.auth import Auth, Authenticator

DEFAULT_CONTENT_TYPE = "binary/octet-stream"
MAX_USER_METADATA = 2048  # bytes of x-amz-meta-* names and values, as AWS
MAX_PUT_SIZE = 5 << 30  # one PUT or one part
#: objmeta keys stored and returned as the same HTTP headers
STORED_HEADERS = ("content-type", "content-encoding", "content-disposition", "cache-control",
                  "content-language", "expires")
#: internal objmeta keys (never returned as headers)
META_PARTS = "tierd.s3.parts"  # multipart layout: "size*count,size*count"
META_MPU_ALGORITHM = "tierd.s3.checksum-algorithm"  # in-progress upload: checksum algorithm
META_MPU_TYPE = "tierd.s3.checksum-type"  # in-progress upload: COMPOSITE or FULL_OBJECT
STORAGE_CLASSES = ("STANDARD", "REDUCED_REDUNDANCY", "STANDARD_IA", "ONEZONE_IA",
                   "INTELLIGENT_TIERING", "GLACIER", "DEEP_ARCHIVE", "OUTPOSTS", "GLACIER_IR",
                   "SNOW", "EXPRESS_ONEZONE")


@dataclass
class S3State:
    """Everything the handlers need, shared by all requests."""

    ns: NamespaceAPI
    keys: KeyStore
    auth: Authenticator
    policies: PolicyStore
    region: str
    domains: tuple[str, ...] = ()
    #: seconds before a long CompleteMultipartUpload's answer starts (s3_complete_keepalive)
    complete_keepalive: float = 10.0


@dataclass
class Ctx:
    """One request: who asks, for what."""

    request: web.Request
    state: S3State
    request_id: str
    bucket: str = ""
    key: str = ""
    auth: Auth | None = None
    #: who the namespace sees: the key's identity, with a policy's grant when one allowed
    #: the request (set by :func:`tierd.s3.access.authorize_request` before the handler)
    identity: Identity | None = None
    #: the same for the source of CopyObject/UploadPartCopy, judged separately
    src_identity: Identity | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    #: a streamed response that has sent its headers: errors can no longer be answered
    stream: web.StreamResponse | None = None
    #: the record of ``bucket`` as :func:`tierd.s3.access.authorize_request` read it (None:
    #: no such bucket), when ``bucket_read``: the request's later questions about its
    #: bucket (is it versioned?) need no metadata transaction of their own
    bucket_record: Bucket | None = None
    bucket_read: bool = False

    @property
    def started(self) -> bool:
        return self.stream is not None

    @property
    def ns(self) -> NamespaceAPI:
        return self.state.ns

    @property
    def verified(self) -> Auth | None:
        """The request's signature; None for an anonymous (unsigned) request."""
        return self.auth

    @property
    def anonymous(self) -> bool:
        return self.auth is None

    @property
    def caller(self) -> Identity:
        """The requester's own identity (anonymous when unsigned), before any policy."""
        return self.auth.identity if self.auth is not None else Identity.ANONYMOUS

    @property
    def ident(self) -> Identity:
        return self.identity if self.identity is not None else self.caller

    @property
    def src_ident(self) -> Identity:
        return self.src_identity if self.src_identity is not None else self.ident

    @property
    def query(self) -> MultiDictProxy[str]:
        return self.request.rel_url.query

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self.request.headers

    def owner(self, uid: int) -> Owner:
        return self.state.keys.owner(uid)

    def owner_xml(self, uid: int, tag: str = "Owner") -> str:
        o = self.owner(uid)
        return f"<{tag}>{el('ID', o.id)}{el('DisplayName', o.display_name)}</{tag}>"


# -- times and ETags ---------------------------------------------------------------------

def bucket_doc(ctx: Ctx, name: str, bucket: str | None = None) -> str | None:
    """The configuration document ``name`` of ``bucket`` (the request's by default; None
    when unset; ENOENT without the bucket): the request's own bucket from the record its
    authorization read, with no metadata transaction of its own."""
    bucket = bucket or ctx.bucket
    if not (ctx.bucket_read and bucket == ctx.bucket):
        return ctx.ns.bucket_config.get(bucket, name)
    if ctx.bucket_record is None:
        raise FsError(errno.ENOENT, f"bucket {bucket!r} does not exist")
    return ctx.bucket_record.config.get(name)


def http_date(ns: int) -> str:
    return email.utils.formatdate(ns // 1_000_000_000, usegmt=True)


def parse_http_date(value: str) -> float | None:
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


def etag_of(inode: Inode) -> str:
    return inode.etag or EMPTY_MD5


def quoted(etag: str) -> str:
    return f'"{etag}"'


# -- object metadata in ------------------------------------------------------------------

def reject_unsupported_headers(h: CIMultiDictProxy[str]) -> None:
    """Headers asking for features tierd does not have: refuse rather than ignore."""
    sse = h.get("x-amz-server-side-encryption")
    if sse is not None or any(k.lower().startswith("x-amz-server-side-encryption-customer")
                              for k in h):
        raise S3Error("NotImplemented", "server-side encryption is not supported by tierd")
    for name in ("x-amz-object-lock-mode", "x-amz-object-lock-retain-until"
                 "-date", "x-amz-object-lock-legal-hold", "x-amz-website-redirect-location"):
        if name in h:
            raise S3Error("NotImplemented", f"the {name} header is not supported by tierd")
    canned_acl(h)
    sc = h.get("x-amz-storage-class")
    if sc is not None and sc != "STANDARD":
        if sc not in STORAGE_CLASSES:
            raise S3Error("InvalidStorageClass", StorageClassRequested=sc)
        raise S3Error("NotImplemented", f"storage class {sc} is not supported; tierd stores "
                      "every object as STANDARD")


#: how this request's write works out its ACL, as :func:`tierd.acl.canned.apply_on_commit`
#: takes it, from the headers (or form fields) it is given: set before the handler runs
#: (:func:`tierd.s3.bucket_controls.prepare_acl`) with what ``x-amz-grant-*``, the bucket's
#: ownership controls and public access block need (the key store, the bucket record),
#: which header-only callers such as :func:`objmeta_from_headers` do not have.  None: not
#: an object write or CreateBucket (canned ACLs only)
REQUEST_ACL: ContextVar[Callable[[CIMultiDictProxy[str]], str | None] | None] = ContextVar(
    "tierd_s3_request_acl", default=None)


def canned_acl(h: CIMultiDictProxy[str]) -> str | None:
    """The ACL of headers ``h``: as :data:`REQUEST_ACL` works it out where this request
    has one, else ``x-amz-acl`` (None when absent); InvalidArgument for an unknown one."""
    resolve = REQUEST_ACL.get()
    if resolve is not None:
        return resolve(h)
    if any(k.lower().startswith("x-amz-grant-") for k in h):
        raise S3Error("InvalidRequest", "x-amz-grant-* headers are not accepted by this "
                      "request")
    return header_canned_acl(h)


def header_canned_acl(h: CIMultiDictProxy[str]) -> str | None:
    """The request's ``x-amz-acl`` (None when absent); InvalidArgument for an unknown one."""
    acl = h.get("x-amz-acl")
    if acl is None:
        return None
    try:
        return canned.check(acl.strip())
    except canned.UnknownCannedAcl as e:
        raise S3Error("InvalidArgument", str(e), ArgumentName="x-amz-acl",
                      ArgumentValue=acl) from None


def stored_encoding(value: str) -> str:
    """The ``Content-Encoding`` to store: the value byte for byte as sent (``deflate, gzip``
    keeps its space), less an ``aws-chunked`` coding, which describes the transfer only."""
    codings = value.split(",")
    kept = [c for c in codings if c.strip().lower() != "aws-chunked"]
    if len(kept) == len(codings):
        return value
    return ",".join(kept).strip(" \t,")


def objmeta_from_headers(h: CIMultiDictProxy[str]) -> dict[str, str]:
    """System and user metadata of a PUT/Create/Copy(REPLACE) request; a canned ACL rides
    along for the namespace to apply in the commit (:data:`tierd.acl.canned.META_KEY`), and
    the tags of ``x-amz-tagging`` (:mod:`tierd.s3.tagset`) are stored with the rest."""
    reject_unsupported_headers(h)
    meta: dict[str, str] = tagset.header_meta(h)
    acl = canned_acl(h)
    if acl is not None:
        meta[canned.META_KEY] = acl
    for name in STORED_HEADERS:
        if name in h:
            value = h[name]
            if name == "content-encoding":
                value = stored_encoding(value)
                if not value:
                    continue
            meta[name] = value
    size = 0
    for k, v in h.items():
        lk = k.lower()
        if lk.startswith("x-amz-meta-"):
            if lk in meta:
                meta[lk] += "," + v
            else:
                meta[lk] = v
            size += len(lk) - len("x-amz-meta-") + len(v.encode())
    if size > MAX_USER_METADATA:
        raise S3Error("MetadataTooLarge", f"user metadata is {size} bytes; the limit is "
                      f"{MAX_USER_METADATA}", Size=str(size), MaxSizeAllowed=str(
                          MAX_USER_METADATA))
    return meta


def checksum_meta(values: dict[str, str], kind: str = "FULL_OBJECT") -> dict[str, str]:
    out = {checksums.META_PREFIX + a: v for a, v in values.items()}
    if out:
        out[checksums.META_TYPE] = kind
    return out


# -- object metadata out -----------------------------------------------------------------

def object_headers(inode: Inode, *, checksum_mode: bool) -> dict[str, str]:
    """The headers GET and HEAD answer with for ``inode``."""
    meta = inode.objmeta
    out = {
        "ETag": quoted(etag_of(inode)),
        "Last-Modified": http_date(inode.mtime_ns),
        "Accept-Ranges": "bytes",
        "Content-Type": meta.get("content-type", DEFAULT_CONTENT_TYPE),
    }
    for name in STORED_HEADERS[1:]:
        if name in meta:
            out[name.title()] = meta[name]
    for k, v in meta.items():
        if k.startswith("x-amz-meta-"):
            out[k] = v
    tags = tagset.tag_count(meta)
    if tags:
        out[tagset.COUNT_HEADER] = str(tags)
    if checksum_mode:
        for a in checksums.ALGORITHMS:
            value = meta.get(checksums.META_PREFIX + a)
            if value is not None:
                out[checksums.META_PREFIX + a] = value
                out[checksums.META_TYPE] = meta.get(checksums.META_TYPE, "FULL_OBJECT")
    return out


def object_checksum(inode: Inode) -> tuple[str, str] | None:
    for a in checksums.ALGORITHMS:
        v = inode.objmeta.get(checksums.META_PREFIX + a)
        if v is not None:
            return a, v
    return None


def part_layout(inode: Inode) -> list[int]:
    """Part sizes of a multipart object (empty for single-part objects)."""
    raw = inode.objmeta.get(META_PARTS, "")
    sizes: list[int] = []
    for run in filter(None, raw.split(",")):
        size, _, count = run.partition("*")
        sizes.extend([int(size)] * int(count or 1))
    return sizes


def encode_layout(sizes: list[int]) -> str:
    runs: list[list[int]] = []
    for s in sizes:
        if runs and runs[-1][0] == s:
            runs[-1][1] += 1
        else:
            runs.append([s, 1])
    return ",".join(f"{s}*{n}" for s, n in runs)


# -- conditionals and ranges -------------------------------------------------------------

def check_conditions(h: CIMultiDictProxy[str], inode: Inode, *,
                     prefix: str = "", copy: bool = False) -> None:
    """RFC 7232 preconditions as S3 evaluates them (:func:`tierd.preconditions.evaluate`).
    ``prefix`` is ``x-amz-copy-source-`` for CopyObject/UploadPartCopy, where every
    failure is 412; elsewhere a "not modified" is 304."""

    def date(name: str) -> float | None:
        value = h.get(prefix + name)
        return None if value is None else parse_http_date(value)

    failed = preconditions.evaluate(
        etag_of(inode), inode.mtime_ns // 1_000_000_000,
        if_match=h.get(prefix + "if-match"), if_none_match=h.get(prefix + "if-none-match"),
        if_unmodified_since=date("if-unmodified-since"),
        if_modified_since=date("if-modified-since"), now=time.time())
    if failed is None:
        return
    if not failed.not_modified:
        raise S3Error("PreconditionFailed", Condition=prefix + failed.header)
    raise S3Error("PreconditionFailed" if copy else "NotModified",
                  Condition=prefix + failed.header, headers=_304_headers(inode))


def _304_headers(inode: Inode) -> dict[str, str]:
    return {"ETag": quoted(etag_of(inode)), "Last-Modified": http_date(inode.mtime_ns)}


def parse_range(value: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) inclusive for a ``Range: bytes=`` header, None for the whole object
    (absent, malformed or multi-range headers are ignored, as AWS does, and a suffix range
    of an empty object is the empty object); InvalidRange when it cannot be satisfied."""
    if not value:
        return None
    unit, _, spec = value.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first_s, dash, last_s = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if not first_s:
            n = int(last_s)
            if n <= 0:
                raise _unsatisfiable(size)
            if size == 0:
                return None  # the last n bytes of nothing: the (empty) object, as AWS
            return max(0, size - n), size - 1
        first = int(first_s)
        last = int(last_s) if last_s else size - 1
    except ValueError:
        return None
    if first >= size:
        raise _unsatisfiable(size)
    if first < 0 or last < first:
        return None
    return first, min(last, size - 1)


def _unsatisfiable(size: int) -> S3Error:
    return S3Error("InvalidRange", ActualObjectSize=str(size),
                   headers={"Content-Range": f"bytes */{size}"})


def parse_copy_source(value: str) -> tuple[str, str]:
    """``x-amz-copy-source`` -> (bucket, key); its ``versionId``, checked here, is read by
    :func:`tierd.s3.versioning.copy_source_version`."""
    src = value.strip()
    path, _, query = src.partition("?")
    if query:
        name, _, vid = query.partition("=")
        if name != "versionId" or not valid_vid(unquote(vid)):
            raise S3Error("InvalidArgument", "Invalid version id specified",
                          ArgumentName="x-amz-copy-source", ArgumentValue=vid)
    path = unquote(path).lstrip("/")
    bucket, _, key = path.partition("/")
    if not bucket or not key:
        raise S3Error("InvalidArgument", "Copy Source must mention the source bucket and key: "
                      "sourcebucket/sourcekey", ArgumentName="x-amz-copy-source",
                      ArgumentValue=value)
    return bucket, key


def int_param(ctx: Ctx, name: str, low: int, high: int, default: int) -> int:
    """The integer query parameter ``name``: :func:`int_value` of it."""
    return int_value(ctx.query.get(name), name, low, high, default)


def int_value(raw: str | None, name: str, low: int, high: int, default: int) -> int:
    """``raw`` (a query parameter or header ``name``) as an integer, ``default`` when absent;
    InvalidArgument naming it when it is not an integer in ``low..high``."""
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        n = low - 1
    if not low <= n <= high:
        raise S3Error("InvalidArgument", f"{name} must be an integer between {low} and "
                      f"{high}", ArgumentName=name, ArgumentValue=raw)
    return n


def max_keys(ctx: Ctx, name: str = "max-keys", default: int = 1000) -> int:
    raw = ctx.query.get(name)
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise S3Error("InvalidArgument", f"{name} must be a non-negative integer",
                      ArgumentName=name, ArgumentValue=raw)
    return min(n, default)
