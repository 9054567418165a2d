"""Permissions through the mount as non-root users: read, write, exec/search, sticky
directories, ownership rules and supplementary groups.

Each operation runs in its own process with ``setpriv`` (numeric uids need no passwd
entry), so the kernel sends the user's uid, gid and pid, and the daemon reads the
supplementary groups from /proc -- exactly how a training container's user reaches tierd.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from public_dir import public_tempdir

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) missing"),
]

ALICE = (3000, 3000, [3000])
BOB = (3001, 3001, [3001])
CAROL = (3002, 3002, [3002, 3000])  # in alice's group as a supplementary group only

# A tiny interpreter for one operation; prints "ok [value]" or the errno name.
OP = r"""
import errno, os, sys
op, path, arg = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""
try:
    if op == "read":
        print("ok", open(path, "rb").read().decode())
        sys.exit()
    elif op == "write":
        with open(path, "ab") as f: f.write(arg.encode())
    elif op == "create":
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    elif op == "unlink": os.unlink(path)
    elif op == "rename": os.rename(path, arg)
    elif op == "mkdir": os.mkdir(path)
    elif op == "rmdir": os.rmdir(path)
    elif op == "list": print("ok", ",".join(sorted(os.listdir(path)))); sys.exit()
    elif op == "stat": os.stat(path)
    elif op == "exec":
        import subprocess
        r = subprocess.run([path], capture_output=True, text=True)
        print("ok", r.stdout.strip()); sys.exit()
    elif op == "chmod": os.chmod(path, int(arg, 8))
    elif op == "chown": os.chown(path, int(arg), -1)
    elif op == "chgrp": os.chown(path, -1, int(arg))
    elif op == "touch": os.utime(path, None)
    elif op == "utime": os.utime(path, (1, 2))
    elif op == "truncate": os.truncate(path, int(arg))
    elif op == "access": print("ok", os.access(path, int(arg))); sys.exit()
    elif op == "setxattr": os.setxattr(path, "user.k", arg.encode())
    else: raise SystemExit("unknown op " + op)
    print("ok")
except OSError as e:
    print(errno.errorcode[e.errno])
"""


def as_user(user: tuple[int, int, list[int]], op: str, path: Path | str, arg: str = "") -> str:
    uid, gid, groups = user
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}",
           f"--groups={','.join(map(str, groups))}", "--",
           sys.executable, "-c", OP, op, str(path), arg]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL, cwd="/")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture
def home(work: Path) -> Path:
    """A directory owned by alice (mode 0755) inside the test's work directory."""
    d = work / "alice"
    d.mkdir()
    os.chown(d, 3000, 3000)
    return d


def test_read_write_by_owner_group_other(home: Path) -> None:
    f = home / "f"
    f.write_text("secret")
    os.chown(f, 3000, 3000)
    f.chmod(0o640)
    assert as_user(ALICE, "read", f) == "ok secret"
    assert as_user(CAROL, "read", f) == "ok secret"  # supplementary group grants read
    assert as_user(BOB, "read", f) == "EACCES"
    assert as_user(CAROL, "write", f, "x") == "EACCES"  # group has no write bit
    assert as_user(ALICE, "write", f, "!") == "ok"
    f.chmod(0o604)
    assert as_user(CAROL, "read", f) == "EACCES"  # group bits apply, not other's
    assert as_user(BOB, "read", f) == "ok secret!"
    f.chmod(0o000)
    assert as_user(ALICE, "read", f) == "EACCES"
    assert as_user(ALICE, "access", f, str(os.R_OK)) == "ok False"
    assert f.read_text() == "secret!"  # root passes read/write checks


def test_write_and_create_need_directory_write(home: Path) -> None:
    assert as_user(ALICE, "create", home / "mine") == "ok"
    assert (home / "mine").stat().st_uid == 3000
    assert as_user(BOB, "create", home / "bobs") == "EACCES"
    assert as_user(BOB, "mkdir", home / "d") == "EACCES"
    assert as_user(BOB, "unlink", home / "mine") == "EACCES"
    assert as_user(BOB, "rename", home / "mine", str(home / "other")) == "EACCES"
    (home / "ro").write_text("r")
    os.chown(home / "ro", 3000, 3000)
    (home / "ro").chmod(0o444)
    assert as_user(ALICE, "write", home / "ro", "x") == "EACCES"
    assert as_user(ALICE, "truncate", home / "ro", "0") == "EACCES"
    assert as_user(ALICE, "unlink", home / "ro") == "ok"  # removal needs the directory only


def test_exec_and_search(home: Path) -> None:
    script = home / "hello.sh"
    script.write_text("#!/bin/sh\necho hi from tierd\n")
    os.chown(script, 3000, 3000)
    script.chmod(0o744)
    assert as_user(ALICE, "exec", script) == "ok hi from tierd"
    assert as_user(BOB, "exec", script).startswith("EACCES")
    script.chmod(0o755)
    assert as_user(BOB, "exec", script) == "ok hi from tierd"
    private = home / "private"
    private.mkdir()
    (private / "inner").write_text("x")
    os.chown(private, 3000, 3000)
    private.chmod(0o700)
    assert as_user(BOB, "stat", private / "inner") == "EACCES"  # no search permission
    assert as_user(BOB, "list", private) == "EACCES"
    private.chmod(0o711)  # search without read: names can be used, not listed
    assert as_user(BOB, "stat", private / "inner") == "ok"
    assert as_user(BOB, "list", private) == "EACCES"
    private.chmod(0o744)  # read without search: listing works, lookups inside do not
    assert as_user(BOB, "stat", private / "inner") == "EACCES"
    assert as_user(ALICE, "list", private) == "ok inner"


def test_sticky_directory(work: Path) -> None:
    tmp = work / "shared"
    tmp.mkdir()
    tmp.chmod(0o1777)
    assert as_user(ALICE, "create", tmp / "a") == "ok"
    assert as_user(BOB, "create", tmp / "b") == "ok"
    assert as_user(BOB, "unlink", tmp / "a") == "EPERM"
    assert as_user(BOB, "rename", tmp / "a", str(tmp / "stolen")) == "EPERM"
    assert as_user(BOB, "write", tmp / "a", "x") == "EACCES"  # 0644: not bob's to write
    assert as_user(ALICE, "unlink", tmp / "a") == "ok"
    assert as_user(BOB, "unlink", tmp / "b") == "ok"
    os.chown(tmp, 3000, 3000)  # the directory's owner may remove anyone's entries
    assert as_user(BOB, "create", tmp / "c") == "ok"
    assert as_user(ALICE, "unlink", tmp / "c") == "ok"


def test_ownership_rules(home: Path) -> None:
    f = home / "f"
    f.write_text("x")
    os.chown(f, 3000, 3000)
    f.chmod(0o666)
    assert as_user(BOB, "chmod", f, "777") == "EPERM"
    assert as_user(ALICE, "chmod", f, "600") == "ok"
    assert (f.stat().st_mode & 0o777) == 0o600
    assert as_user(ALICE, "chown", f, "3001") == "EPERM"  # only root gives files away
    assert as_user(ALICE, "chgrp", f, "3001") == "EPERM"  # not a group alice is in
    assert as_user(CAROL, "chgrp", f, "3000") == "EPERM"  # not the owner
    os.chown(f, 3002, 3002)
    assert as_user(CAROL, "chgrp", f, "3000") == "ok"  # owner, to a supplementary group
    assert f.stat().st_gid == 3000
    f.chmod(0o666)
    assert as_user(BOB, "touch", f) == "ok"  # times to now: write permission suffices
    assert as_user(BOB, "utime", f) == "EPERM"  # explicit times: the owner only
    assert as_user(CAROL, "utime", f) == "ok"
    assert f.stat().st_mtime_ns == 2_000_000_000
    assert as_user(BOB, "setxattr", f, "v") == "ok"  # user.* needs write permission
    f.chmod(0o644)
    assert as_user(BOB, "setxattr", f, "v") == "EACCES"


_THROUGH_FD = r"""
import os, stat, sys
path, uid = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDWR)  # opened by root: write access is checked here
os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
out = []
for step in ("write", "ftruncate"):
    try:
        os.write(fd, b"z") if step == "write" else os.ftruncate(fd, 0)
        out.append("ok")
    except OSError as e:
        out.append(os.strerror(e.errno))
print(",".join(out), oct(stat.S_IMODE(os.fstat(fd).st_mode)))
"""


def test_another_users_writes_through_a_root_descriptor_drop_setgid(work: Path,
                                                                    tmp_path: Path) -> None:
    """A descriptor opened for writing by root and used by another user (after a setuid):
    the write and the ftruncate succeed and drop the setgid bit (the kernel's killpriv,
    which FUSE sends as a chmod with the writer's credentials), as on a local file system."""
    answers = [_run_as_alice(_THROUGH_FD, d / "setgid-file", 0o2775).split()
               for d in (work, tmp_path)]
    assert answers[0] == answers[1], answers  # mount == kernel
    assert answers[0] == ["ok,ok", "0o775"]


_CHMOD_WHILE_WRITING = r"""
import os, sys
path, uid = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDWR)  # opened by root, held while the other user calls chmod
os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
try:
    os.chmod(path, 0o2666)  # drops only what a write drops (setuid): still the owner's call
    print("ok")
except OSError as e:
    print(os.strerror(e.errno))
"""


def test_a_non_owners_own_chmod_stays_refused_while_it_holds_the_file(work: Path) -> None:
    """The kernel's killpriv (a chmod with the writer's credentials) is allowed; a
    non-owner's own chmod is EPERM even when it only drops set-id bits and the caller holds
    the file open for writing, as on a local file system (the kernel checks it on the mount
    too: FUSE_POSIX_ACL)."""
    answers = []
    with public_tempdir("tierd-chmod-") as local:
        for d in (work, local):
            answers.append(_chmod_while_writing(d))
    assert answers[0] == answers[1] == ("Operation not permitted", "0o6666"), answers


def _chmod_while_writing(d: Path) -> tuple[str, str]:
    """(what the non-owner's chmod got, the mode after it) in directory ``d``."""
    f = d / "setid-file"
    answer = _run_as_alice(_CHMOD_WHILE_WRITING, f, 0o6666)
    return answer.strip(), oct(os.stat(f).st_mode & 0o7777)


def _run_as_alice(script: str, f: Path, mode: int) -> str:
    """Create ``f`` (as root, with ``mode``) and run ``script`` on it, which opens it as
    root and then becomes alice; its output."""
    f.write_bytes(b"hello")
    os.chmod(f, mode)
    r = subprocess.run([sys.executable, "-c", script, str(f), str(ALICE[0])],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout
