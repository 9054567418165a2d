"""Tier backends: where file data is stored.

* :class:`LocalTier` -- hot (NVMe) and warm (SSD) directories, one sparse file per inode,
  block-addressed (:data:`BLOCK_SIZE`).
* :class:`ObjectTier` -- the cold store of whole objects, the system of record, with the
  transparent ``<bucket>/<key>`` layout.  Engines: ``file://`` (:class:`FileObjectTier`, the
  embedded default), ``s3://`` (:class:`S3ObjectTier`, boto3) and any other fsspec URL
  (:class:`FsspecObjectTier`); :func:`open_object_tier` picks one from a URL.

Placement (``tierd/placement/``) decides which blocks live where; nothing here knows about
inodes' metadata.  ``hotdir`` is the namespace's side of the hot ``LocalTier`` (staging,
small-file writes; the tier owns the files); ``fileio`` the I/O helpers.  See docs/tiers.md.

The S3 and fsspec engines import boto3/fsspec lazily, so importing this package needs
neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tierd.tiers.file_tier import FileObjectTier
from tierd.tiers.local_tier import BLOCK_SIZE, LocalTier, blocks_of, data_ranges, punch_hole
from tierd.tiers.object_tier import (
    InvalidKey,
    KeyConflict,
    KeyRejected,
    ListPage,
    ObjectChanged,
    ObjectInfo,
    ObjectNotFound,
    ObjectTier,
    TierError,
    TierThrottled,
    TierUnavailable,
    TransferOptions,
    check_key,
)

if TYPE_CHECKING:
    from tierd.config import Config
    from tierd.tiers.fsspec_tier import FsspecObjectTier
    from tierd.tiers.s3_tier import S3ObjectTier

__all__ = [
    "BLOCK_SIZE",
    "FileObjectTier",
    "FsspecObjectTier",
    "InvalidKey",
    "KeyConflict",
    "KeyRejected",
    "ListPage",
    "LocalTier",
    "ObjectChanged",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectTier",
    "S3ObjectTier",
    "TierError",
    "TierThrottled",
    "TierUnavailable",
    "TransferOptions",
    "blocks_of",
    "check_key",
    "data_ranges",
    "local_tiers_from_config",
    "object_tier_from_config",
    "open_object_tier",
    "punch_hole",
]

_TRANSFER = ("multipart_threshold", "part_size", "range_size", "concurrency")


def __getattr__(name: str) -> Any:
    # lazy: the S3 engine pulls in boto3, the fsspec one fsspec
    if name == "S3ObjectTier":
        from tierd.tiers.s3_tier import S3ObjectTier

        return S3ObjectTier
    if name == "FsspecObjectTier":
        from tierd.tiers.fsspec_tier import FsspecObjectTier

        return FsspecObjectTier
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_object_tier(url: str, **settings: Any) -> ObjectTier:
    """The cold store at ``url``.

    * ``file:///path`` (or a plain path) -> :class:`FileObjectTier`;
    * ``s3://bucket/prefix`` or ``s3://`` -> :class:`S3ObjectTier` (settings: endpoint_url,
      region, access_key, secret_key, session_token, addressing, retry_mode, max_attempts,
      connect_timeout, read_timeout, create_bucket, checksum);
    * anything else -> :class:`FsspecObjectTier` (settings are fsspec storage options).

    ``multipart_threshold``, ``part_size``, ``range_size`` and ``concurrency`` go to
    :class:`TransferOptions` for every engine.  Unknown settings raise ``TypeError``.
    """
    transfer = TransferOptions(**{k: settings.pop(k) for k in _TRANSFER if k in settings})
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("", "file"):
        if settings:
            raise TypeError(f"file:// cold store takes no settings {sorted(settings)}")
        path = url.split("://", 1)[1] if scheme else url
        if not path:
            raise ValueError(f"cold URL {url!r} names no directory")
        return FileObjectTier(path, transfer=transfer)
    if scheme in ("s3", "s3a"):
        from tierd.tiers.s3_tier import S3ObjectTier

        bucket, _, prefix = url.split("://", 1)[1].partition("/")
        return S3ObjectTier(bucket, prefix, transfer=transfer, **settings)
    from tierd.tiers.fsspec_tier import FsspecObjectTier

    return FsspecObjectTier(url, transfer=transfer, **settings)


def object_tier_from_config(config: Config, **overrides: Any) -> ObjectTier:
    """The cold store the settings describe (``cold_url`` and the ``cold_*`` settings)."""
    settings: dict[str, Any] = {
        "multipart_threshold": config.cold_multipart_threshold,
        "part_size": config.cold_part_size,
        "range_size": config.cold_range_size,
        "concurrency": config.cold_concurrency,
    }
    if config.cold_url.split("://", 1)[0].lower() in ("s3", "s3a"):
        settings.update(
            endpoint_url=config.cold_s3_endpoint or None,
            region=config.cold_s3_region or None,
            access_key=config.cold_s3_access_key or None,
            secret_key=config.cold_s3_secret_key or None,
            addressing=config.cold_s3_addressing,
            retry_mode=config.cold_s3_retry_mode,
            max_attempts=config.cold_s3_max_attempts,
            checksum=config.cold_s3_checksum,
            connect_timeout=config.cold_s3_connect_timeout,
            read_timeout=config.cold_s3_read_timeout,
        )
    settings.update(overrides)
    tier = open_object_tier(config.cold_url, **settings)
    tier.call_timeout = config.cold_timeout
    return tier


def local_tiers_from_config(config: Config) -> tuple[LocalTier, LocalTier]:
    """The hot and warm tiers the settings describe (placement uses warm only when
    ``warm_enabled``)."""
    return (
        LocalTier(config.hot_dir, name="hot", capacity=config.hot_capacity),
        LocalTier(config.warm_dir, name="warm", capacity=config.warm_capacity),
    )
