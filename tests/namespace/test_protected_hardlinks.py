"""``fs.protected_hardlinks`` is a namespace rule: a hard link is refused (EPERM) to anyone
but root and the owner unless the file is a regular one, neither setuid nor
setgid-executable, that the caller may both read and write -- through every door, not only
the FUSE mount (it used to be checked there alone).  Runs where the host sets the sysctl, as
the rule follows the host."""

from __future__ import annotations

import errno
import stat

import pytest

from tierd.acl.modes import protected_hardlinks

from .conftest import ALICE, BOB, ROOT, NsEnv

pytestmark = pytest.mark.skipif(not protected_hardlinks(),
                                reason="fs.protected_hardlinks is off on this host")


def test_link_to_anothers_file(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    cases = {b"private": 0o600, b"readonly": 0o644, b"open": 0o666, b"setuid": 0o4777,
             b"setgid-exec": 0o2777, b"setgid-noexec": 0o2767}
    inos = {}
    for name, mode in cases.items():
        inos[name] = env.write_file(ALICE, b, name, b"x", mode=0o600)
        inode = env.run(ns.setattr(ALICE, inos[name], mode=mode))
        assert stat.S_IMODE(inode.mode) == mode
    for name in (b"private", b"readonly", b"setuid", b"setgid-exec"):
        e = env.err(errno.EPERM, ns.link(BOB, inos[name], b, b"bob-" + name))
        assert "protected_hardlinks" in str(e)
    for name in (b"open", b"setgid-noexec"):
        assert env.run(ns.link(BOB, inos[name], b, b"bob-" + name)).nlink == 2
    # the owner and root link anything
    assert env.run(ns.link(ALICE, inos[b"private"], b, b"alice-private")).nlink == 2
    assert env.run(ns.link(ROOT, inos[b"setuid"], b, b"root-setuid")).nlink == 2


def test_protected_before_the_directory_check(nsenv: NsEnv) -> None:
    """As Linux's ``may_linkat`` comes before ``may_create``: EPERM, not EACCES, for a link
    into a directory the caller may not write."""
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    f = env.write_file(ALICE, b, b"f", b"x", mode=0o600)
    d = env.run(ns.mkdir(ALICE, b, b"closed", 0o755)).ino
    env.err(errno.EPERM, ns.link(BOB, f, d, b"g"))
    env.err(errno.EACCES, ns.link(BOB, env.write_file(BOB, b, b"mine", b"y"), d, b"g"))


def test_an_existing_name_answers_eexist_first(nsenv: NsEnv) -> None:
    """As Linux's ``filename_create`` comes before ``may_linkat``: a link onto a name that
    exists is EEXIST even when the rule would refuse the source (found by the
    differential test once it compared links of another's file)."""
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    f = env.write_file(ALICE, b, b"f", b"x", mode=0o600)
    env.write_file(BOB, b, b"taken", b"y")
    env.err(errno.EEXIST, ns.link(BOB, f, b, b"taken"))
    env.err(errno.EEXIST, ns.link(BOB, f, b, b"."))
