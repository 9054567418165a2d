"""The anonymous grant: what unsigned S3 requests may do with an inode, evaluated by the one
permission function (``may_access``) within the inode's "other" bits, set by the
public-read(-write) canned ACLs, narrowed by chmod and setfacl, and described back by
``canned.describe``/``canned.grants``."""

from __future__ import annotations

import errno
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nsplacement import close_namespace, open_namespace

from tierd.acl import Identity, canned, may_access
from tierd.acl import posix_acl as pacl
from tierd.acl.modes import R_OK, W_OK, X_OK, anonymous_bits
from tierd.errors import FsError
from tierd.meta import Inode, MetaStore

ANON = Identity.ANONYMOUS
ROOT = Identity.ROOT


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


def test_may_access_gives_anonymous_its_grant_within_the_other_bits() -> None:
    f = Inode(ino=5, mode=stat.S_IFREG | 0o644, uid=1000, gid=1000, anon=R_OK)
    assert may_access(ANON, f, R_OK) and not may_access(ANON, f, W_OK)
    f.mode = stat.S_IFREG | 0o640  # other bits closed: so is the grant
    assert not may_access(ANON, f, R_OK) and anonymous_bits(f) == 0
    f.mode, f.anon = stat.S_IFREG | 0o644, 0  # other bits alone give anonymous nothing
    assert not may_access(ANON, f, R_OK)
    assert may_access(Identity(1001, 1001), f, R_OK)  # ... but every signed user
    d = Inode(ino=6, mode=stat.S_IFDIR | 0o777, uid=0, gid=0, anon=R_OK | X_OK)
    assert may_access(ANON, d, R_OK | X_OK) and not may_access(ANON, d, W_OK)


def test_canned_acls_set_describe_and_report_the_grant() -> None:
    for name, anon_file, anon_dir in (("public-read", 4, 5), ("public-read-write", 6, 7),
                                      ("authenticated-read", 0, 0), ("private", 0, 0)):
        for kind, want in ((stat.S_IFREG, anon_file), (stat.S_IFDIR, anon_dir)):
            mode, blob, anon = canned.apply(kind | 0o600, name, owner=7, bucket_owner=7)
            assert anon == want, (name, kind)
            inode = Inode(ino=9, mode=mode, uid=7, gid=7, acl_access=blob, anon=anon)
            assert canned.describe(inode, 7) == name
    inode = Inode(ino=9, mode=stat.S_IFDIR | 0o750, uid=7, gid=7)
    assert canned.describe(inode, 7) == "custom"
    grants = canned.grants(stat.S_IFREG | 0o666, 7, b"", anonymous=6)
    assert {(g.group, g.permission) for g in grants if g.group == canned.ALL_USERS} == {
        (canned.ALL_USERS, "READ"), (canned.ALL_USERS, "WRITE")}


async def test_chmod_and_setfacl_only_narrow_the_grant(tmp_path: Path) -> None:
    store = MetaStore.open_lmdb(tmp_path / "meta")
    ns = await open_namespace(store, tmp_path, umask=0o022)
    try:
        await ns.create_bucket(ROOT, "bkt")
        await ns.set_canned_acl(ROOT, "bkt", "", "public-read")
        obj = await ns.put_object(ROOT, "bkt", "a/f", _body(b"x"),
                                  {canned.META_KEY: "public-read"})
        assert (await ns.head_object(ANON, "bkt", "a/f")).size == 1  # prefix a/: the bucket's
        await ns.setattr(ROOT, obj.ino, mode=0o640)
        with pytest.raises(FsError) as e:
            await ns.head_object(ANON, "bkt", "a/f")
        assert e.value.errno == errno.EACCES
        await ns.setattr(ROOT, obj.ino, mode=0o644)  # other users again, not anonymous ones
        with pytest.raises(FsError):
            await ns.head_object(ANON, "bkt", "a/f")
        await ns.set_canned_acl(ROOT, "bkt", "a/f", "public-read")
        assert (await ns.head_object(ANON, "bkt", "a/f")).size == 1
        acl = pacl.serialize([pacl.AclEntry(pacl.USER_OBJ, 6), pacl.AclEntry(pacl.GROUP_OBJ, 4),
                              pacl.AclEntry(pacl.OTHER, 0)])
        await ns.setxattr(ROOT, obj.ino, pacl.ACCESS_XATTR, acl, 0)  # setfacl o::---
        with pytest.raises(FsError):
            await ns.head_object(ANON, "bkt", "a/f")
        assert (await ns.resolve(ROOT, "bkt/a/f")).anon == 0
        # an S3 overwrite keeps the grant, as it keeps the mode and the ACL
        await ns.set_canned_acl(ROOT, "bkt", "a/f", "public-read")
        await ns.put_object(ROOT, "bkt", "a/f", _body(b"yy"))
        assert (await ns.head_object(ANON, "bkt", "a/f")).size == 2
    finally:
        await close_namespace(ns)
        store.close()
