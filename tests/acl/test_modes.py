"""The ownership rules of :mod:`tierd.acl.modes` on their own (the namespace suites check
them through setattr, create and setfacl; the FUSE suites against the kernel): what Linux's
``inode_init_owner``, ``chown_common``, ``setattr_should_drop_sgid`` and
``should_remove_suid`` decide, case by case."""

from __future__ import annotations

import errno
import stat

import pytest

from tierd.acl import Identity
from tierd.acl.modes import (
    check_set_times,
    chmod,
    chown,
    created_mode_gid,
    drop_privs,
    has_privs,
    keep_setgid,
    may_hardlink,
    write_drops_privs,
)
from tierd.errors import FsError
from tierd.meta import Inode

ROOT = Identity(0, 0)
ALICE = Identity(1000, 1000, frozenset({1000, 50}))
BOB = Identity(1001, 1001)


def file(mode: int = 0o644, uid: int = 1000, gid: int = 1000) -> Inode:
    return Inode(ino=7, mode=stat.S_IFREG | mode, uid=uid, gid=gid)


def directory(mode: int = 0o755, uid: int = 1000, gid: int = 1000) -> Inode:
    return Inode(ino=8, mode=stat.S_IFDIR | mode, uid=uid, gid=gid)


def test_set_id_bits_a_write_clears() -> None:
    assert has_privs(0o4755) and has_privs(0o2755) and not has_privs(0o2745)
    assert drop_privs(0o6755) == 0o755
    assert drop_privs(0o2745) == 0o2745  # setgid without group exec: mandatory locking
    assert write_drops_privs(ALICE, 0o4755) and not write_drops_privs(ROOT, 0o4755)
    assert not write_drops_privs(ALICE, 0o755)


def test_created_in_a_setgid_directory() -> None:
    shared = directory(0o2775, uid=0, gid=50)
    assert created_mode_gid(BOB, shared, stat.S_IFDIR | 0o755) == (stat.S_IFDIR | 0o2755, 50)
    assert created_mode_gid(BOB, shared, stat.S_IFREG | 0o644) == (stat.S_IFREG | 0o644, 50)
    # a requested setgid on a file: kept for a member of its group, dropped for others
    assert created_mode_gid(ALICE, shared, stat.S_IFREG | 0o2755)[0] == stat.S_IFREG | 0o2755
    assert created_mode_gid(BOB, shared, stat.S_IFREG | 0o2755)[0] == stat.S_IFREG | 0o755
    assert created_mode_gid(ROOT, shared, stat.S_IFREG | 0o2755)[0] == stat.S_IFREG | 0o2755
    plain = directory(0o777, uid=0, gid=0)
    assert created_mode_gid(BOB, plain, stat.S_IFREG | 0o644) == (stat.S_IFREG | 0o644, 1001)


def test_chown_rules() -> None:
    f = file(0o6755)
    assert chown(ROOT, f, 5, -1) == (5, 1000, stat.S_IFREG | 0o755)  # set-id bits dropped
    assert chown(ALICE, f, None, 50) == (1000, 50, stat.S_IFREG | 0o755)
    assert chown(ALICE, f, -1, -1) == (1000, 1000, stat.S_IFREG | 0o6755)  # names no id
    assert chown(ROOT, directory(0o2755), 5, None)[2] == stat.S_IFDIR | 0o2755
    for who, uid, gid in ((ALICE, 5, None), (ALICE, None, 77), (BOB, None, 1001)):
        with pytest.raises(FsError) as e:
            chown(who, f, uid, gid)
        assert e.value.errno == errno.EPERM


def test_chmod_rules() -> None:
    f = file(0o6755, gid=77)
    assert chmod(ALICE, f, 0o2700) == 0o700  # the owner, not in group 77: setgid goes
    assert chmod(ROOT, f, 0o2700) == 0o2700
    with pytest.raises(FsError) as e:
        chmod(BOB, f, 0o777)
    assert e.value.errno == errno.EPERM
    # dropping nothing but set-id bits: a writer's right, not anyone's
    with pytest.raises(FsError):
        chmod(BOB, f, 0o755)
    assert chmod(BOB, f, 0o755, writer=True) == 0o755
    assert chmod(BOB, f, 0o755, killpriv=lambda: True) == 0o755
    with pytest.raises(FsError):
        chmod(BOB, f, 0o755, killpriv=lambda: False)
    with pytest.raises(FsError):  # judged against what a truncate left: no longer a drop
        chmod(BOB, f, 0o755, current=0o755, writer=True)
    assert keep_setgid(ALICE, file(gid=50), 0o2755) == 0o2755
    assert keep_setgid(BOB, file(gid=50), 0o2755) == 0o755


def test_hardlink_rule() -> None:
    """fs.protected_hardlinks, whatever the host's setting (the namespace asks it)."""
    assert may_hardlink(ALICE, file(0o600)) and may_hardlink(ROOT, file(0o4700))
    assert may_hardlink(BOB, file(0o666)) and may_hardlink(BOB, file(0o2666))
    assert not may_hardlink(BOB, file(0o644))  # readable only
    assert not may_hardlink(BOB, file(0o4777)) and not may_hardlink(BOB, file(0o2777))
    assert not may_hardlink(BOB, Inode(ino=9, mode=stat.S_IFIFO | 0o666, uid=1000, gid=1000))


def test_set_times_rules() -> None:
    f = file(0o666)
    check_set_times(ALICE, f, explicit=True)
    check_set_times(BOB, f, explicit=False)  # "now" with write access
    with pytest.raises(FsError) as e:
        check_set_times(BOB, f, explicit=True)
    assert e.value.errno == errno.EPERM
    with pytest.raises(FsError) as e:
        check_set_times(BOB, file(0o644), explicit=False)
    assert e.value.errno == errno.EACCES
