"""The differential test of the foundation issue, through the mount: the same random
operation sequences, applied with plain ``os`` calls to a directory in the mount and to a
plain temporary directory, must give the same outcome (value or errno) for every operation
and the same trees (types, modes, owners, link counts, sizes, contents, symlink targets,
user xattrs and hard-link groups).

The operations, their generator and the ``os`` applier are tests/differential_ops.py, shared
with the namespace-level test (tests/namespace/test_differential.py).  Unlike that test, the
kernel is in the loop here: path walks, open(2) flags, O_APPEND, the page cache, readdir
offsets and the attribute caches all take part.  Operations run as root and, when the suite
runs as root, as two other users, so permission answers are compared as well.  Each example
gets a fresh subdirectory instead of a new mount.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BUCKET, Daemon
from differential_ops import (
    PRELUDE,
    UMASK,
    OsSide,
    Outcome,
    compare_trees,
    op_strategy,
    resolve,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

pytestmark = pytest.mark.timeout(300)


def known_deviation(op: tuple[Any, ...], real: Outcome, mnt: Outcome) -> bool:
    """Two documented deviations (docs/fuse.md "Limits"), both about which error wins when
    an operation is refused for permission and would also fail for another reason:

    * pyfuse3 implements XATTR_CREATE and XATTR_REPLACE by asking getxattr first, so a
      setxattr refused for permission reports EEXIST / ENODATA;
    * the kernel checks entry types (EISDIR, ENOTDIR) in rename/unlink/rmdir before asking
      the file system, and without ``default_permissions`` it cannot know that write
      permission on the directory is missing, so the type error wins.
    """
    if real[0] != "err" or real[1] not in ("EACCES", "EPERM") or mnt[0] != "err":
        return False
    if op[0] == "setxattr":
        return bool(mnt[1] == {1: "EEXIST", 2: "ENODATA"}.get(op[4]))
    return op[0] in ("rename", "unlink", "rmdir") and mnt[1] in ("EISDIR", "ENOTDIR")


_seq = itertools.count()


@pytest.fixture(scope="module")
def dirs(daemon: Daemon) -> Iterator[tuple[Path, Path]]:
    """Parents of the per-example directories: one in the mount, one on the local disk."""
    base = daemon.mnt / BUCKET / "differential"
    base.mkdir()
    with tempfile.TemporaryDirectory(prefix="tierd-diff-real-") as real:
        os.chmod(real, 0o755)  # the other users must reach the examples
        yield Path(real), base


def run_sequence(dirs: tuple[Path, Path], ops: list[tuple[Any, ...]]) -> None:
    n = next(_seq)
    old = os.umask(UMASK)
    real_root, mnt_root = str(dirs[0] / f"ex{n}"), str(dirs[1] / f"ex{n}")
    for d in (real_root, mnt_root):
        os.mkdir(d)
        os.chmod(d, 0o777)
    real, mnt = OsSide(real_root), OsSide(mnt_root)
    log: list[str] = []

    def compare(when: str) -> None:
        compare_trees(real.tree(), mnt.tree(), "mount", when, log)

    try:
        for i, op in enumerate([*PRELUDE, *ops]):
            op = resolve(op, real.known())
            r, m = real.apply(op), mnt.apply(op)
            log.append(f"{i:3}: {op!r} -> real {r}, mount {m}")
            if currently_in_test_context():
                event(f"{op[0]} {r[0] if r[0] != 'err' else r[1]}")
            assert r == m or known_deviation(op, r, m), (
                f"outcomes differ at op {i}: {op!r}\n" + "\n".join(log))
            if op[0] == "check":
                compare(f"after op {i}")
        compare("at the end")
        real.close_all()
        mnt.close_all()
        compare("after closing every handle")
    finally:
        real.close_all()
        mnt.close_all()
        os.umask(old)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op_strategy(), min_size=5, max_size=50))
def test_mount_matches_the_kernel(dirs: tuple[Path, Path], ops: list[tuple[Any, ...]]) -> None:
    run_sequence(dirs, ops)
