"""The S3 additional checksums: CRC32, CRC32C, CRC64NVME, SHA1, SHA256.

Values travel base64-encoded (big-endian for the CRCs), in ``x-amz-checksum-<alg>``
headers or trailers.  CRC32C and CRC64NVME come from ``awscrt`` (the AWS common runtime,
the same code botocore uses for them), CRC32 from zlib.

Multipart objects carry either a COMPOSITE checksum (the checksum of the concatenated part
checksums, suffixed ``-N``) or, for the CRCs, a FULL_OBJECT checksum combined from the part
CRCs and sizes without reading the data again.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import zlib
from collections.abc import Callable
from typing import Protocol

from awscrt import checksums as crt

from tierd.s3.errors import S3Error

ALGORITHMS = ("crc32", "crc32c", "crc64nvme", "sha1", "sha256")
CRCS = ("crc32", "crc32c", "crc64nvme")
#: objmeta key of a stored checksum value and of its type (FULL_OBJECT or COMPOSITE)
META_PREFIX = "x-amz-checksum-"
META_TYPE = "x-amz-checksum-type"


class Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...
    def digest(self) -> bytes: ...


class Crc:
    def __init__(self, fn: Callable[[bytes | memoryview, int], int], width: int) -> None:
        self.fn = fn
        self.width = width
        self.value = 0

    def update(self, data: bytes | memoryview) -> None:
        self.value = self.fn(data, self.value)

    def digest(self) -> bytes:
        return self.value.to_bytes(self.width, "big")


def _crc32(data: bytes | memoryview, prev: int) -> int:
    return zlib.crc32(data, prev)


def _crc32c(data: bytes | memoryview, prev: int) -> int:
    return int(crt.crc32c(data, prev))


def _crc64(data: bytes | memoryview, prev: int) -> int:
    return int(crt.crc64nvme(data, prev))


def new_hasher(algorithm: str) -> Hasher:
    if algorithm == "crc32":
        return Crc(_crc32, 4)
    if algorithm == "crc32c":
        return Crc(_crc32c, 4)
    if algorithm == "crc64nvme":
        return Crc(_crc64, 8)
    if algorithm == "sha1":
        return hashlib.sha1()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise S3Error("InvalidRequest", f"unsupported checksum algorithm {algorithm!r}; "
                  f"supported: {', '.join(a.upper() for a in ALGORITHMS)}")


def encode(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def decode(algorithm: str, value: str) -> bytes:
    """The raw digest of a base64 checksum value; InvalidRequest when malformed."""
    size = {"crc32": 4, "crc32c": 4, "crc64nvme": 8, "sha1": 20, "sha256": 32}[algorithm]
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != size:
        raise S3Error("InvalidRequest", f"Value for x-amz-checksum-{algorithm} header is "
                      "invalid.")
    return raw


def check_algorithm(name: str) -> str:
    """A checksum algorithm name from a header (any case) -> its lower-case name."""
    alg = name.strip().lower()
    if alg not in ALGORITHMS:
        raise S3Error("InvalidRequest", f"Checksum algorithm {name!r} is not supported; "
                      f"use one of {', '.join(a.upper() for a in ALGORITHMS)}")
    return alg


def composite(algorithm: str, part_values: list[str]) -> str:
    """COMPOSITE multipart checksum: checksum of the concatenated part digests, ``-N``."""
    h = new_hasher(algorithm)
    h.update(b"".join(decode(algorithm, v) for v in part_values))
    return f"{encode(h.digest())}-{len(part_values)}"


def combine_full(algorithm: str, parts: list[tuple[str, int]]) -> str:
    """FULL_OBJECT checksum of a multipart object from (part CRC, part size) pairs."""
    combine: Callable[[int, int, int], int] = {
        "crc32": crt.combine_crc32, "crc32c": crt.combine_crc32c,
        "crc64nvme": crt.combine_crc64nvme,
    }[algorithm]
    width = 8 if algorithm == "crc64nvme" else 4
    value = 0
    for i, (b64, size) in enumerate(parts):
        crc = int.from_bytes(decode(algorithm, b64), "big")
        value = crc if i == 0 else combine(value, crc, size)
    return encode(value.to_bytes(width, "big"))
