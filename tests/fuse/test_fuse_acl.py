"""POSIX ACLs on the mount with the real tools (setfacl/getfacl), checked against the kernel.

Every scenario is played twice: inside the mount and in a plain directory of the local file
system (ext4/tmpfs, where the kernel itself implements ACLs).  The same setfacl/chmod/create
commands run in both; then getfacl's output, the modes, and what each user may do (a
process per operation, switched with ``setpriv``) must be the same.  The kernel checks the
mount's accesses too (FUSE_POSIX_ACL), from the modes and ACLs the daemon reports, so
agreement here means the daemon stores and reports ACLs as ext4 does and refuses nothing the
kernel allows; that it decides alone as the kernel would is checked through S3
(``tests/s3/test_acl_posix.py``).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import need, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from public_dir import public_tempdir

from tierd.acl import posix_acl as pa

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) missing"),
]

ALICE = (3100, 3100, [3100])
BOB = (3101, 3101, [3101])
CAROL = (3102, 3102, [3102, 3105])  # in group 3105 (named in ACLs) as a supplementary group
DAVE = (3103, 3100, [3100])  # alice's primary group
EVE = (3104, 3104, [3104])  # nobody in particular: the "other" class
USERS = {"alice": ALICE, "bob": BOB, "carol": CAROL, "dave": DAVE, "eve": EVE}
_serial = itertools.count()

OP = r"""
import errno, os, sys
op, path = sys.argv[1], sys.argv[2]
try:
    if op == "read": open(path, "rb").read()
    elif op == "write": open(path, "ab").close()
    elif op == "list": os.listdir(path)
    elif op == "create":
        p = os.path.join(path, "new-%d" % os.getuid())
        os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)); os.unlink(p)
    elif op == "access":
        print("".join("1" if os.access(path, m) else "0" for m in range(1, 8))); sys.exit()
    else: raise SystemExit("unknown op " + op)
    print("ok")
except OSError as e:
    print(errno.errorcode[e.errno])
"""


def as_user(user: tuple[int, int, list[int]], *cmd: str, umask: str = "022") -> str:
    uid, gid, groups = user
    r = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", f"--groups={','.join(map(str, groups))}",
         "--", "sh", "-c", f'umask {umask} && exec "$@"', "sh", *cmd],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, cwd="/")
    assert r.returncode == 0, f"{cmd}: {r.stderr}"
    return r.stdout.strip()


# the operations run as other users: a system python they can execute (the venv's may live
# under a home directory only its owner can enter); OP needs only the standard library
PYTHON = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin") or sys.executable


def op(user: tuple[int, int, list[int]], what: str, path: Path) -> str:
    return as_user(user, PYTHON, "-c", OP, what, str(path))


@pytest.fixture(scope="module")
def local_root() -> Iterator[Path]:
    with public_tempdir("tierd-acl-local-") as d:
        probe = d / "probe"
        probe.touch()
        if run([need("setfacl"), "-m", "u:3101:r", str(probe)], check=False).returncode:
            pytest.skip("the local file system does not keep POSIX ACLs")
        yield d


@pytest.fixture
def pair(work: Path, local_root: Path, request: pytest.FixtureRequest) -> list[Path]:
    """The same empty directory in the mount and on the local disk, owned by alice (0755),
    inside a directory everyone may search."""
    local = local_root / request.node.name
    local.mkdir()
    local.chmod(0o777)
    out = []
    for base in (work, local):
        d = base / "alice"
        d.mkdir()
        os.chown(d, ALICE[0], ALICE[1])
        d.chmod(0o755)
        out.append(d)
    return out


def getfacl(path: Path, *opts: str) -> str:
    """getfacl's text without the ``# file:`` line (the paths differ)."""
    r = run([need("getfacl"), "-p", *opts, str(path)])
    return "\n".join(line for line in r.stdout.splitlines() if not line.startswith("# file"))


def both(dirs: list[Path], fn: object) -> list[object]:
    assert callable(fn)
    return [fn(d) for d in dirs]


def same(dirs: list[Path], fn: object) -> object:
    """``fn(dir)`` in the mount and on the local disk must agree; returns the answer."""
    mnt, local = both(dirs, fn)
    assert mnt == local, f"mount: {mnt!r}\nkernel: {local!r}"
    return mnt


def access_matrix(path: Path) -> dict[str, str]:
    return {name: op(user, "access", path) for name, user in USERS.items()}


# -- round trips and the mask ---------------------------------------------------------------
def test_setfacl_getfacl_round_trip(pair: list[Path]) -> None:
    setfacl = need("setfacl")
    for d in pair:
        as_user(ALICE, "sh", "-c", f"echo data > {d}/f")
        as_user(ALICE, setfacl, "-m", "u:3101:rw,g:3105:r,u:3104:-", str(d / "f"))
    text = same(pair, lambda d: getfacl(d / "f"))
    assert "user:3101:rw-" in str(text) and "mask::rw-" in str(text)
    same(pair, lambda d: oct(os.stat(d / "f").st_mode))
    same(pair, lambda d: sorted(os.listxattr(d / "f")))
    same(pair, lambda d: access_matrix(d / "f"))
    # remove one entry, then everything extended
    for d in pair:
        as_user(ALICE, setfacl, "-x", "u:3101", str(d / "f"))
    same(pair, lambda d: getfacl(d / "f"))
    same(pair, lambda d: access_matrix(d / "f"))
    for d in pair:
        as_user(ALICE, setfacl, "-b", str(d / "f"))
    assert "mask" not in str(same(pair, lambda d: getfacl(d / "f")))
    same(pair, lambda d: sorted(os.listxattr(d / "f")))
    # only the owner (or root) may set an ACL
    out = same(pair, lambda d: subprocess.run(
        ["setpriv", "--reuid=3101", "--regid=3101", "--groups=3101", "--", setfacl, "-m",
         "u:3101:rwx", str(d / "f")], capture_output=True, text=True).returncode)
    assert out != 0


def test_mask_and_chmod(pair: list[Path]) -> None:
    setfacl = need("setfacl")
    for d in pair:
        as_user(ALICE, "sh", "-c", f"echo data > {d}/f")
        as_user(ALICE, setfacl, "-m", "u:3101:rw,g:3105:rw", str(d / "f"))
    assert same(pair, lambda d: op(BOB, "write", d / "f")) == "ok"
    for d in pair:
        as_user(ALICE, setfacl, "-m", "m::r", str(d / "f"))
    assert "#effective:r--" in str(same(pair, lambda d: getfacl(d / "f")))
    assert same(pair, lambda d: op(BOB, "write", d / "f")) == "EACCES"
    assert same(pair, lambda d: op(CAROL, "read", d / "f")) == "ok"
    same(pair, lambda d: oct(os.stat(d / "f").st_mode))
    for d in pair:  # chmod sets the mask from the group bits
        as_user(ALICE, "chmod", "660", str(d / "f"))
    assert "mask::rw-" in str(same(pair, lambda d: getfacl(d / "f")))
    assert same(pair, lambda d: op(BOB, "write", d / "f")) == "ok"
    same(pair, lambda d: access_matrix(d / "f"))
    for d in pair:  # mask --- : the ACL is not consulted; named users fall to "other"
        as_user(ALICE, "chmod", "604", str(d / "f"))
    same(pair, lambda d: getfacl(d / "f"))
    same(pair, lambda d: access_matrix(d / "f"))


def test_directory_acls_decide_search_list_create(pair: list[Path]) -> None:
    setfacl = need("setfacl")
    for d in pair:
        as_user(ALICE, "mkdir", "-m", "700", str(d / "box"))
        as_user(ALICE, "sh", "-c", f"echo x > {d}/box/f")
        as_user(ALICE, setfacl, "-m", "u:3101:rwx,g:3105:r-x", str(d / "box"))
    for who in (BOB, CAROL, DAVE, EVE):
        same(pair, lambda d, who=who: (op(who, "list", d / "box"), op(who, "read", d / "box/f"),
                                       op(who, "create", d / "box")))
    for d in pair:
        as_user(ALICE, "chmod", "g-w", str(d / "box"))  # mask r-x: bob may no longer create
    assert same(pair, lambda d: op(BOB, "create", d / "box")) == "EACCES"


# -- inheritance -----------------------------------------------------------------------------
def test_default_acl_inheritance_with_real_programs(pair: list[Path]) -> None:
    setfacl = need("setfacl")
    for d in pair:
        shared = d / "shared"
        as_user(ALICE, "mkdir", str(shared))
        as_user(ALICE, setfacl, "-m", "u:3101:rwx", str(shared))
        as_user(ALICE, setfacl, "-d", "-m", "u:3101:rwx,g:3105:rx,o::-", str(shared))
        # files and directories made by alice and bob with ordinary programs and umasks
        as_user(ALICE, "touch", str(shared / "touched"))
        as_user(ALICE, "sh", "-c", f"echo hi > {shared}/redirected", umask="077")
        as_user(BOB, "mkdir", "-p", str(shared / "a/b/c"))
        as_user(BOB, "mkdir", "-m", "700", str(shared / "private"))
        as_user(ALICE, "cp", "/etc/hostname", str(shared / "copied"))
        as_user(BOB, "install", "-m", "640", "/etc/hostname", str(shared / "a/installed"))
    # (one path at a time: getfacl -R follows readdir order, which differs from ext4's)
    assert "default:user:3101:rwx" in str(same(pair, lambda d: getfacl(d / "shared")))
    for name in ("touched", "redirected", "a", "a/b", "a/b/c", "private", "copied",
                 "a/installed"):
        same(pair, lambda d, n=name: getfacl(d / "shared" / n))
        same(pair, lambda d, n=name: oct(os.stat(d / "shared" / n).st_mode))
        same(pair, lambda d, n=name: access_matrix(d / "shared" / n))


# -- random ACLs: the mount's access(2) answers against the kernel's ----------------------------
IDS = [3100, 3101, 3102, 3105]
PERM = st.integers(0, 7)


@st.composite
def acl_blobs(draw: st.DrawFn) -> bytes:
    users = sorted(draw(st.sets(st.sampled_from(IDS), max_size=2)))
    groups = sorted(draw(st.sets(st.sampled_from(IDS), max_size=2)))
    out = [pa.AclEntry(pa.USER_OBJ, draw(PERM))]
    out += [pa.AclEntry(pa.USER, draw(PERM), u) for u in users]
    out.append(pa.AclEntry(pa.GROUP_OBJ, draw(PERM)))
    out += [pa.AclEntry(pa.GROUP, draw(PERM), g) for g in groups]
    if users or groups or draw(st.booleans()):
        out.append(pa.AclEntry(pa.MASK, draw(PERM)))
    out.append(pa.AclEntry(pa.OTHER, draw(PERM)))
    return pa.serialize(out)


def access_bits(path: Path, uid: int, gid: int, groups: list[int]) -> int:
    """access(path, m) for m in 1..7 as a forked child with that identity (a bit each)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(r)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            os.write(w, bytes([sum(1 << m for m in range(1, 8) if os.access(path, m))]))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    try:
        data = os.read(r, 1)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert data, "the access child failed"
    return data[0]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(blob=acl_blobs(), chmod=st.none() | st.integers(0, 0o777))
def test_random_acls_answer_as_the_kernel(pair: list[Path], blob: bytes,
                                          chmod: int | None) -> None:
    paths = []
    for d in pair:
        p = d / f"r{next(_serial)}"
        p.write_bytes(b"x")
        os.chown(p, ALICE[0], ALICE[1])
        os.setxattr(p, pa.ACCESS_XATTR, blob)
        if chmod is not None:
            os.chmod(p, chmod)
        paths.append(p)
    same(paths, lambda p: os.stat(p).st_mode)
    same(paths, lambda p: getfacl(p))
    for uid, gid, groups in USERS.values():
        same(paths, lambda p, u=uid, g=gid, gs=groups: access_bits(p, u, g, gs))
