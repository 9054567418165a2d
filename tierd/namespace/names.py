"""Names, keys and bucket names: the key <-> path rules of the design, with clear errors.

An S3 key is a path relative to its bucket.  Where object and file semantics cannot both hold
(empty or dot segments, over-long segments, NUL), the key is refused here, before it touches
metadata or disk, with an errno the doors translate (EINVAL -> InvalidArgument/KeyTooLong...).
"""

from __future__ import annotations

import errno
import ipaddress
import re

from tierd.errors import FsError

NAME_MAX = 255
KEY_MAX = 1024
SYMLINK_MAX = 4095
XATTR_NAME_MAX = 255
XATTR_SIZE_MAX = 65536

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def check_name(name: bytes) -> None:
    """A single directory entry name, as the kernel would pass it."""
    if not name:
        raise FsError(errno.ENOENT, "empty file name")
    if len(name) > NAME_MAX:
        raise FsError(errno.ENAMETOOLONG, f"name is {len(name)} bytes; the limit is {NAME_MAX}")
    if b"/" in name or b"\0" in name:
        raise FsError(errno.EINVAL, f"name {name!r} contains '/' or NUL")


def split_key(key: str) -> tuple[list[bytes], bool]:
    """The path segments of ``key`` and whether it names a directory marker (``a/b/``)."""
    raw = key.encode("utf-8", "surrogateescape")
    if not raw:
        raise FsError(errno.EINVAL, "the object key is empty")
    if len(raw) > KEY_MAX:
        raise FsError(errno.ENAMETOOLONG, f"key is {len(raw)} bytes; the limit is {KEY_MAX}")
    if b"\0" in raw:
        raise FsError(errno.EINVAL, "the object key contains a NUL byte")
    marker = raw.endswith(b"/")
    body = raw[:-1] if marker else raw
    segments = body.split(b"/")
    for seg in segments:
        if seg in (b"", b".", b".."):
            shown = seg.decode() or "an empty"
            raise FsError(
                errno.EINVAL,
                f"key {key!r} has {shown} path segment; tierd keys are relative paths "
                "(no leading or double '/', no '.' or '..' segments)",
            )
        if len(seg) > NAME_MAX:
            raise FsError(
                errno.ENAMETOOLONG,
                f"key {key!r} has a {len(seg)}-byte segment; the limit is {NAME_MAX}",
            )
    return segments, marker


def join_key(segments: list[bytes]) -> str:
    return b"/".join(segments).decode("utf-8", "surrogateescape")


def check_bucket_name(name: str) -> None:
    """S3 bucket naming rules (the subset AWS enforces for new buckets)."""
    why = ""
    if not 3 <= len(name) <= 63:
        why = "must be 3 to 63 characters long"
    elif not _BUCKET_RE.match(name):
        why = ("may contain only lowercase letters, digits, '.' and '-', and must start and "
               "end with a letter or digit")
    elif ".." in name or ".-" in name or "-." in name:
        why = "must not contain '..', '.-' or '-.'"
    elif name.startswith("xn--") or name.endswith("-s3alias") or name.startswith("sthree-"):
        why = "uses a reserved prefix or suffix"
    else:
        try:
            ipaddress.IPv4Address(name)
            why = "must not be formatted as an IP address"
        except ValueError:
            pass
    if why:
        raise FsError(errno.EINVAL, f"invalid bucket name {name!r}: it {why}")
