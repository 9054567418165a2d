"""Metadata: the :class:`MetaStore` records over a transactional key-value engine.

Nothing outside this package imports an engine library (lmdb today, a shared engine later).
"""

from tierd.meta.kv import KVStore, KVTxn
from tierd.meta.records import (
    EMPTY_MD5,
    STATE_CLEAN,
    STATE_DIRTY,
    STATE_NONE,
    STATE_PERSISTING,
    AccessKey,
    Bucket,
    ColdRecord,
    Dirent,
    Inode,
    MultipartUpload,
    PlacementPolicy,
    UploadPart,
    User,
)
from tierd.meta.store import ROOT_INO, SCHEMA_VERSION, MetaStore, MetaTxn, SchemaError

__all__ = [
    "EMPTY_MD5",
    "ROOT_INO",
    "SCHEMA_VERSION",
    "STATE_CLEAN",
    "STATE_DIRTY",
    "STATE_NONE",
    "STATE_PERSISTING",
    "AccessKey",
    "Bucket",
    "ColdRecord",
    "Dirent",
    "Inode",
    "KVStore",
    "KVTxn",
    "MetaStore",
    "MetaTxn",
    "MultipartUpload",
    "PlacementPolicy",
    "SchemaError",
    "UploadPart",
    "User",
]
