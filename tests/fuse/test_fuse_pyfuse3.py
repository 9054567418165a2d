"""The pyfuse3 backend (``fuse_backend = pyfuse3``), kept as the fallback while the
kernel-protocol backend is the default: core POSIX, permission and ACL tests of the other
modules run again against a daemon mounted through libfuse and pyfuse3, so the fallback
cannot rot unseen.  The whole FUSE suite runs on it with ``TIERD_FUSE_BACKEND=pyfuse3``
(tests/fuse/conftest.py).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BUCKET, Daemon, s3_client, start_daemon, stop_daemon
from test_fuse_acl import local_root, pair, test_setfacl_getfacl_round_trip  # noqa: F401
from test_fuse_permissions import home, test_read_write_by_owner_group_other  # noqa: F401
from test_fuse_posix import (  # noqa: F401
    test_links_symlinks_and_nodes,
    test_lookup_getattr_and_errnos,
    test_open_flags,
    test_readdir_stable_offsets_under_changes,
    test_rename_flags,
    test_setattr_chmod_chown_truncate_utimens,
    test_xattrs,
)

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(os.geteuid() != 0, reason="the other users' tests need root"),
]


@pytest.fixture(scope="module")
def daemon(public_tmp: Path) -> Iterator[Daemon]:
    """This module's own daemon, on the pyfuse3 backend (overrides the session's: every
    fixture built on ``daemon`` here uses it)."""
    d = start_daemon(public_tmp / "pdata", public_tmp / "pmnt", public_tmp / "ptierd.log",
                     "--fuse-backend", "pyfuse3")
    try:
        (d.mnt / BUCKET).mkdir()
        (d.mnt / BUCKET).chmod(0o777)
        yield d
    finally:
        code = stop_daemon(d)
        if code not in (0, None):
            print(f"tierd exited with {code}; log:\n{d.log}", file=sys.stderr)


def test_the_mount_is_served_by_pyfuse3(daemon: Daemon) -> None:
    assert "backend=pyfuse3" in daemon.log
    assert "backend=kernel" not in daemon.log


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


def test_s3_overwrites_are_seen_at_once_through_the_pyfuse3_mount(daemon: Daemon, work: Path,
                                                                  s3: Any) -> None:
    overwrite_and_read(daemon, work, s3)
