"""Per-bucket configuration documents: versioning, CORS, tags, lifecycle, public access
block, ownership controls and the rest of S3's bucket sub-resources.

Each is one string (the owning module's own encoding, usually the XML or JSON it
validated) under a name in :attr:`tierd.meta.Bucket.config`.  One store for all of them keeps
the bucket record the one place a bucket's settings live (the FUSE door and the lifecycle
job read the same record the S3 door writes), and every change is durable before it is
acknowledged, like the bucket policy.
"""

from __future__ import annotations

import errno

from tierd.errors import FsError
from tierd.meta import MetaStore

#: largest stored document: a lifecycle configuration may hold 1000 rules (~90 KiB of JSON
#: for short IDs and prefixes); S3's other sub-resources are far smaller
MAX_CONFIG_BYTES = 1 << 20


class BucketConfig:
    """Reads and durable writes of a bucket's configuration documents."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta

    def get(self, bucket: str, name: str) -> str | None:
        """The document ``name`` of ``bucket``; None when unset.  ENOENT without the bucket."""
        with self.meta.snapshot() as tx:
            b = tx.get_bucket(bucket)
        if b is None:
            raise FsError(errno.ENOENT, f"bucket {bucket!r} does not exist")
        return b.config.get(name)

    def all(self, bucket: str) -> dict[str, str]:
        """Every document of ``bucket`` (a copy).  ENOENT without the bucket."""
        with self.meta.snapshot() as tx:
            b = tx.get_bucket(bucket)
        if b is None:
            raise FsError(errno.ENOENT, f"bucket {bucket!r} does not exist")
        return dict(b.config)

    async def put(self, bucket: str, name: str, text: str | None) -> bool:
        """Set (``text``) or remove (None) the document ``name``; durable when this returns.
        Returns whether anything changed.  ENOENT without the bucket, EFBIG when too large."""
        if text is not None and len(text.encode()) > MAX_CONFIG_BYTES:
            raise FsError(errno.EFBIG, f"bucket {name} configuration over "
                          f"{MAX_CONFIG_BYTES} bytes")
        async with self.meta.awrite() as tx:
            b = tx.get_bucket(bucket)
            if b is None:
                raise FsError(errno.ENOENT, f"bucket {bucket!r} does not exist")
            if b.config.get(name) == text:
                return False
            if text is None:
                del b.config[name]
            else:
                b.config[name] = text
            tx.put_bucket(b)
        await self.meta.flush()
        return True
