"""Mode-bit permissions through the namespace, with Linux's answers as the reference.

Users: alice (1000:1000), bob (1001:1001, in no shared group), carol (1002:1002 with 1000 as a
supplementary group), dave (1003 with 1000 as his primary group) and root.  Every test works in
a bucket ``bkt`` that is a world-writable directory owned by root.
"""

from __future__ import annotations

import errno
import os
import stat

import pytest

from tierd.acl import Identity
from tierd.namespace import ROOT_INO, UTIME_NOW, XATTR_CREATE

from .conftest import ALICE, BOB, CAROL, DAVE, ROOT, NsEnv, chunks

R, W, X = os.R_OK, os.W_OK, os.X_OK
USERS = {"alice": ALICE, "bob": BOB, "carol": CAROL, "dave": DAVE, "root": ROOT}


def mkdir(env: NsEnv, who: Identity, parent: int, name: bytes, mode: int) -> int:
    """A directory with exactly ``mode`` (the namespace stores what it is given; chmod
    makes the special bits exact too)."""
    inode = env.run(env.ns.mkdir(who, parent, name, mode & 0o777))
    if stat.S_IMODE(inode.mode) != mode:
        inode = env.run(env.ns.setattr(who, inode.ino, mode=mode))
    assert stat.S_IMODE(inode.mode) == mode
    return inode.ino


def chmod(env: NsEnv, who: Identity, ino: int, mode: int) -> None:
    inode = env.run(env.ns.setattr(who, ino, mode=mode))
    assert stat.S_IMODE(inode.mode) == mode


def alice_file(env: NsEnv, parent: int, mode: int, data: bytes = b"secret") -> int:
    ino = env.write_file(ALICE, parent, b"f", data, mode=0o600)
    chmod(env, ALICE, ino, mode)
    return ino


def allowed(ident: Identity, owner: int, group: int, mode: int, mask: int) -> bool:
    """POSIX class selection: the owner class if the uid matches, else the group class if
    any of the caller's groups matches, else other (first match decides, no fall-through)."""
    if ident.uid == owner:
        bits = (mode >> 6) & 7
    elif ident.gid == group or group in ident.groups:
        bits = (mode >> 3) & 7
    else:
        bits = mode & 7
    return bits & mask == mask


# -- files: open flags and access() ---------------------------------------------------------
FILE_MODES = [0o000, 0o400, 0o200, 0o100, 0o640, 0o604, 0o060, 0o007, 0o077, 0o707, 0o750]
OPEN_FLAGS = {"r": (os.O_RDONLY, R), "w": (os.O_WRONLY, W), "rw": (os.O_RDWR, R | W)}


@pytest.mark.parametrize("mode", FILE_MODES, ids=oct)
def test_file_mode_bits_for_each_class(nsenv: NsEnv, mode: int) -> None:
    env, ns = nsenv, nsenv.ns
    ino = alice_file(env, env.bucket(), mode)
    for who in (ALICE, DAVE, CAROL, BOB):
        for mask in (R, W, X, R | W, R | X, R | W | X):
            if allowed(who, 1000, 1000, mode, mask):
                env.run(ns.access(who, ino, mask))
            else:
                env.err(errno.EACCES, ns.access(who, ino, mask))
        for label, (flags, mask) in OPEN_FLAGS.items():
            if allowed(who, 1000, 1000, mode, mask):
                fh = env.run(ns.open(who, ino, flags))
                env.run(ns.release(fh))
            else:
                err = env.err(errno.EACCES, ns.open(who, ino, flags))
                assert err.errno == errno.EACCES, f"{label} by uid {who.uid}"
    env.run(ns.access(BOB, ino, os.F_OK))  # existence needs no permission on the file


def test_owner_class_decides_even_when_others_may_more(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    ino = alice_file(env, env.bucket(), 0o077)
    env.err(errno.EACCES, ns.open(ALICE, ino, os.O_RDONLY))
    fh = env.run(ns.open(BOB, ino, os.O_RDWR))  # "other" may read and write
    env.run(ns.release(fh))
    chmod(env, ALICE, ino, 0o707)  # the group class gets nothing, the others everything
    env.err(errno.EACCES, ns.open(DAVE, ino, os.O_RDONLY))  # primary group
    env.err(errno.EACCES, ns.open(CAROL, ino, os.O_RDONLY))  # supplementary group
    env.run(ns.release(env.run(ns.open(BOB, ino, os.O_RDONLY))))


def test_read_and_write_through_handles_follow_the_open_mode(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    ino = alice_file(env, env.bucket(), 0o644, b"hello")
    fh = env.run(ns.open(BOB, ino, os.O_RDONLY))
    assert env.run(ns.read(fh, 0, 100)) == b"hello"
    env.err(errno.EBADF, ns.write(fh, 0, b"x"))
    env.run(ns.release(fh))
    fh = env.run(ns.open(ALICE, ino, os.O_WRONLY))
    env.err(errno.EBADF, ns.read(fh, 0, 1))
    env.run(ns.release(fh))


def test_o_trunc_needs_write_permission(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    ino = alice_file(env, env.bucket(), 0o644, b"keep me")
    env.err(errno.EACCES, ns.open(BOB, ino, os.O_RDONLY | os.O_TRUNC))
    env.err(errno.EACCES, ns.open(BOB, ino, os.O_WRONLY | os.O_TRUNC))
    assert env.read_file(ALICE, ino) == b"keep me"
    env.err(errno.EACCES, ns.setattr(BOB, ino, size=0))  # truncate(2) likewise
    assert env.run(ns.getattr(BOB, ino)).size == 7
    env.run(ns.release(env.run(ns.open(ALICE, ino, os.O_WRONLY | os.O_TRUNC))))
    assert env.run(ns.getattr(ALICE, ino)).size == 0


def test_create_over_an_existing_file_checks_the_file(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    alice_file(env, b, 0o644, b"data")
    flags = os.O_WRONLY | os.O_CREAT
    env.err(errno.EACCES, ns.create(BOB, b, b"f", stat.S_IFREG | 0o666, flags))
    env.err(errno.EEXIST, ns.create(BOB, b, b"f", stat.S_IFREG | 0o666, flags | os.O_EXCL))
    inode, fh = env.run(ns.create(BOB, b, b"f", stat.S_IFREG | 0o666, os.O_RDONLY | os.O_CREAT))
    assert inode.uid == 1000  # the existing file was opened, not replaced
    env.run(ns.release(fh))


# -- directories ---------------------------------------------------------------------------
def test_search_permission_for_lookup_and_resolve(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    d = mkdir(env, ALICE, env.bucket(), b"d", 0o700)
    env.write_file(ALICE, d, b"f", b"x")
    assert env.run(ns.lookup(ALICE, d, b"f")).uid == 1000
    env.err(errno.EACCES, ns.lookup(BOB, d, b"f"))
    env.err(errno.EACCES, ns.resolve(BOB, "bkt/d/f"))
    env.err(errno.EACCES, ns.resolve(BOB, "bkt/d/missing"))  # EACCES hides existence
    env.run(ns.resolve(BOB, "bkt/d"))  # the directory itself is reachable
    chmod(env, ALICE, d, 0o701)  # search only: lookup by name works, listing does not
    assert env.run(ns.lookup(BOB, d, b"f")).uid == 1000
    env.err(errno.EACCES, ns.listdir(BOB, d))
    chmod(env, ALICE, d, 0o604)  # read only: listing works, lookup does not
    assert env.names(BOB, d) == [b"f"]
    env.err(errno.EACCES, ns.lookup(BOB, d, b"f"))
    env.err(errno.EACCES, ns.lookup(ALICE, d, b"f"))  # 06xx: not even the owner may search


def test_listdir_needs_read_permission(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    d = mkdir(env, ALICE, env.bucket(), b"d", 0o750)
    assert env.names(DAVE, d) == []
    assert env.names(CAROL, d) == []
    env.err(errno.EACCES, ns.listdir(BOB, d))
    chmod(env, ALICE, d, 0o311)
    env.err(errno.EACCES, ns.listdir(ALICE, d))
    assert env.names(ROOT, d) == []


@pytest.mark.parametrize("mode", [0o500, 0o600, 0o100, 0o200, 0o000], ids=oct)
def test_changing_entries_needs_write_and_search_on_the_parent(nsenv: NsEnv, mode: int) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    d = mkdir(env, ALICE, b, b"d", 0o777)
    f = env.write_file(ALICE, d, b"f", b"x", mode=0o666)
    env.run(ns.mkdir(ALICE, d, b"sub", 0o777))
    chmod(env, ALICE, d, mode)
    reg = stat.S_IFREG | 0o644
    flags = os.O_WRONLY | os.O_CREAT
    env.err(errno.EACCES, ns.create(ALICE, d, b"new", reg, flags))
    env.err(errno.EACCES, ns.mknod(ALICE, d, b"node", reg))
    env.err(errno.EACCES, ns.mkdir(ALICE, d, b"newdir", 0o755))
    env.err(errno.EACCES, ns.symlink(ALICE, d, b"ln", b"f"))
    env.err(errno.EACCES, ns.link(ALICE, f, d, b"f2"))
    env.err(errno.EACCES, ns.unlink(ALICE, d, b"f"))
    env.err(errno.EACCES, ns.rmdir(ALICE, d, b"sub"))
    env.err(errno.EACCES, ns.rename(ALICE, d, b"f", d, b"g"))
    env.err(errno.EACCES, ns.rename(ALICE, d, b"f", b, b"g"))
    # root is not bound by the bits
    env.run(ns.unlink(ROOT, d, b"f"))
    env.run(ns.rmdir(ROOT, d, b"sub"))
    env.run(ns.mkdir(ROOT, d, b"rootdir", 0o755))


def test_rename_needs_write_on_both_parents(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    src = mkdir(env, ALICE, b, b"src", 0o755)
    dst = mkdir(env, ALICE, b, b"dst", 0o555)
    env.write_file(ALICE, src, b"f", b"x")
    env.err(errno.EACCES, ns.rename(ALICE, src, b"f", dst, b"f"))
    chmod(env, ALICE, dst, 0o755)
    chmod(env, ALICE, src, 0o555)
    env.err(errno.EACCES, ns.rename(ALICE, src, b"f", dst, b"f"))
    chmod(env, ALICE, src, 0o755)
    env.run(ns.rename(ALICE, src, b"f", dst, b"f"))
    assert env.names(ALICE, dst) == [b"f"]


def test_moving_a_directory_to_another_parent_needs_write_on_it(nsenv: NsEnv) -> None:
    """Its ".." entry changes (Linux: EACCES); within the same parent it does not."""
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    a = mkdir(env, ROOT, b, b"a", 0o777)
    c = mkdir(env, ROOT, b, b"c", 0o777)
    mkdir(env, ALICE, a, b"sub", 0o555)
    env.err(errno.EACCES, ns.rename(ALICE, a, b"sub", c, b"sub"))
    env.run(ns.rename(ALICE, a, b"sub", a, b"renamed"))  # same parent: allowed
    chmod(env, ALICE, env.run(ns.lookup(ALICE, a, b"renamed")).ino, 0o755)
    env.run(ns.rename(ALICE, a, b"renamed", c, b"sub"))


def test_rename_type_mismatch_comes_before_the_dotdot_write_check(nsenv: NsEnv) -> None:
    """Linux: may_delete() on the target (ENOTDIR/EISDIR) precedes the write check on a
    directory that changes parent (EACCES)."""
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    mkdir(env, BOB, b, b"d", 0o755)  # alice may not write it
    a = mkdir(env, ALICE, b, b"a", 0o755)
    env.write_file(ALICE, a, b"f", b"")
    env.err(errno.ENOTDIR, ns.rename(ALICE, b, b"d", a, b"f"))
    env.err(errno.EACCES, ns.rename(ALICE, b, b"d", a, b"new"))


def test_rmdir_permission_comes_before_emptiness(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    d = mkdir(env, ALICE, b, b"d", 0o777)
    sub = mkdir(env, ALICE, d, b"sub", 0o777)
    env.write_file(ALICE, sub, b"f", b"")
    chmod(env, ALICE, d, 0o555)
    env.err(errno.EACCES, ns.rmdir(ALICE, d, b"sub"))
    env.err(errno.ENOTEMPTY, ns.rmdir(ROOT, d, b"sub"))


def test_unlink_needs_no_permission_on_the_file(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    alice_file(env, b, 0o000)
    env.run(ns.unlink(BOB, b, b"f"))  # the bucket is 0777 and not sticky
    env.err(errno.ENOENT, ns.lookup(ALICE, b, b"f"))


# -- sticky directories ----------------------------------------------------------------------
@pytest.fixture
def sticky(nsenv: NsEnv) -> tuple[NsEnv, int, int]:
    """A 1777 directory owned by carol holding alice's file ``f`` and directory ``d``."""
    env = nsenv
    tmp = mkdir(env, CAROL, env.bucket(), b"tmp", 0o1777)
    f = env.write_file(ALICE, tmp, b"f", b"alice's", mode=0o666)
    mkdir(env, ALICE, tmp, b"d", 0o777)
    return env, tmp, f


def test_sticky_others_cannot_remove_or_rename(sticky: tuple[NsEnv, int, int]) -> None:
    env, tmp, f = sticky
    ns = env.ns
    env.write_file(BOB, tmp, b"bobs", b"")
    env.err(errno.EPERM, ns.unlink(BOB, tmp, b"f"))
    env.err(errno.EPERM, ns.rmdir(BOB, tmp, b"d"))
    env.err(errno.EPERM, ns.rename(BOB, tmp, b"f", tmp, b"g"))
    env.err(errno.EPERM, ns.rename(BOB, tmp, b"bobs", tmp, b"f"))  # replacing alice's file
    env.err(errno.EPERM, ns.rename(BOB, tmp, b"bobs", tmp, b"f", flags=2))  # exchange
    env.err(errno.EPERM, ns.rename(BOB, tmp, b"f", tmp, b"bobs", flags=2))
    # writable is not removable: bob may write the 0666 file but not unlink it
    fh = env.run(ns.open(BOB, f, os.O_WRONLY))
    env.run(ns.release(fh))
    # the group doesn't help either
    env.err(errno.EPERM, ns.unlink(DAVE, tmp, b"f"))
    # but bob manages his own entries
    env.run(ns.rename(BOB, tmp, b"bobs", tmp, b"bobs2"))
    env.run(ns.unlink(BOB, tmp, b"bobs2"))
    assert set(env.names(ROOT, tmp)) == {b"d", b"f"}


@pytest.mark.parametrize("who", ["alice", "carol", "root"])
def test_sticky_owner_dir_owner_and_root_may_remove(
    sticky: tuple[NsEnv, int, int], who: str
) -> None:
    env, tmp, _ = sticky
    ident = USERS[who]
    env.run(env.ns.rename(ident, tmp, b"f", tmp, b"g"))
    env.run(env.ns.unlink(ident, tmp, b"g"))
    env.run(env.ns.rmdir(ident, tmp, b"d"))
    assert env.names(ROOT, tmp) == []


def test_sticky_bit_needs_write_too(nsenv: NsEnv) -> None:
    """The sticky rule is on top of the write bit: a 1755 directory refuses even the owner
    of an entry (EACCES, not EPERM)."""
    env, ns = nsenv, nsenv.ns
    tmp = mkdir(env, CAROL, env.bucket(), b"tmp", 0o1777)
    env.write_file(ALICE, tmp, b"f", b"")
    chmod(env, CAROL, tmp, 0o1755)
    env.err(errno.EACCES, ns.unlink(ALICE, tmp, b"f"))
    env.run(ns.unlink(CAROL, tmp, b"f"))  # the directory's owner has w
    assert env.names(ROOT, tmp) == []


def test_sticky_directory_user_xattrs_only_for_its_owner(nsenv: NsEnv) -> None:
    """Linux xattr_permission(): user.* attributes of a sticky directory may be changed only
    by its owner (EPERM), even by users with write permission."""
    env, ns = nsenv, nsenv.ns
    tmp = mkdir(env, CAROL, env.bucket(), b"tmp", 0o1777)
    env.run(ns.setxattr(CAROL, tmp, b"user.k", b"v"))
    env.err(errno.EPERM, ns.setxattr(ALICE, tmp, b"user.k", b"w"))
    env.err(errno.EPERM, ns.setxattr(ALICE, tmp, b"user.new", b"w", XATTR_CREATE))
    env.err(errno.EPERM, ns.removexattr(ALICE, tmp, b"user.k"))
    assert env.run(ns.getxattr(ALICE, tmp, b"user.k")) == b"v"  # reading is fine
    env.run(ns.setxattr(ROOT, tmp, b"user.k", b"root"))


# -- ownership: chmod, chown, chgrp ----------------------------------------------------------
def test_chmod_only_by_the_owner_or_root(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    ino = alice_file(env, env.bucket(), 0o666)
    env.err(errno.EPERM, ns.setattr(BOB, ino, mode=0o777))
    env.err(errno.EPERM, ns.setattr(BOB, ino, mode=0o777, killpriv=lambda: False))
    env.err(errno.EPERM, ns.setattr(DAVE, ino, mode=0o777))  # same group is not enough
    chmod(env, ALICE, ino, 0o600)
    chmod(env, ROOT, ino, 0o640)
    assert stat.S_IMODE(env.run(ns.getattr(ALICE, ino)).mode) == 0o640
    assert stat.S_ISREG(env.run(ns.getattr(ALICE, ino)).mode)  # the type survives chmod


def test_chmod_setgid_is_dropped_for_a_group_the_owner_is_not_in(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    ino = alice_file(env, env.bucket(), 0o644)
    env.run(ns.setattr(ROOT, ino, gid=1001))
    inode = env.run(ns.setattr(ALICE, ino, mode=0o2755))
    assert stat.S_IMODE(inode.mode) == 0o755
    inode = env.run(ns.setattr(ALICE, ino, mode=0o4755))  # set-user-ID is hers to set
    assert stat.S_IMODE(inode.mode) == 0o4755
    inode = env.run(ns.setattr(ROOT, ino, mode=0o2755))  # root may
    assert stat.S_IMODE(inode.mode) == 0o2755


def test_chmod_setgid_on_a_directory_is_dropped_likewise(nsenv: NsEnv) -> None:
    """Linux (setattr_copy) applies the rule to directories too."""
    env, ns = nsenv, nsenv.ns
    d = mkdir(env, ALICE, env.bucket(), b"d", 0o755)
    env.run(ns.setattr(ROOT, d, gid=0))
    inode = env.run(ns.setattr(ALICE, d, mode=0o2775))
    assert stat.S_IMODE(inode.mode) == 0o775
    sub = env.run(ns.mkdir(ALICE, d, b"sub", 0o755))
    assert stat.S_IMODE(sub.mode) == 0o755 and sub.gid == 1000  # nothing to inherit


def test_chown_uid_only_by_root(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    ino = alice_file(env, env.bucket(), 0o644)
    env.err(errno.EPERM, ns.setattr(ALICE, ino, uid=1001))  # giving away
    env.err(errno.EPERM, ns.setattr(BOB, ino, uid=1001))  # taking
    inode = env.run(ns.setattr(ALICE, ino, uid=1000))  # to herself: no change, allowed
    assert inode.uid == 1000
    inode = env.run(ns.setattr(ROOT, ino, uid=1001, gid=1001))
    assert (inode.uid, inode.gid) == (1001, 1001)
    fh = env.run(ns.open(BOB, ino, os.O_RDWR))  # bob is the owner now: rw
    env.run(ns.release(fh))


def test_chgrp_by_the_owner_to_her_own_groups_only(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    ino = env.write_file(CAROL, env.bucket(), b"c", b"")
    assert env.run(ns.getattr(CAROL, ino)).gid == 1002
    inode = env.run(ns.setattr(CAROL, ino, gid=1000))  # a supplementary group
    assert inode.gid == 1000
    env.err(errno.EPERM, ns.setattr(CAROL, ino, gid=1001))  # not hers
    env.err(errno.EPERM, ns.setattr(ALICE, ino, gid=1000))  # not the owner, though a member
    inode = env.run(ns.setattr(CAROL, ino, gid=1002))
    assert inode.gid == 1002


def test_chown_clears_set_id_bits(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    ino = alice_file(env, b, 0o6755)
    inode = env.run(ns.setattr(ROOT, ino, uid=1001))
    assert stat.S_IMODE(inode.mode) == 0o755
    chmod(env, ROOT, ino, 0o6745)  # set-group-ID without group exec is mandatory locking
    inode = env.run(ns.setattr(ROOT, ino, gid=1001))
    assert stat.S_IMODE(inode.mode) == 0o2745
    d = mkdir(env, ALICE, b, b"d", 0o2775)
    inode = env.run(ns.setattr(ROOT, d, uid=1001))  # directories keep theirs
    assert stat.S_IMODE(inode.mode) == 0o2775


def test_chown_by_root_clears_set_id_bits_even_without_a_change(nsenv: NsEnv) -> None:
    """Linux clears set-user-ID (and set-group-ID with group exec) on every chown of a
    non-directory, by anyone, also when the owner stays the same."""
    env, ns = nsenv, nsenv.ns
    ino = alice_file(env, env.bucket(), 0o6755)
    inode = env.run(ns.setattr(ROOT, ino, uid=1000, gid=1000))
    assert stat.S_IMODE(inode.mode) == 0o755


def test_writes_and_truncates_by_users_clear_set_id_bits(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    ino = alice_file(env, b, 0o6777, b"data")
    fh = env.run(ns.open(BOB, ino, os.O_WRONLY))
    env.run(ns.write(fh, 0, b""))  # an empty write changes nothing
    assert stat.S_IMODE(env.run(ns.getattr(ROOT, ino)).mode) == 0o6777
    env.run(ns.write(fh, 0, b"x"))
    env.run(ns.release(fh))
    assert stat.S_IMODE(env.run(ns.getattr(ROOT, ino)).mode) == 0o777
    chmod(env, ALICE, ino, 0o6777)
    env.run(ns.setattr(BOB, ino, size=4))  # truncate(2), even to the same size
    assert stat.S_IMODE(env.run(ns.getattr(ROOT, ino)).mode) == 0o777
    chmod(env, ALICE, ino, 0o6777)
    fh = env.run(ns.open(ROOT, ino, os.O_WRONLY | os.O_TRUNC))  # root keeps them
    env.run(ns.write(fh, 0, b"root"))
    env.run(ns.release(fh))
    assert stat.S_IMODE(env.run(ns.getattr(ROOT, ino)).mode) == 0o6777


@pytest.mark.parametrize("data", [b"", b"data"], ids=["empty", "non-empty"])
def test_open_o_trunc_by_a_user_clears_set_id_bits(nsenv: NsEnv, data: bytes) -> None:
    """open(O_TRUNC) truncates through notify_change (ATTR_KILL_SUID), whatever the size."""
    env, ns = nsenv, nsenv.ns
    ino = alice_file(env, env.bucket(), 0o6777, data)
    env.run(ns.release(env.run(ns.open(BOB, ino, os.O_WRONLY | os.O_TRUNC))))
    assert stat.S_IMODE(env.run(ns.getattr(ROOT, ino)).mode) == 0o777


# -- new entries: owner, group, setgid inheritance ------------------------------------------
def test_new_entries_belong_to_the_caller(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    f = env.run(ns.getattr(CAROL, env.write_file(CAROL, b, b"f", b"")))
    d = env.run(ns.mkdir(CAROL, b, b"d", 0o755))
    ln = env.run(ns.symlink(CAROL, b, b"ln", b"f"))
    node = env.run(ns.mknod(CAROL, b, b"node", stat.S_IFREG | 0o640))
    for inode in (f, d, ln, node):
        assert (inode.uid, inode.gid) == (1002, 1002)  # primary gid, not a supplementary one
    assert stat.S_IMODE(d.mode) == 0o755 and stat.S_IMODE(node.mode) == 0o640


def test_setgid_directory_passes_on_group_and_bit(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    shared = mkdir(env, ALICE, env.bucket(), b"shared", 0o2777)
    assert env.run(ns.getattr(ALICE, shared)).gid == 1000
    f = env.run(ns.getattr(BOB, env.write_file(BOB, shared, b"f", b"", mode=0o644)))
    assert (f.uid, f.gid) == (1001, 1000)
    assert stat.S_IMODE(f.mode) == 0o644  # files don't get the bit
    sub = env.run(ns.mkdir(BOB, shared, b"sub", 0o755))
    assert (sub.uid, sub.gid) == (1001, 1000)
    assert stat.S_IMODE(sub.mode) == 0o2755  # subdirectories do
    subsub = env.run(ns.mkdir(BOB, sub.ino, b"deeper", 0o700))
    assert subsub.gid == 1000 and stat.S_IMODE(subsub.mode) == 0o2700
    ln = env.run(ns.symlink(BOB, shared, b"ln", b"f"))
    assert ln.gid == 1000
    # a set-group-ID file bob asks for in a group he is not in loses the bit
    inode, fh = env.run(
        ns.create(BOB, shared, b"g", stat.S_IFREG | 0o2755, os.O_WRONLY | os.O_CREAT)
    )
    env.run(ns.release(fh))
    assert inode.gid == 1000 and stat.S_IMODE(inode.mode) == 0o755
    # an S3 put into the directory inherits the group too
    obj = env.put(BOB, "bkt", "shared/obj", b"x")
    assert obj.gid == 1000


# -- times -----------------------------------------------------------------------------------
def test_utimens_rules(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    ino = alice_file(env, env.bucket(), 0o666)
    t = 1_600_000_000_000_000_000
    # explicit times: the owner (or root) only, even with write permission
    env.err(errno.EPERM, ns.setattr(BOB, ino, mtime_ns=t))
    env.err(errno.EPERM, ns.setattr(BOB, ino, atime_ns=t, mtime_ns=UTIME_NOW))
    # "now": the owner or anyone who may write
    env.run(ns.setattr(BOB, ino, atime_ns=UTIME_NOW, mtime_ns=UTIME_NOW))
    chmod(env, ALICE, ino, 0o644)
    env.err(errno.EACCES, ns.setattr(BOB, ino, atime_ns=UTIME_NOW, mtime_ns=UTIME_NOW))
    env.err(errno.EPERM, ns.setattr(BOB, ino, mtime_ns=t))
    inode = env.run(ns.setattr(ALICE, ino, atime_ns=t, mtime_ns=t + 1))
    assert (inode.atime_ns, inode.mtime_ns) == (t, t + 1)
    inode = env.run(ns.setattr(ROOT, ino, mtime_ns=t + 2))
    assert inode.mtime_ns == t + 2
    chmod(env, ALICE, ino, 0o000)
    env.run(ns.setattr(ALICE, ino, mtime_ns=UTIME_NOW))  # the owner needs no bits


# -- root -------------------------------------------------------------------------------------
def test_root_bypasses_read_and_write_but_exec_needs_an_x_bit(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    ino = alice_file(env, b, 0o000, b"locked")
    assert env.read_file(ROOT, ino) == b"locked"
    fh = env.run(ns.open(ROOT, ino, os.O_RDWR | os.O_TRUNC))
    env.run(ns.release(fh))
    env.run(ns.access(ROOT, ino, R | W))
    env.err(errno.EACCES, ns.access(ROOT, ino, X))
    for mode in (0o100, 0o010, 0o001):
        chmod(env, ALICE, ino, mode)
        env.run(ns.access(ROOT, ino, X))
    d = mkdir(env, ALICE, b, b"d", 0o000)
    env.run(ns.access(ROOT, d, R | W | X))  # directories: always searchable for root
    env.write_file(ROOT, d, b"inside", b"")
    assert env.names(ROOT, d) == [b"inside"]
    env.run(ns.lookup(ROOT, d, b"inside"))
    env.err(errno.EACCES, ns.lookup(ALICE, d, b"inside"))


# -- extended attributes -------------------------------------------------------------------
def test_user_xattrs_follow_read_and_write_bits(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    ino = alice_file(env, env.bucket(), 0o644)
    env.run(ns.setxattr(ALICE, ino, b"user.k", b"v"))
    assert env.run(ns.getxattr(BOB, ino, b"user.k")) == b"v"
    env.err(errno.EACCES, ns.setxattr(BOB, ino, b"user.k", b"w"))
    env.err(errno.EACCES, ns.removexattr(BOB, ino, b"user.k"))
    chmod(env, ALICE, ino, 0o600)
    env.err(errno.EACCES, ns.getxattr(BOB, ino, b"user.k"))
    chmod(env, ALICE, ino, 0o606)
    env.run(ns.setxattr(BOB, ino, b"user.k", b"bob"))
    assert env.run(ns.getxattr(ALICE, ino, b"user.k")) == b"bob"


def test_trusted_xattrs_are_for_root(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    ino = alice_file(env, env.bucket(), 0o666)
    env.err(errno.EPERM, ns.setxattr(ALICE, ino, b"trusted.k", b"v"))
    env.run(ns.setxattr(ROOT, ino, b"trusted.k", b"v"))
    env.run(ns.setxattr(ALICE, ino, b"user.k", b"v"))
    env.err(errno.ENODATA, ns.getxattr(ALICE, ino, b"trusted.k"))
    assert env.run(ns.listxattr(ALICE, ino)) == [b"user.k"]
    assert sorted(env.run(ns.listxattr(ROOT, ino))) == [b"trusted.k", b"user.k"]


# -- the namespace root and buckets ----------------------------------------------------------
def test_namespace_root_is_1777_owned_by_root(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    root = env.run(ns.getattr(ALICE, ROOT_INO))
    assert stat.S_ISDIR(root.mode) and stat.S_IMODE(root.mode) == 0o1777
    assert (root.uid, root.gid) == (0, 0)
    env.run(ns.create_bucket(ALICE, "alices"))
    env.run(ns.create_bucket(BOB, "bobs"))
    env.err(errno.EPERM, ns.delete_bucket(BOB, "alices"))  # sticky root
    env.err(errno.EPERM, ns.rmdir(BOB, ROOT_INO, b"alices"))
    env.run(ns.delete_bucket(BOB, "bobs"))
    env.run(ns.delete_bucket(ROOT, "alices"))


# -- the S3 calls obey the same bits -------------------------------------------------------------
def test_put_object_needs_write_on_the_directory(nsenv: NsEnv) -> None:
    env = nsenv
    b = env.bucket()
    d = mkdir(env, ALICE, b, b"d", 0o755)
    with pytest.raises(OSError) as ei:
        env.put(BOB, "bkt", "d/x", b"data")
    assert ei.value.errno == errno.EACCES
    with pytest.raises(OSError) as ei:
        env.put(BOB, "bkt", "d/new/x", b"data")  # creating the parent needs write too
    assert ei.value.errno == errno.EACCES
    assert env.names(ROOT, d) == []
    env.put(ALICE, "bkt", "d/x", b"data")
    chmod(env, ALICE, d, 0o700)
    with pytest.raises(OSError) as ei:  # search permission on the way
        env.put(BOB, "bkt", "d/x", b"other")
    assert ei.value.errno == errno.EACCES


def test_get_and_head_object_need_read(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    env.bucket()
    obj = env.put(ALICE, "bkt", "private", b"mine")
    assert (obj.uid, obj.gid) == (1000, 1000)
    chmod(env, ALICE, obj.ino, 0o600)
    env.err(errno.EACCES, ns.get_object(BOB, "bkt", "private"))
    env.err(errno.EACCES, ns.head_object(BOB, "bkt", "private"))
    assert env.get(ALICE, "bkt", "private") == b"mine"
    assert env.get(ROOT, "bkt", "private") == b"mine"
    chmod(env, ALICE, obj.ino, 0o640)
    assert env.get(DAVE, "bkt", "private") == b"mine"
    assert env.get(CAROL, "bkt", "private") == b"mine"
    env.err(errno.EACCES, ns.get_object(BOB, "bkt", "private"))


def test_put_over_an_object_needs_write_on_it(nsenv: NsEnv) -> None:
    env = nsenv
    env.bucket()
    env.put(ALICE, "bkt", "k", b"alice's")  # 0644 (the namespace umask 022)
    with pytest.raises(OSError) as ei:
        env.put(BOB, "bkt", "k", b"bob's")
    assert ei.value.errno == errno.EACCES
    assert env.get(ALICE, "bkt", "k") == b"alice's"


def test_delete_object_obeys_directory_write_and_sticky(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    d = mkdir(env, ALICE, b, b"d", 0o755)
    env.put(ALICE, "bkt", "d/x", b"1")
    env.err(errno.EACCES, ns.delete_object(BOB, "bkt", "d/x"))
    chmod(env, ALICE, d, 0o1777)
    env.err(errno.EPERM, ns.delete_object(BOB, "bkt", "d/x"))
    assert env.run(ns.delete_object(ALICE, "bkt", "d/x")) is True
    assert env.run(ns.delete_object(ALICE, "bkt", "d/x")) is False


def test_s3_and_posix_agree_for_every_user(nsenv: NsEnv) -> None:
    """One identity, one answer: get_object succeeds exactly when open(O_RDONLY) does."""
    env, ns = nsenv, nsenv.ns
    env.bucket()
    obj = env.put(ALICE, "bkt", "k", b"v")
    for mode in (0o600, 0o640, 0o604, 0o060, 0o000):
        chmod(env, ALICE, obj.ino, mode)
        for who in USERS.values():
            try:
                env.run(ns.release(env.run(ns.open(who, obj.ino, os.O_RDONLY))))
                posix = True
            except OSError as e:
                assert e.errno == errno.EACCES
                posix = False
            try:
                s3 = env.get(who, "bkt", "k") == b"v"
            except OSError as e:
                assert e.errno == errno.EACCES
                s3 = False
            assert posix == s3, f"mode {mode:o}, uid {who.uid}: posix {posix}, s3 {s3}"


def test_refused_put_leaves_nothing_behind(nsenv: NsEnv) -> None:
    """A PUT refused for permissions leaves neither an entry, an inode nor staged bytes."""
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    d = mkdir(env, ALICE, b, b"d", 0o755)
    before = env.run(ns.statfs())
    with pytest.raises(OSError) as ei:
        env.run(ns.put_object(BOB, "bkt", "d/x", chunks(b"z" * 300_000, 65536)))
    assert ei.value.errno == errno.EACCES
    after = env.run(ns.statfs())
    assert after.f_ffree == before.f_ffree
    assert env.names(ROOT, d) == []
    assert hot_bytes(env) < 300_000


def hot_bytes(env: NsEnv) -> int:
    """Disk space used under the hot directory (whatever its layout)."""
    return sum(p.stat().st_blocks * 512 for p in (env.base / "hot").rglob("*") if p.is_file())


def test_dropping_set_id_bits_is_a_chmod_unless_a_writer_does_it(nsenv: NsEnv) -> None:
    """A chmod by a non-owner is EPERM even when it only drops set-id bits and someone holds
    the file open for writing; the same mode change vouched for as the kernel's killpriv
    (the FUSE door: the caller writes the file), or with a truncate, is allowed."""
    env, ns = nsenv, nsenv.ns
    ino = alice_file(env, env.bucket(), 0o4777, b"data")
    fh = env.run(ns.open(ALICE, ino, os.O_RDWR))
    env.err(errno.EPERM, ns.setattr(BOB, ino, mode=0o777))
    env.err(errno.EPERM, ns.setattr(BOB, ino, mode=0o777, killpriv=lambda: False))
    # not only set-id bits: refused even when vouched for
    env.err(errno.EPERM, ns.setattr(BOB, ino, mode=0o4755, killpriv=lambda: True))
    env.run(ns.setattr(BOB, ino, mode=0o777, killpriv=lambda: True))
    assert stat.S_IMODE(env.run(ns.getattr(BOB, ino)).mode) == 0o777
    env.run(ns.setattr(ALICE, ino, mode=0o6777))
    env.run(ns.setattr(BOB, ino, mode=0o777, size=0))  # truncate(2) + the kernel's killpriv
    inode = env.run(ns.getattr(BOB, ino))
    assert (stat.S_IMODE(inode.mode), inode.size) == (0o777, 0)
    env.run(ns.release(fh))
