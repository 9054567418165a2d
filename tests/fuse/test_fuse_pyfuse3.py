"""The pyfuse3 backend (``fuse_backend = pyfuse3``), kept as the fallback while the
kernel-protocol backend is the default: core POSIX, permission and ACL tests of the other
modules run again against a daemon mounted through libfuse and pyfuse3, so the fallback
cannot rot unseen.  The whole FUSE suite runs on it with ``TIERD_FUSE_BACKEND=pyfuse3``
(tests/fuse/conftest.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, serving
from core_tests import *  # noqa: F403  (the core tests, run again on this backend)
from core_tests import overwrite_and_read

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(os.geteuid() != 0, reason="the other users' tests need root"),
]


@pytest.fixture(scope="module")
def daemon(public_tmp: Path) -> Iterator[Daemon]:
    """This module's own daemon, on the pyfuse3 backend (overrides the session's: every
    fixture built on ``daemon`` here uses it)."""
    with serving(public_tmp, "p", "--fuse-backend", "pyfuse3") as d:
        yield d


def test_the_mount_is_served_by_pyfuse3(daemon: Daemon) -> None:
    assert "backend=pyfuse3" in daemon.log
    assert "backend=kernel" not in daemon.log


def test_s3_overwrites_are_seen_at_once_through_the_pyfuse3_mount(daemon: Daemon, work: Path,
                                                                  s3: Any) -> None:
    overwrite_and_read(daemon, work, s3)
