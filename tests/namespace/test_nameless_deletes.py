"""An inode that lost its last name has no reverse-index (``L``) key left when placement
hears of it.

``PlacementCore.deleted`` finds the cold keys an unnamed file's objects must leave without
scanning the reverse index (``file_keys(named=False)``): the scan of the transaction's
layers for keys the same transaction just removed was ~30% of an unlink's handler time.
That is right only while every caller removes the file's names before the inode goes.  Here
every door's way to remove a file's last name runs -- unlink, a rename over it, the last of
two hard links, an S3 overwrite and delete, an unversioned and a versioned overwrite, a
versioned delete marker then the version's delete, an orphan's last close, a suspended
bucket's ``null`` replaced -- and each time ``deleted`` is called, the inode's ``L`` keys are
read in its transaction: none may be there, and the pending deletes it writes match what
the full scan would have written."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import Any

import pytest

from tierd.acl import Identity
from tierd.meta import MetaTxn
from tierd.placement.engine import PlacementCore
from tierd.placement.paths import file_keys

from .conftest import NsEnv

ROOT = Identity.ROOT


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, list[Any], bool]]]:
    """Every ``deleted`` call: (inode, its links then, whether the keys without the scan
    equal the keys with it)."""
    calls: list[tuple[int, list[Any], bool]] = []
    real = PlacementCore.deleted

    def checking(self: PlacementCore, tx: MetaTxn, ino: int, held: bool = False) -> None:
        calls.append((ino, tx.links(ino),
                      file_keys(tx, ino, named=False) == file_keys(tx, ino)))
        real(self, tx, ino, held)

    monkeypatch.setattr(PlacementCore, "deleted", checking)
    yield calls


def _file(env: NsEnv, parent: int, name: bytes, data: bytes = b"x") -> int:
    return env.write_file(ROOT, parent, name, data)


def test_every_last_name_removed_before_placement_hears(
        nsenv: NsEnv, seen: list[tuple[int, list[Any], bool]]) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket("bkt")
    expected: set[int] = set()

    expected.add(_file(env, b, b"unlinked"))
    env.run(ns.unlink(ROOT, b, b"unlinked"))

    expected.add(_file(env, b, b"target"))
    _file(env, b, b"source")
    env.run(ns.rename(ROOT, b, b"source", b, b"target"))  # the old target loses its name

    linked = _file(env, b, b"one")
    env.run(ns.link(ROOT, linked, b, b"two"))
    env.run(ns.unlink(ROOT, b, b"one"))
    assert not any(ino == linked for ino, _, _ in seen)  # a name is left: not deleted
    env.run(ns.unlink(ROOT, b, b"two"))
    expected.add(linked)

    overwritten = env.put(ROOT, "bkt", "obj", b"first").ino
    env.put(ROOT, "bkt", "obj", b"second")  # the first object's inode goes
    expected.add(overwritten)
    expected.add(env.put(ROOT, "bkt", "obj", b"third").ino)
    env.run(ns.delete_object(ROOT, "bkt", "obj"))

    orphan, fh = env.run(ns.create(ROOT, b, b"orphan", stat.S_IFREG | 0o644,
                                   os.O_RDWR | os.O_CREAT))
    env.run(ns.unlink(ROOT, b, b"orphan"))  # open: an orphan until its last close
    env.run(ns.release(fh))
    expected.add(orphan.ino)

    v = env.bucket("ver")
    env.run(ns.set_versioning("ver", "Enabled"))
    env.put(ROOT, "ver", "k", b"v1")
    env.put(ROOT, "ver", "k", b"v2")  # v1 becomes noncurrent: no name, not deleted
    env.run(ns.delete_version(ROOT, "ver", "k", None))  # a marker: v2 noncurrent
    listing = env.run(ns.list_versions(ROOT, "ver"))
    kept = [e for e in listing.entries if e.inode is not None]
    assert len(kept) == 2
    for e in kept:  # each noncurrent version goes for good: its inode with it
        env.run(ns.delete_version(ROOT, "ver", "k", e.vid))
        expected.add(e.inode.ino)
    _file(env, v, b"plain")
    env.run(ns.unlink(ROOT, v, b"plain"))  # through the mount: a marker, the file kept

    env.run(ns.set_versioning("ver", "Suspended"))
    env.put(ROOT, "ver", "s", b"null 1")
    expected.add(env.put(ROOT, "ver", "s", b"null 2").ino)
    env.put(ROOT, "ver", "s", b"null 3")  # each null version replaces the one before

    assert seen, "no inode reached placement's deleted()"
    assert expected <= {ino for ino, _, _ in seen}
    for ino, links, same in seen:
        assert links == [], f"inode {ino} still had names {links} when deleted"
        assert same, f"inode {ino}: keys without the scan differ from the scan's"
