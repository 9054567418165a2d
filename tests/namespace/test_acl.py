"""POSIX ACLs through the namespace: the xattr calls, access decisions, chmod and the mask,
inheritance on every kind of create (POSIX and S3), and the S3 -> POSIX table.

Users as in test_permissions: alice 1000:1000, bob 1001:1001, carol 1002 (+1000), dave
1003:1000.  ``erin`` (1004:1004, in group 1005) appears only in ACL entries.
"""

from __future__ import annotations

import errno
import os
import stat

import pytest

from tierd.acl import Identity, may_access, s3map
from tierd.acl import posix_acl as pa
from tierd.namespace import ROOT_INO

from .conftest import ALICE, BOB, CAROL, DAVE, ROOT, NsEnv

R, W, X = os.R_OK, os.W_OK, os.X_OK
ERIN = Identity(1004, 1004, frozenset({1005}))
ACC, DEF = pa.ACCESS_XATTR, pa.DEFAULT_XATTR


def acl(text: str) -> bytes:
    """An ACL blob from getfacl-like short text: ``u::rw-,u:1001:r--,g::r--,m::r--,o::---``."""
    tags = {"u": (pa.USER_OBJ, pa.USER), "g": (pa.GROUP_OBJ, pa.GROUP), "m": (pa.MASK,) * 2,
            "o": (pa.OTHER,) * 2}
    out = []
    for part in text.split(","):
        kind, who, perm = part.split(":")
        bits = sum(b for c, b in (("r", 4), ("w", 2), ("x", 1)) if c in perm)
        tag = tags[kind][1 if who else 0]
        out.append(pa.AclEntry(tag, bits, int(who) if who else pa.UNDEFINED_ID))
    return pa.serialize(out)


def setup_file(env: NsEnv, text: str, data: bytes = b"hello") -> tuple[int, int]:
    """Bucket ``bkt`` (0777) and alice's file ``f`` in it with access ACL ``text``."""
    b = env.bucket()
    ino = env.write_file(ALICE, b, b"f", data, mode=0o600)
    env.run(env.ns.setxattr(ALICE, ino, ACC, acl(text)))
    return b, ino


def inode(env: NsEnv, ino: int) -> object:
    return env.run(env.ns.getattr(ROOT, ino))


# -- the xattr calls ------------------------------------------------------------------------
def test_set_get_list_remove(nsenv: NsEnv) -> None:
    text = "u::rw-,u:1001:r--,g::---,m::r--,o::---"
    _, ino = setup_file(nsenv, text)
    assert nsenv.run(nsenv.ns.getxattr(BOB, ino, ACC)) == acl(text)  # anyone may read it
    assert ACC in nsenv.run(nsenv.ns.listxattr(BOB, ino))
    attrs = nsenv.run(nsenv.ns.getattr(ALICE, ino))
    assert stat.S_IMODE(attrs.mode) == 0o640  # the mask is the group class
    nsenv.run(nsenv.ns.removexattr(ALICE, ino, ACC))
    nsenv.err(errno.ENODATA, nsenv.ns.getxattr(ALICE, ino, ACC))
    assert ACC not in nsenv.run(nsenv.ns.listxattr(ALICE, ino))
    assert stat.S_IMODE(nsenv.run(nsenv.ns.getattr(ALICE, ino)).mode) == 0o640  # mode stays
    nsenv.run(nsenv.ns.removexattr(ALICE, ino, ACC))  # removing nothing succeeds, as on ext4


def test_minimal_acl_is_just_the_mode(nsenv: NsEnv) -> None:
    _, ino = setup_file(nsenv, "u::rwx,g::r-x,o::r--")
    nsenv.err(errno.ENODATA, nsenv.ns.getxattr(ALICE, ino, ACC))
    assert stat.S_IMODE(nsenv.run(nsenv.ns.getattr(ALICE, ino)).mode) == 0o754
    # an empty ACL (header only) removes
    nsenv.run(nsenv.ns.setxattr(ALICE, ino, ACC, acl("u::rw-,u:1001:r--,g::---,m::r--,o::---")))
    nsenv.run(nsenv.ns.setxattr(ALICE, ino, ACC, pa.serialize(())))
    nsenv.err(errno.ENODATA, nsenv.ns.getxattr(ALICE, ino, ACC))


def test_who_may_set(nsenv: NsEnv) -> None:
    b, ino = setup_file(nsenv, "u::rw-,g::r--,o::r--")
    nsenv.err(errno.EPERM, nsenv.ns.setxattr(BOB, ino, ACC, acl("u::rw-,g::rw-,o::rw-")))
    nsenv.err(errno.EPERM, nsenv.ns.removexattr(BOB, ino, ACC))
    nsenv.run(nsenv.ns.setxattr(ROOT, ino, ACC, acl("u::rw-,u:1001:rw-,g::r--,m::rw-,o::---")))
    nsenv.err(errno.EACCES, nsenv.ns.setxattr(ALICE, ino, DEF, acl("u::rw-,g::r--,o::r--")))
    nsenv.run(nsenv.ns.removexattr(ALICE, ino, DEF))  # no default ACL on a file: nothing to do
    nsenv.err(errno.EINVAL, nsenv.ns.setxattr(ALICE, ino, ACC, b"\x02\x00\x00\x00\x01"))
    nsenv.err(errno.EINVAL, nsenv.ns.setxattr(
        ALICE, ino, ACC, acl("u::rw-,u:1001:r--,g::r--,o::---")))  # named entry, no mask
    nsenv.err(errno.EOPNOTSUPP, nsenv.ns.setxattr(ALICE, ino, b"system.other", b"x"))
    nsenv.err(errno.EOPNOTSUPP, nsenv.ns.getxattr(ALICE, ino, b"system.nfs4_acl"))
    link = nsenv.run(nsenv.ns.symlink(ALICE, b, b"l", b"f"))
    nsenv.err(errno.EOPNOTSUPP, nsenv.ns.setxattr(ROOT, link.ino, ACC, acl("u::rw-,g::r--,"
                                                                          "o::r--")))


def test_setting_an_acl_clears_setgid_outside_the_group(nsenv: NsEnv) -> None:
    b = nsenv.bucket()
    ino = nsenv.write_file(ALICE, b, b"f", b"x", mode=0o600)
    nsenv.run(nsenv.ns.setattr(ROOT, ino, gid=1005))  # a group alice is not in
    nsenv.run(nsenv.ns.setattr(ROOT, ino, mode=0o2770))
    nsenv.run(nsenv.ns.setxattr(ALICE, ino, ACC, acl("u::rwx,u:1001:r--,g::rwx,m::rwx,o::---")))
    assert stat.S_IMODE(nsenv.run(nsenv.ns.getattr(ALICE, ino)).mode) == 0o770
    nsenv.run(nsenv.ns.setattr(ROOT, ino, mode=0o2770))
    nsenv.run(nsenv.ns.setxattr(ROOT, ino, ACC, acl("u::rwx,u:1001:r--,g::rwx,m::r-x,o::---")))
    assert stat.S_IMODE(nsenv.run(nsenv.ns.getattr(ALICE, ino)).mode) == 0o2750  # root keeps


# -- access ----------------------------------------------------------------------------------
def test_named_entries_decide(nsenv: NsEnv) -> None:
    # bob: named rw (masked to r), group 1005 (erin): r, owning group 1000: none, other none
    _, ino = setup_file(nsenv, "u::rw-,u:1001:rw-,g::---,g:1005:r--,m::r--,o::---")
    node = nsenv.run(nsenv.ns.getattr(ROOT, ino))
    assert may_access(BOB, node, R) and not may_access(BOB, node, W)
    assert may_access(ERIN, node, R) and not may_access(ERIN, node, R | W)
    assert not may_access(CAROL, node, R)  # in the owning group, which has nothing
    assert nsenv.read_file(BOB, ino) == b"hello"
    nsenv.err(errno.EACCES, nsenv.ns.open(BOB, ino, os.O_WRONLY))
    nsenv.err(errno.EACCES, nsenv.ns.open(DAVE, ino, os.O_RDONLY))
    nsenv.err(errno.EACCES, nsenv.ns.open(Identity(1006, 1006), ino, os.O_RDONLY))
    assert nsenv.read_file(ALICE, ino) == b"hello"


def test_chmod_updates_the_mask(nsenv: NsEnv) -> None:
    _, ino = setup_file(nsenv, "u::rw-,u:1001:rw-,g::r--,m::rw-,o::---")
    nsenv.run(nsenv.ns.open(BOB, ino, os.O_WRONLY))
    nsenv.run(nsenv.ns.setattr(ALICE, ino, mode=0o640))
    assert nsenv.run(nsenv.ns.getxattr(ALICE, ino, ACC)) == acl(
        "u::rw-,u:1001:rw-,g::r--,m::r--,o::---")
    nsenv.err(errno.EACCES, nsenv.ns.open(BOB, ino, os.O_WRONLY))
    assert nsenv.read_file(BOB, ino) == b"hello"
    nsenv.run(nsenv.ns.setattr(ALICE, ino, mode=0o604))  # mask ---: the ACL is not consulted
    assert nsenv.run(nsenv.ns.getxattr(ALICE, ino, ACC)) == acl(
        "u::rw-,u:1001:rw-,g::r--,m::---,o::r--")
    assert nsenv.read_file(BOB, ino) == b"hello"  # bob is "other" now, as on Linux
    nsenv.err(errno.EACCES, nsenv.ns.open(DAVE, ino, os.O_RDONLY))  # owning group: ---


def test_acls_survive_a_restart(nsenv: NsEnv) -> None:
    text = "u::rw-,u:1001:r--,g::---,m::r--,o::---"
    b, ino = setup_file(nsenv, text)
    d = nsenv.run(nsenv.ns.mkdir(ALICE, b, b"d", 0o755))
    nsenv.run(nsenv.ns.setxattr(ALICE, d.ino, DEF, acl(text)))
    nsenv.reopen()
    assert nsenv.run(nsenv.ns.getxattr(ALICE, ino, ACC)) == acl(text)
    assert nsenv.run(nsenv.ns.getxattr(ALICE, d.ino, DEF)) == acl(text)
    assert nsenv.read_file(BOB, ino) == b"hello"


# -- inheritance -----------------------------------------------------------------------------
DEFAULT = "u::rwx,u:1001:rwx,g::r-x,g:1005:rw-,m::rwx,o::---"


def acl_dir(env: NsEnv) -> int:
    b = env.bucket()
    d = env.run(env.ns.mkdir(ALICE, b, b"shared", 0o755))
    env.run(env.ns.setxattr(ALICE, d.ino, DEF, acl(DEFAULT)))
    env.run(env.ns.setxattr(ALICE, d.ino, ACC, acl(DEFAULT)))  # bob may create in it
    return d.ino


def test_create_and_mknod_inherit(nsenv: NsEnv) -> None:
    d = acl_dir(nsenv)
    f, fh = nsenv.run(nsenv.ns.create(ALICE, d, b"f", stat.S_IFREG | 0o666, os.O_WRONLY,
                                      umask=0o077))
    nsenv.run(nsenv.ns.release(fh))
    assert stat.S_IMODE(f.mode) == 0o660  # umask ignored; mask rw- from the create mode
    assert nsenv.run(nsenv.ns.getxattr(ALICE, f.ino, ACC)) == acl(
        "u::rw-,u:1001:rwx,g::r-x,g:1005:rw-,m::rw-,o::---")
    nsenv.err(errno.ENODATA, nsenv.ns.getxattr(ALICE, f.ino, DEF))  # files get no default
    assert may_access(BOB, f, R | W) and not may_access(DAVE, f, W)
    fifo = nsenv.run(nsenv.ns.mknod(ALICE, d, b"p", stat.S_IFIFO | 0o640, umask=0o022))
    assert stat.S_IMODE(fifo.mode) == 0o640
    assert nsenv.run(nsenv.ns.getxattr(ALICE, fifo.ino, ACC)) == acl(
        "u::rw-,u:1001:rwx,g::r-x,g:1005:rw-,m::r--,o::---")


def test_mkdir_inherits_the_default_too(nsenv: NsEnv) -> None:
    d = acl_dir(nsenv)
    sub = nsenv.run(nsenv.ns.mkdir(BOB, d, b"sub", 0o777, umask=0o022))
    assert stat.S_IMODE(sub.mode) == 0o770
    assert nsenv.run(nsenv.ns.getxattr(BOB, sub.ino, DEF)) == acl(DEFAULT)
    assert nsenv.run(nsenv.ns.getxattr(BOB, sub.ino, ACC)) == acl(DEFAULT)
    deeper = nsenv.run(nsenv.ns.mkdir(BOB, sub.ino, b"deeper", 0o700))
    assert stat.S_IMODE(deeper.mode) == 0o700
    assert nsenv.run(nsenv.ns.getxattr(BOB, deeper.ino, DEF)) == acl(DEFAULT)
    # the default ACL is copied, not shared: changing the parent's leaves the child's
    nsenv.run(nsenv.ns.removexattr(ALICE, d, DEF))
    assert nsenv.run(nsenv.ns.getxattr(BOB, sub.ino, DEF)) == acl(DEFAULT)
    plain = nsenv.run(nsenv.ns.mkdir(BOB, d, b"plain", 0o777, umask=0o027))
    assert stat.S_IMODE(plain.mode) == 0o750  # no default any more: the umask applies
    nsenv.err(errno.ENODATA, nsenv.ns.getxattr(BOB, plain.ino, ACC))


def test_minimal_default_acl_gives_mode_without_umask(nsenv: NsEnv) -> None:
    b = nsenv.bucket()
    d = nsenv.run(nsenv.ns.mkdir(ALICE, b, b"d", 0o755))
    nsenv.run(nsenv.ns.setxattr(ALICE, d.ino, DEF, acl("u::rwx,g::rwx,o::r-x")))
    f, fh = nsenv.run(nsenv.ns.create(ALICE, d.ino, b"f", stat.S_IFREG | 0o666, os.O_WRONLY,
                                      umask=0o077))
    nsenv.run(nsenv.ns.release(fh))
    assert stat.S_IMODE(f.mode) == 0o664
    nsenv.err(errno.ENODATA, nsenv.ns.getxattr(ALICE, f.ino, ACC))


def test_s3_puts_inherit_and_overwrites_keep(nsenv: NsEnv) -> None:
    d = acl_dir(nsenv)
    assert d
    nsenv.put(ALICE, "bkt", "shared/a/b/obj", b"data")
    a = nsenv.run(nsenv.ns.resolve(ROOT, "bkt/shared/a"))
    assert stat.S_IMODE(a.mode) == 0o770  # an implicit directory: 0777 masked by the ACL
    assert nsenv.run(nsenv.ns.getxattr(ROOT, a.ino, DEF)) == acl(DEFAULT)
    obj = nsenv.run(nsenv.ns.resolve(ROOT, "bkt/shared/a/b/obj"))
    assert stat.S_IMODE(obj.mode) == 0o660 and obj.acl_access
    assert nsenv.get(BOB, "bkt", "shared/a/b/obj") == b"data"  # named user bob: rwx
    assert nsenv.get(DAVE, "bkt", "shared/a/b/obj") == b"data"  # owning group: r-x
    nsenv.err(errno.EACCES, nsenv.ns.get_object(Identity(1006, 1006), "bkt", "shared/a/b/obj"))
    # bob may overwrite (named write on the object); it keeps alice's ownership and the ACL
    nsenv.put(BOB, "bkt", "shared/a/b/obj", b"bob's")
    again = nsenv.run(nsenv.ns.resolve(ROOT, "bkt/shared/a/b/obj"))
    assert again.uid == ALICE.uid and again.acl_access == obj.acl_access
    nsenv.err(errno.EACCES, nsenv.ns.put_object(DAVE, "bkt", "shared/x", _body(b"no")))


async def _body(data: bytes):  # type: ignore[no-untyped-def]
    yield data


def test_s3_creations_are_private_without_a_default_acl(nsenv: NsEnv) -> None:
    """An S3 object is its owner's alone (0600 whatever the umask); the directories a PUT
    creates are prefixes: they take their parent's permissions (tierd.acl.canned)."""
    nsenv.bucket()
    nsenv.put(ALICE, "bkt", "p/q", b"x")
    assert stat.S_IMODE(nsenv.run(nsenv.ns.resolve(ROOT, "bkt/p")).mode) == 0o777
    assert stat.S_IMODE(nsenv.run(nsenv.ns.resolve(ROOT, "bkt/p/q")).mode) == 0o600
    nsenv.bucket("bkt2", mode=0o1750)
    nsenv.put(ROOT, "bkt2", "a/b/c", b"x")
    for path in ("bkt2/a", "bkt2/a/b"):
        assert stat.S_IMODE(nsenv.run(nsenv.ns.resolve(ROOT, path)).mode) == 0o1750, path
    b = nsenv.run(nsenv.ns.create_bucket(ALICE, "made-by-s3"))
    assert stat.S_IMODE(b.mode) == 0o700 and b.uid == ALICE.uid


def test_s3_delete_and_list_follow_acls(nsenv: NsEnv) -> None:
    b = nsenv.bucket()
    d = nsenv.run(nsenv.ns.mkdir(ALICE, b, b"d", 0o700))
    nsenv.put(ALICE, "bkt", "d/k", b"x")
    assert [k for k, _ in nsenv.run(nsenv.ns.list_objects(BOB, "bkt")).contents] == []
    nsenv.err(errno.EACCES, nsenv.ns.delete_object(BOB, "bkt", "d/k"))
    nsenv.run(nsenv.ns.setxattr(ALICE, d.ino, ACC, acl("u::rwx,u:1001:rwx,g::---,m::rwx,"
                                                        "o::---")))
    assert [k for k, _ in nsenv.run(nsenv.ns.list_objects(BOB, "bkt")).contents] == ["d/k"]
    assert nsenv.run(nsenv.ns.delete_object(BOB, "bkt", "d/k"))


def test_multipart_checks_at_create_and_complete(nsenv: NsEnv) -> None:
    b = nsenv.bucket()
    d = nsenv.run(nsenv.ns.mkdir(ALICE, b, b"d", 0o755))
    nsenv.err(errno.EACCES, nsenv.ns.create_multipart(BOB, "bkt", "d/big"))
    nsenv.run(nsenv.ns.setxattr(ALICE, d.ino, ACC, acl("u::rwx,u:1001:rwx,g::r-x,m::rwx,"
                                                        "o::r-x")))
    up = nsenv.run(nsenv.ns.create_multipart(BOB, "bkt", "d/big"))
    part = nsenv.run(nsenv.ns.upload_part(BOB, up.upload_id, 1, _body(b"part")))
    nsenv.run(nsenv.ns.setattr(ALICE, d.ino, mode=0o757))  # chmod: the mask drops write
    nsenv.err(errno.EACCES, nsenv.ns.complete_multipart(BOB, up.upload_id,
                                                        [(1, part.etag)]))
    nsenv.run(nsenv.ns.setattr(ALICE, d.ino, mode=0o777))  # and gives it back
    assert nsenv.run(nsenv.ns.complete_multipart(BOB, up.upload_id, [(1, part.etag)])).size == 4


# -- the S3 -> POSIX table -------------------------------------------------------------------
def test_table_names_the_checks() -> None:
    assert s3map.requirement("s3:GetObject") is s3map.S3_ACTIONS["GetObject"]
    assert s3map.describe("GetObject") == ["search on every directory above the key",
                                           "read on the object"]
    put = s3map.describe("PutObject")
    assert "write+search on the key's parent directory (when the key does not exist yet)" in put
    assert "write on the object (when the key exists)" in put
    assert any("sticky" in line for line in s3map.describe("DeleteObject"))
    copy = s3map.posix_checks("CopyObject")
    assert s3map.posix_checks("CopyObject", "source") == s3map.posix_checks("GetObject")
    assert len(copy) == len(s3map.posix_checks("GetObject")) + len(
        s3map.posix_checks("PutObject"))
    assert s3map.posix_checks("ListObjectsV2") == (
        s3map.Check(s3map.Target.DIRECTORY, R | X),)
    with pytest.raises(KeyError):
        s3map.requirement("s3:NoSuchAction")


def test_sticky_rule_through_the_table(nsenv: NsEnv) -> None:
    b = nsenv.bucket()
    d = nsenv.run(nsenv.ns.mkdir(ROOT, b, b"tmp", 0o777))
    nsenv.run(nsenv.ns.setattr(ROOT, d.ino, mode=0o1777))
    nsenv.put(ALICE, "bkt", "tmp/alice", b"x")
    nsenv.err(errno.EPERM, nsenv.ns.delete_object(BOB, "bkt", "tmp/alice"))
    assert nsenv.run(nsenv.ns.delete_object(ALICE, "bkt", "tmp/alice"))
    assert ROOT_INO
