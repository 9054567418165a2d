"""The core POSIX, permission and ACL tests that each FUSE backend's own module runs again
against a daemon of that backend (``from core_tests import *`` in test_fuse_kernel.py and
test_fuse_pyfuse3.py: pytest collects the imported tests and fixtures there, where the
module's ``daemon`` fixture overrides the session's), plus the cross-door check both share.
Not a test module itself (no ``test_`` prefix), so nothing here runs twice on the default
daemon."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from conftest import BUCKET, Daemon, s3_client
from test_fuse_acl import local_root, pair, test_setfacl_getfacl_round_trip
from test_fuse_permissions import home, test_read_write_by_owner_group_other
from test_fuse_posix import (
    test_links_symlinks_and_nodes,
    test_lookup_getattr_and_errnos,
    test_mount_read_ahead_is_raised,
    test_open_flags,
    test_readdir_stable_offsets_under_changes,
    test_rename_flags,
    test_setattr_chmod_chown_truncate_utimens,
    test_xattrs,
)

__all__ = [
    "home", "local_root", "pair",
    "test_links_symlinks_and_nodes", "test_lookup_getattr_and_errnos",
    "test_mount_read_ahead_is_raised", "test_open_flags",
    "test_read_write_by_owner_group_other", "test_readdir_stable_offsets_under_changes",
    "test_rename_flags", "test_setattr_chmod_chown_truncate_utimens",
    "test_setfacl_getfacl_round_trip", "test_xattrs",
]


def overwrite_and_read(d: Daemon, work: Path, s3: Any, rounds: int = 150) -> None:
    """An S3 PUT over a key makes a new inode; an open or stat through the mount right
    after the PUT's answer -- through the kernel's cached entry of the old inode when the
    invalidation is still on its way -- sees the new bytes, never ENOENT.  Other S3
    requests keep the daemon's loop busy meanwhile, so the invalidation thread waits for
    the interpreter as it does on a loaded machine (before ESTALE, this lost the race)."""
    key = f"{work.name}/x.txt"
    busy = s3_client(d)
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            busy.list_objects_v2(Bucket=BUCKET, Prefix=work.name)

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(rounds):
            body = b"v%d" % i
            s3.put_object(Bucket=BUCKET, Key=key, Body=body)
            assert (work / "x.txt").stat().st_size == len(body)
            assert (work / "x.txt").read_bytes() == body
    finally:
        stop.set()
        for t in threads:
            t.join()
