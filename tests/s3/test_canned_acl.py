"""Canned ACLs end to end: boto3 sets them, the mount shows the mode bits and POSIX ACL
entries they became (os.stat, the system.posix_acl_access xattr), GetObjectAcl/GetBucketAcl
read the POSIX state back, and the permissions really hold through S3.

This module runs its own daemon with a FUSE mount and ``--umask 027``, so ownership and the
modes of objects and buckets made through S3 (private without a canned ACL, whatever the
umask) are checked on the mount too."""

from __future__ import annotations

import contextlib
import os
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from public_dir import public_tempdir
from tierd_fuse.mount import find_mount, unmount

from tierd.acl import posix_acl as pacl

from .conftest import (
    USER_KEY,
    USER_SECRET,
    Daemon,
    add_user_key,
    admin_call,
    assert_error,
    start_daemon,
)

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse")

ALICE_UID = 1000
ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"
AUTH_USERS = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers"


@pytest.fixture(scope="module")
def mounted() -> Iterator[tuple[Daemon, Path]]:
    with public_tempdir("tierd-canned-") as base:
        data_dir, mnt = base / "data", base / "mnt"
        mnt.mkdir()
        add_user_key(data_dir, USER_KEY, USER_SECRET, ALICE_UID, "alice")
        d = start_daemon(data_dir, "--mount", str(mnt), "--umask", "027")
        try:
            deadline = time.monotonic() + 30
            while find_mount(mnt) is None:
                assert time.monotonic() < deadline, d.log.read_text()
                time.sleep(0.05)
            yield d, mnt
        finally:
            d.stop()
            if find_mount(mnt) is not None:
                with contextlib.suppress(Exception):
                    unmount(mnt, lazy=True)
            text = d.log.read_text(errors="replace")
            assert "Traceback" not in text, text[-5000:]


@pytest.fixture(scope="module")
def root(mounted: tuple[Daemon, Path]) -> Any:
    return mounted[0].client()


@pytest.fixture(scope="module")
def alice(mounted: tuple[Daemon, Path]) -> Any:
    return mounted[0].client(USER_KEY, USER_SECRET)


@pytest.fixture
def mnt(mounted: tuple[Daemon, Path]) -> Path:
    return mounted[1]


@pytest.fixture
def bucket(alice: Any) -> str:
    """A bucket alice owns (made wide open so root's objects have a different owner from
    the bucket's)."""
    name = f"c-{uuid.uuid4().hex[:16]}"
    alice.create_bucket(Bucket=name)
    return name


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def acl_entries(path: Path) -> set[tuple[int, int, int]]:
    try:
        blob = os.getxattr(path, "system.posix_acl_access")
    except OSError:
        return set()
    return {(e.tag, e.perm, e.id) for e in pacl.parse(blob)}


def grants(acl: dict[str, Any]) -> set[tuple[str, str]]:
    out = set()
    for g in acl["Grants"]:
        who = g["Grantee"].get("URI") or g["Grantee"].get("DisplayName")
        out.add((who, g["Permission"]))
    return out


@pytest.mark.parametrize(("canned", "mode", "named"), [
    ("private", 0o600, None),
    ("public-read", 0o644, None),
    ("public-read-write", 0o666, None),
    ("authenticated-read", 0o644, None),
    ("bucket-owner-read", 0o640, pacl.READ),
    ("bucket-owner-full-control", 0o660, pacl.READ | pacl.WRITE),
])
def test_canned_acl_becomes_mode_and_acl(root: Any, alice: Any, mnt: Path, bucket: str,
                                        canned: str, mode: int, named: int | None) -> None:
    root.put_object(Bucket=bucket, Key="obj", Body=b"data", ACL=canned)
    path = mnt / bucket / "obj"
    st = os.stat(path)
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (mode, 0)
    entries = acl_entries(path)
    if named is None:
        assert entries == set()
    else:
        assert (pacl.USER, named, ALICE_UID) in entries
    got = grants(root.get_object_acl(Bucket=bucket, Key="obj"))
    assert ("root", "FULL_CONTROL") in got
    assert (AUTH_USERS, "READ") in got if mode & 0o004 else (AUTH_USERS, "READ") not in got
    assert (AUTH_USERS, "WRITE") in got if mode & 0o002 else (AUTH_USERS, "WRITE") not in got
    # the anonymous grant of public-read(-write), nothing else (no bucket policy here)
    public = {"public-read": {"READ"}, "public-read-write": {"READ", "WRITE"}}.get(canned, set())
    assert {p for who, p in got if who == ALL_USERS} == public
    if named is not None:
        assert ("alice", "READ") in got
    # the permissions hold through S3: alice owns the bucket but not the object
    if mode & 0o044 or named:
        assert alice.get_object(Bucket=bucket, Key="obj")["Body"].read() == b"data"
    else:
        assert_error("AccessDenied", 403, alice.get_object, Bucket=bucket, Key="obj")
    url = f"{root.meta.endpoint_url}/{bucket}/obj"
    # other bits are not anonymous; and alice's bucket is private: anonymous requests cannot
    # reach even a public-read object in it (tests/s3/test_private_default.py)
    assert requests.get(url, timeout=10).status_code == 403


def test_put_object_acl_header_and_xml(root: Any, alice: Any, mnt: Path,
                                       bucket: str) -> None:
    root.put_object(Bucket=bucket, Key="k", Body=b"v")
    path = mnt / bucket / "k"
    assert mode_of(path) == 0o600  # private: no canned ACL (and the daemon's umask 027)
    root.put_object_acl(Bucket=bucket, Key="k", ACL="public-read-write")
    assert mode_of(path) == 0o666  # the mount saw the change (no stale attributes)
    root.put_object_acl(Bucket=bucket, Key="k", ACL="private")
    assert mode_of(path) == 0o600
    assert grants(root.get_object_acl(Bucket=bucket, Key="k")) == {("root", "FULL_CONTROL")}
    # only the owner (or root) may: alice owns the bucket, not the object
    assert_error("AccessDenied", 403, alice.put_object_acl, Bucket=bucket, Key="k",
                 ACL="public-read")
    owner = root.get_object_acl(Bucket=bucket, Key="k")["Owner"]
    public = {"Owner": owner, "Grants": [
        {"Grantee": {"Type": "CanonicalUser", "ID": owner["ID"]}, "Permission": "FULL_CONTROL"},
        {"Grantee": {"Type": "Group", "URI": ALL_USERS}, "Permission": "READ"}]}
    root.put_object_acl(Bucket=bucket, Key="k", AccessControlPolicy=public)
    assert mode_of(path) == 0o644
    odd = {"Owner": owner, "Grants": [
        {"Grantee": {"Type": "Group", "URI": ALL_USERS}, "Permission": "WRITE_ACP"}]}
    assert_error("NotImplemented", 501, root.put_object_acl, Bucket=bucket, Key="k",
                 AccessControlPolicy=odd)
    assert mode_of(path) == 0o644
    assert_error("NoSuchKey", 404, root.put_object_acl, Bucket=bucket, Key="nope",
                 ACL="private")
    assert_error("NoSuchKey", 404, root.get_object_acl, Bucket=bucket, Key="nope")


def test_acl_reads_back_chmod_and_setfacl_from_the_mount(root: Any, mnt: Path,
                                                        bucket: str) -> None:
    root.put_object(Bucket=bucket, Key="f", Body=b"v")
    path = mnt / bucket / "f"
    os.chmod(path, 0o604)
    assert grants(root.get_object_acl(Bucket=bucket, Key="f")) == {
        ("root", "FULL_CONTROL"), (AUTH_USERS, "READ")}
    os.setxattr(path, "system.posix_acl_access", pacl.serialize([
        pacl.AclEntry(pacl.USER_OBJ, 6), pacl.AclEntry(pacl.USER, 6, ALICE_UID),
        pacl.AclEntry(pacl.GROUP_OBJ, 0), pacl.AclEntry(pacl.MASK, 4),
        pacl.AclEntry(pacl.OTHER, 0)]))
    # the mask limits alice's rw- to r--, as the kernel would
    assert grants(root.get_object_acl(Bucket=bucket, Key="f")) == {
        ("root", "FULL_CONTROL"), ("alice", "READ")}


def test_unknown_canned_acl(root: Any, bucket: str) -> None:
    resp = assert_error("InvalidArgument", 400, root.put_object, Bucket=bucket, Key="x",
                        Body=b"x", ACL="world-readable")
    assert "world-readable" in resp["Error"]["Message"]
    root.put_object(Bucket=bucket, Key="y", Body=b"y")
    assert_error("InvalidArgument", 400, root.put_object_acl, Bucket=bucket, Key="y",
                 ACL="everyone")
    assert_error("InvalidArgument", 400, root.create_bucket, Bucket=f"c-{uuid.uuid4().hex}",
                 ACL="nope")


def test_copy_and_multipart_carry_the_acl(root: Any, mnt: Path, bucket: str) -> None:
    root.put_object(Bucket=bucket, Key="src", Body=b"s" * 10)
    root.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "src"},
                     ACL="public-read")
    assert mode_of(mnt / bucket / "copy") == 0o644
    up = root.create_multipart_upload(Bucket=bucket, Key="mpu", ACL="private")
    part = root.upload_part(Bucket=bucket, Key="mpu", UploadId=up["UploadId"], PartNumber=1,
                            Body=b"m" * 100)
    root.complete_multipart_upload(Bucket=bucket, Key="mpu", UploadId=up["UploadId"],
                                   MultipartUpload={"Parts": [
                                       {"PartNumber": 1, "ETag": part["ETag"]}]})
    assert mode_of(mnt / bucket / "mpu") == 0o600
    assert "tierd.acl" not in str(root.head_object(Bucket=bucket, Key="mpu")["Metadata"])


def test_bucket_acls(root: Any, alice: Any, mnt: Path) -> None:
    names = [f"c-{uuid.uuid4().hex[:16]}" for _ in range(3)]
    alice.create_bucket(Bucket=names[0])
    alice.create_bucket(Bucket=names[1], ACL="public-read")
    alice.create_bucket(Bucket=names[2], ACL="private")
    st = os.stat(mnt / names[0])
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, ALICE_UID)  # private, creator
    assert mode_of(mnt / names[1]) == 0o755
    assert mode_of(mnt / names[2]) == 0o700
    got = grants(alice.get_bucket_acl(Bucket=names[1]))
    assert got == {("alice", "FULL_CONTROL"), (AUTH_USERS, "READ"), (ALL_USERS, "READ")}
    alice.put_bucket_acl(Bucket=names[1], ACL="public-read-write")
    assert mode_of(mnt / names[1]) == 0o777
    assert grants(alice.get_bucket_acl(Bucket=names[1])) == {
        ("alice", "FULL_CONTROL"), (AUTH_USERS, "READ"), (AUTH_USERS, "WRITE"),
        (ALL_USERS, "READ"), (ALL_USERS, "WRITE")}
    alice.put_bucket_acl(Bucket=names[1], ACL="authenticated-read")  # no anonymous grant
    assert grants(alice.get_bucket_acl(Bucket=names[1])) == {
        ("alice", "FULL_CONTROL"), (AUTH_USERS, "READ")}
    # root's POSIX rights let it list alice's private bucket, but only the owner may chmod
    root.list_objects_v2(Bucket=names[2])
    root.put_bucket_acl(Bucket=names[2], ACL="public-read")  # root may
    assert mode_of(mnt / names[2]) == 0o755
    alice.put_object(Bucket=names[0], Key="a", Body=b"a")
    st = os.stat(mnt / names[0] / "a")
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o600, ALICE_UID, ALICE_UID)


def test_all_users_shows_a_public_policy(root: Any, bucket: str, alice: Any) -> None:
    root.put_object(Bucket=bucket, Key="pub/x", Body=b"x", ACL="public-read")
    alice.put_bucket_policy(Bucket=bucket, Policy=(
        '{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject",'
        f'"Resource":"arn:aws:s3:::{bucket}/pub/*"}}]}}'))
    assert (ALL_USERS, "READ") in grants(root.get_object_acl(Bucket=bucket, Key="pub/x"))
    url = f"{root.meta.endpoint_url}/{bucket}/pub/x"
    assert requests.get(url, timeout=10).content == b"x"


def test_admin_api_reports_what_the_mount_changed(mounted: tuple[Daemon, Path],
                                                  alice: Any, mnt: Path) -> None:
    """GET /v1/buckets shows a bucket's access as it is now, whoever changed it."""
    d = mounted[0]
    name = f"c-{uuid.uuid4().hex[:16]}"
    alice.create_bucket(Bucket=name, ACL="public-read")
    assert admin_call(d, "GET", f"/v1/buckets/{name}")["acl"] == "public-read"
    os.chmod(mnt / name, 0o750)  # through the mount: no canned ACL has this shape
    doc = admin_call(d, "GET", f"/v1/buckets/{name}")
    assert (doc["acl"], doc["public"]) == ("custom", False)  # 0750 closes it to anonymous
    os.chmod(mnt / name, 0o700)
    assert admin_call(d, "GET", f"/v1/buckets/{name}")["acl"] == "private"
