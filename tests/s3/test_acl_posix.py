"""One identity, one answer: files with POSIX ACLs (set with setfacl on the mount) read and
written through S3 with the access key of a user the ACL names give the same allow/deny as
the same uid through the mount.

One daemon serves both doors (``--mount``); users get access keys whose uid/gid/groups are
the ones ``setpriv`` uses for the FUSE side.  Needs root and /dev/fuse.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from public_dir import public_tempdir

from tierd.meta import AccessKey, MetaStore

from .conftest import Daemon, start_daemon

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="switching users and mounting need root"),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse"),
    pytest.mark.skipif(shutil.which("setfacl") is None or shutil.which("setpriv") is None,
                       reason="setfacl (acl) or setpriv (util-linux) missing"),
]

# name -> (uid, gid, supplementary groups)
USERS = {
    "alice": (3200, 3200, [3200]),
    "bob": (3201, 3201, [3201]),  # named in the ACLs
    "carol": (3202, 3202, [3205]),  # in group 3205, named in the ACLs
    "dave": (3203, 3200, [3200]),  # alice's group (the owning group)
    "eve": (3204, 3204, [3204]),  # other
}
BUCKET = "aclbucket"
PYTHON = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin") or sys.executable
OP = r"""
import errno, sys
op, path = sys.argv[1], sys.argv[2]
try:
    if op == "read": open(path, "rb").read()
    elif op == "write": open(path, "r+b").close()
    elif op == "create":
        open(path, "xb").close()
    print("ok")
except OSError as e:
    print(errno.errorcode[e.errno])
"""


def key_of(name: str) -> tuple[str, str]:
    return f"ACLTEST{name.upper()}", f"secret-of-{name}-0123456789abcdef"


@pytest.fixture(scope="module")
def both() -> Iterator[tuple[Daemon, Path]]:
    with public_tempdir("tierd-s3acl-") as base:
        data = base / "data"
        (data / "meta").mkdir(parents=True)
        store = MetaStore.open_lmdb(data / "meta")
        try:
            with store.write() as tx:
                for name, (uid, gid, groups) in USERS.items():
                    key, secret = key_of(name)
                    tx.put_access_key(AccessKey(key, secret, uid, gid, groups, name))
        finally:
            store.close()
        mnt = base / "mnt"
        d = start_daemon(data, "--mount", str(mnt))
        try:
            d.client().create_bucket(Bucket=BUCKET)
            os.chmod(mnt / BUCKET, 0o777)
            yield d, mnt
        finally:
            d.stop()
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fuse_op(name: str, op: str, path: Path) -> bool:
    uid, gid, groups = USERS[name]
    r = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}",
         f"--groups={','.join(map(str, [gid, *groups]))}", "--", PYTHON, "-c", OP, op,
         str(path)], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        cwd="/")
    assert r.returncode == 0, r.stderr
    out = r.stdout.strip()
    assert out in ("ok", "EACCES", "EPERM"), out
    return out == "ok"


def s3_op(d: Daemon, name: str, op: str, key: str) -> bool:
    client: Any = d.client(*key_of(name))
    try:
        if op == "read":
            client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        else:  # write (an overwrite) or create: a PUT
            client.put_object(Bucket=BUCKET, Key=key, Body=b"from " + name.encode())
    except ClientError as e:
        assert e.response["Error"]["Code"] == "AccessDenied", e.response
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        return False
    return True


def make_file(mnt: Path, rel: str, mode: int, *setfacl: str) -> Path:
    path = mnt / BUCKET / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"content")
    os.chown(path, *USERS["alice"][:2])
    os.chmod(path, mode)
    for args in setfacl:
        subprocess.run(["setfacl", *args.split(), str(path)], check=True)
    return path


FILES = {
    # rel path: (mode before the ACL, setfacl argument lists)
    "named": (0o640, ["-m u:3201:rw,g:3205:r,u:3204:-"]),
    "masked": (0o640, ["-m u:3201:rw,g:3205:rw", "-m m::r"]),
    "nomask": (0o640, ["-m u:3201:rw,g:3205:r"]),  # then chmod 604: the ACL is ignored
    "groupdeny": (0o644, ["-m g:3205:-,g::r"]),
}


def test_same_answer_through_both_doors(both: tuple[Daemon, Path]) -> None:
    d, mnt = both
    tag = uuid.uuid4().hex[:8]
    paths = {}
    for rel, (mode, acls) in FILES.items():
        paths[rel] = make_file(mnt, f"{tag}/{rel}", mode, *acls)
    os.chmod(paths["nomask"], 0o604)
    answers: dict[tuple[str, str, str], bool] = {}
    for rel, path in paths.items():
        for name in USERS:
            for op in ("read", "write"):
                via_fuse = fuse_op(name, op, path)
                via_s3 = s3_op(d, name, op, f"{tag}/{rel}")
                assert via_fuse == via_s3, (rel, name, op, via_fuse, via_s3)
                answers[(rel, name, op)] = via_s3
    # the answers are the ACL's, not the mode's (so this test can fail)
    assert answers[("named", "bob", "write")] and answers[("named", "carol", "read")]
    assert not answers[("named", "eve", "read")] and not answers[("named", "carol", "write")]
    assert answers[("masked", "bob", "read")] and not answers[("masked", "bob", "write")]
    assert not answers[("masked", "carol", "write")]
    assert answers[("nomask", "bob", "read")] and not answers[("nomask", "bob", "write")]
    assert not answers[("nomask", "dave", "read")]  # owning group: --- in the mode
    assert not answers[("groupdeny", "carol", "read")]  # a matching group that grants nothing
    assert answers[("groupdeny", "eve", "read")] and answers[("groupdeny", "dave", "read")]


def test_directory_acl_and_inheritance_through_s3(both: tuple[Daemon, Path]) -> None:
    d, mnt = both
    tag = uuid.uuid4().hex[:8]
    box = mnt / BUCKET / tag
    box.mkdir()
    os.chown(box, *USERS["alice"][:2])
    os.chmod(box, 0o750)
    subprocess.run(["setfacl", "-m", "u:3201:rwx,g:3205:x", str(box)], check=True)
    subprocess.run(["setfacl", "-d", "-m", "u:3201:rwx,g:3205:r", str(box)], check=True)
    for name in USERS:
        via_fuse = fuse_op(name, "create", box / f"f-{name}")
        via_s3 = s3_op(d, name, "create", f"{tag}/s3-{name}")
        assert via_fuse == via_s3, (name, via_fuse, via_s3)
    assert s3_op(d, "bob", "create", f"{tag}/deep/er/obj")  # implicit dirs inherit too
    acl = subprocess.run(["getfacl", "-p", str(box / "deep/er/obj")], capture_output=True,
                         text=True, check=True).stdout
    assert "user:3201:rwx" in acl and "group:3205:r--" in acl, acl
    deep = subprocess.run(["getfacl", "-p", str(box / "deep")], capture_output=True,
                          text=True, check=True).stdout
    assert "default:user:3201:rwx" in deep, deep
    # carol (group 3205: r through the inherited ACL) reads bob's object, eve may not
    assert s3_op(d, "carol", "read", f"{tag}/deep/er/obj") is False  # dirs: r-- gives no x
    assert fuse_op("carol", "read", box / "deep/er/obj") is False
    subprocess.run(["setfacl", "-m", "g:3205:rx", str(box / "deep"), str(box / "deep/er")],
                   check=True)
    assert s3_op(d, "carol", "read", f"{tag}/deep/er/obj")
    assert fuse_op("carol", "read", box / "deep/er/obj")
    assert not s3_op(d, "eve", "read", f"{tag}/deep/er/obj")


# -- the matrix: users x modes and ACLs x operations x doors, with the kernel as referee ----
# Each config is applied to a directory (first) and to the file "f" in it (second), and to
# the FIFO "p" and the unix socket "s" beside it: (mode, setfacl -m argument or "").
# Operations: read/write "f", create a new file in the directory, delete this user's own
# victim file (owned by alice), list the directory with its entries' attributes (what an S3
# listing needs), chmod "f" to the mode it has (FUSE and kernel only: S3 has no chmod; an
# unchanged mode keeps the other users' answers), open the FIFO for reading and for writing
# and connect to the socket (FUSE and kernel only: S3 does not reach them).  "s3made" is
# made through S3 by alice without a canned ACL (its directory by her PUT): the kernel's
# copy has the modes the private default gives (tierd.acl.canned.S3_UMASK, new_prefix).
CONFIGS = {
    "open": ((0o777, ""), (0o666, "")),
    "named": ((0o750, "u:3201:rwx,g:3205:rx"), (0o640, "u:3201:rw,g:3205:r,u:3204:-")),
    "masked": ((0o770, "u:3201:rwx,g:3205:rwx,m::rx"), (0o660, "u:3201:rw,m::r")),
    "groups": ((0o775, "g:3205:-,g::rwx"), (0o664, "g:3205:-")),
    "sticky": ((0o1777, "u:3201:rwx"), (0o644, "u:3204:rw")),
    "private": ((0o755, ""), (0o600, "")),
    "s3made": ((0o755, ""), (0o600, "")),  # what S3 gives: the parent's 0755, objects 0600
}
OPS = ("read", "write", "create", "delete", "list", "chmod", "fifo-read", "fifo-write",
       "connect")
#: what the S3 side cannot do
NOT_S3 = {"chmod", "fifo-read", "fifo-write", "connect"}

MATRIX_OP = r"""
import errno, json, os, socket, sys
base, user = sys.argv[1], sys.argv[2]
out = {}
# past the permission check: no reader on the FIFO, nobody listening on the socket
PASSED = {errno.ENXIO, errno.ECONNREFUSED}
def fifo(path, flags):
    os.close(os.open(path, flags | os.O_NONBLOCK))
def connect(path):
    with socket.socket(socket.AF_UNIX) as c:
        c.connect(path)
for cfg in sys.argv[3:]:
    d = os.path.join(base, cfg)
    def attempt(name, fn):
        try:
            fn()
            out[cfg + "/" + name] = "ok"
        except OSError as e:
            out[cfg + "/" + name] = "ok" if e.errno in PASSED else errno.errorcode[e.errno]
    attempt("read", lambda: open(os.path.join(d, "f"), "rb").read())
    attempt("write", lambda: open(os.path.join(d, "f"), "r+b").close())
    attempt("create", lambda: open(os.path.join(d, "new-" + user), "xb").close())
    attempt("delete", lambda: os.unlink(os.path.join(d, "victim-" + user)))
    attempt("list", lambda: [os.stat(os.path.join(d, n)) for n in os.listdir(d)])
    f = os.path.join(d, "f")  # to the mode it has: only the permission matters
    attempt("chmod", lambda: os.chmod(f, os.stat(f).st_mode & 0o7777))
    attempt("fifo-read", lambda: fifo(os.path.join(d, "p"), os.O_RDONLY))
    attempt("fifo-write", lambda: fifo(os.path.join(d, "p"), os.O_WRONLY))
    attempt("connect", lambda: connect(os.path.join(d, "s")))
print(json.dumps(out))
"""


def _special_nodes(d: Path, fmode: int, facl: str) -> None:
    """The FIFO "p" and the socket "s" (nobody listens on it) with the file's mode and ACL."""
    os.mkfifo(d / "p")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(d / "s"))
    for name in ("p", "s"):
        os.chown(d / name, *USERS["alice"][:2])
        os.chmod(d / name, fmode)
        if facl:
            subprocess.run(["setfacl", "-m", facl, str(d / name)], check=True)


def build(base: Path, s3: tuple[Daemon, str] | None = None) -> None:
    """The configs under ``base`` (owned by alice), made with setfacl as root; with ``s3``
    (the daemon and the key prefix of ``base`` in the bucket) "s3made" is made by alice's
    PUTs, without a canned ACL."""
    for cfg, ((dmode, dacl), (fmode, facl)) in CONFIGS.items():
        d = base / cfg
        names = ["f", *(f"victim-{u}" for u in USERS)]
        if cfg == "s3made" and s3 is not None:
            client: Any = s3[0].client(*key_of("alice"))
            for name in names:
                client.put_object(Bucket=BUCKET, Key=f"{s3[1]}/{cfg}/{name}", Body=b"content")
            _special_nodes(d, fmode, facl)
            continue
        d.mkdir()
        for name in names:
            (d / name).write_bytes(b"content")
            os.chown(d / name, *USERS["alice"][:2])
            os.chmod(d / name, fmode)
        if facl:
            subprocess.run(["setfacl", "-m", facl, str(d / "f")], check=True)
        _special_nodes(d, fmode, facl)
        os.chown(d, *USERS["alice"][:2])
        os.chmod(d, dmode)
        if dacl:
            subprocess.run(["setfacl", "-m", dacl, str(d)], check=True)


def posix_matrix(base: Path) -> dict[tuple[str, str, str], bool]:
    """Every user's operations on ``base`` (one process per user)."""
    out = {}
    for name, (uid, gid, groups) in USERS.items():
        r = subprocess.run(
            ["setpriv", f"--reuid={uid}", f"--regid={gid}",
             f"--groups={','.join(map(str, [gid, *groups]))}", "--", PYTHON, "-c", MATRIX_OP,
             str(base), name, *CONFIGS], capture_output=True, text=True, timeout=60,
            stdin=subprocess.DEVNULL, cwd="/")
        assert r.returncode == 0, r.stderr
        for k, v in json.loads(r.stdout).items():
            cfg, op = k.split("/")
            assert v in ("ok", "EACCES", "EPERM"), (k, v)
            out[(cfg, name, op)] = v == "ok"
    return out


def s3_matrix(d: Daemon, prefix: str) -> dict[tuple[str, str, str], bool]:
    out = {}
    for name in USERS:
        client: Any = d.client(*key_of(name))
        for cfg in CONFIGS:
            k = f"{prefix}/{cfg}"
            calls = {
                "read": lambda c=client, k=k: c.get_object(Bucket=BUCKET, Key=f"{k}/f"),
                "write": lambda c=client, k=k: c.put_object(Bucket=BUCKET, Key=f"{k}/f",
                                                            Body=b"content"),
                "create": lambda c=client, k=k, n=name: c.put_object(
                    Bucket=BUCKET, Key=f"{k}/new-{n}", Body=b"x"),
                "delete": lambda c=client, k=k, n=name: c.delete_object(
                    Bucket=BUCKET, Key=f"{k}/victim-{n}"),
            }
            for op, call in calls.items():  # (NOT_S3: only through the mount)
                try:
                    call()
                    out[(cfg, name, op)] = True
                except ClientError as e:
                    assert e.response["Error"]["Code"] == "AccessDenied", e.response
                    out[(cfg, name, op)] = False
            listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{k}/")
            out[(cfg, name, "list")] = f"{k}/f" in {o["Key"] for o in listed.get("Contents",
                                                                                   [])}
    return out


def test_matrix_fuse_s3_and_kernel(both: tuple[Daemon, Path]) -> None:
    d, mnt = both
    tag = uuid.uuid4().hex[:8]
    with public_tempdir("tierd-acl-matrix-") as local:
        for base in (mnt / BUCKET / f"{tag}-fuse", mnt / BUCKET / f"{tag}-s3", local / "m"):
            base.mkdir()
            os.chown(base, *USERS["alice"][:2])  # alice's: her PUTs make "s3made" in it
            os.chmod(base, 0o755)
            build(base, (d, base.name) if base.parent == mnt / BUCKET else None)
        s3made = mnt / BUCKET / f"{tag}-fuse" / "s3made"
        st = os.stat(s3made / "f")  # the private default, as the kernel's copy has it
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, USERS["alice"][0])
        st = os.stat(s3made)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o755, USERS["alice"][0])
        kernel = posix_matrix(local / "m")
        fuse = posix_matrix(mnt / BUCKET / f"{tag}-fuse")
        s3 = s3_matrix(d, f"{tag}-s3")
    diff = {k: (fuse[k], kernel[k]) for k in kernel if fuse[k] != kernel[k]}
    assert not diff, f"mount vs kernel (cfg, user, op): {diff}"
    diff = {k: (s3[k], kernel[k]) for k in s3 if s3[k] != kernel[k]}
    assert not diff, f"S3 vs kernel (cfg, user, op): {diff}"
    # the matrix is not trivial: every operation is allowed to someone and refused to someone
    for op in OPS:
        answers = {v for (_, _, o), v in kernel.items() if o == op}
        assert answers == {True, False}, op
