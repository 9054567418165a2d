"""The versioning layer of the namespace: records instead of garbage, the lifecycle calls
(``iter_versions``, ``expire_noncurrent``) and the data files they keep or free."""

from __future__ import annotations

import os
import time
from typing import Any

from namespace.conftest import ROOT, NsEnv
from tierd.namespace import versionops


def enabled(nsenv: NsEnv, name: str = "bkt") -> None:
    nsenv.bucket(name)
    nsenv.run(nsenv.ns.set_versioning(name, "Enabled"))


def test_superseded_versions_keep_their_data_files(nsenv: NsEnv) -> None:
    enabled(nsenv)
    first = nsenv.put(ROOT, "bkt", "k", b"one")
    nsenv.put(ROOT, "bkt", "k", b"two")
    nsenv.run(nsenv.ns.garbage.drain())
    assert os.path.exists(nsenv.ns.hot.path(first.ino))  # a record names it: no G key was written
    assert nsenv.ns.garbage.reclaimed == 0
    rows = list(nsenv.ns.iter_versions("bkt"))
    assert [(r.key, r.current, r.is_latest, r.marker) for r in rows] == [
        ("k", True, True, False), ("k", False, False, False)]
    assert rows[1].inode is not None and rows[1].inode.ino == first.ino
    assert rows[1].noncurrent_since_ns == rows[0].mtime_ns
    # survives a restart: the record and its inode are in the store
    nsenv.reopen()
    assert nsenv.run(nsenv.ns.get_version(ROOT, "bkt", "k", rows[1].vid)).inode.ino == \
        first.ino


def test_expire_noncurrent(nsenv: NsEnv) -> None:
    enabled(nsenv)
    olds = [nsenv.put(ROOT, "bkt", "logs/a", f"{i}".encode()) for i in range(3)]
    nsenv.put(ROOT, "bkt", "keep/b", b"1")
    nsenv.put(ROOT, "bkt", "keep/b", b"2")
    nsenv.run(nsenv.ns.delete_version(ROOT, "bkt", "gone", None))  # a lone marker
    ns = nsenv.ns
    # nothing is old enough yet
    assert nsenv.run(ns.expire_noncurrent("bkt", "logs/", 0)) == 0
    # keep the newest noncurrent one
    assert nsenv.run(ns.expire_noncurrent("bkt", "logs/", time.time_ns(), keep_newer=1)) == 1
    nsenv.run(ns.garbage.drain())
    assert not os.path.exists(ns.hot.path(olds[0].ino))  # permanently deleted: reclaimed
    assert os.path.exists(ns.hot.path(olds[1].ino))
    assert nsenv.run(ns.expire_noncurrent("bkt", "", time.time_ns(),
                                          expired_markers=True)) == 3
    left = [(r.key, r.marker) for r in ns.iter_versions("bkt")]
    assert left == [("keep/b", False), ("logs/a", False)]
    assert nsenv.get(ROOT, "bkt", "logs/a") == b"2"


def test_expire_noncurrent_pages_through_many_keys(nsenv: NsEnv, monkeypatch: Any) -> None:
    """The scan reads a few keys per read transaction: every page is covered."""
    monkeypatch.setattr(versionops, "_EXPIRE_PAGE", 2)
    enabled(nsenv)
    for i in range(5):
        for body in (b"old", b"new"):
            nsenv.put(ROOT, "bkt", f"k{i}", body)
    assert nsenv.run(nsenv.ns.expire_noncurrent("bkt", "", time.time_ns())) == 5
    assert [r.current for r in nsenv.ns.iter_versions("bkt")] == [True] * 5


def test_plain_deletes_leave_markers_in_a_versioned_bucket(nsenv: NsEnv) -> None:
    """Callers of the unversioned delete calls (jobs, a door that checked the state before
    versioning was enabled) never lose a version."""
    enabled(nsenv)
    nsenv.put(ROOT, "bkt", "a", b"1")
    nsenv.put(ROOT, "bkt", "b", b"2")
    assert nsenv.run(nsenv.ns.delete_object(ROOT, "bkt", "a"))
    assert nsenv.run(nsenv.ns.delete_objects(ROOT, "bkt", ["b", "c"])) == [
        ("b", True), ("c", True)]
    rows = [(r.key, r.marker, r.is_latest) for r in nsenv.ns.iter_versions("bkt")]
    assert rows == [("a", True, True), ("a", False, False), ("b", True, True),
                    ("b", False, False), ("c", True, True)]
