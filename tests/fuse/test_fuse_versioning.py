"""Versioning through the mount: the mount shows the current version only; writes, atomic
replaces and in-place changes through it make versions; ``rm`` leaves a delete marker; an
S3 delete of a marker or of the current version brings the previous one back at its path.
Real programs (cp, mv, rm, cat, ls) on one side, boto3 on the other."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, run
from test_fuse_kernel import fuse_reads

pytestmark = pytest.mark.timeout(120)



@pytest.fixture
def ubucket(daemon: Daemon, s3: Any) -> Iterator[tuple[str, Path]]:
    """A bucket of its own, not versioned yet (the session's bucket stays unversioned);
    every version in it is deleted with it."""
    name = f"fv-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    yield name, daemon.mnt / name
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=name):
        objs = [{"Key": v["Key"], "VersionId": v["VersionId"]}
                for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]
        if objs:
            s3.delete_objects(Bucket=name, Delete={"Objects": objs})
    s3.delete_bucket(Bucket=name)


@pytest.fixture
def vbucket(ubucket: tuple[str, Path], s3: Any) -> tuple[str, Path]:
    """A versioned bucket of its own."""
    s3.put_bucket_versioning(Bucket=ubucket[0],
                             VersioningConfiguration={"Status": "Enabled"})
    return ubucket


def history(s3: Any, bucket: str, key: str) -> list[tuple[str, bool, bool]]:
    """(version id, is delete marker, is latest) of ``key``, newest first."""
    page = s3.list_object_versions(Bucket=bucket, Prefix=key)
    rows = [(v["VersionId"], False, v["IsLatest"]) for v in page.get("Versions", [])
            if v["Key"] == key]
    rows += [(m["VersionId"], True, m["IsLatest"]) for m in page.get("DeleteMarkers", [])
             if m["Key"] == key]
    return sorted(rows, key=lambda r: (r[0] == "null", r[0]))


def test_mount_writes_make_versions(s3: Any, vbucket: tuple[str, Path],
                                    tmp_path: Path) -> None:
    bucket, root = vbucket
    src = tmp_path / "src"
    src.write_bytes(b"first")
    run(["cp", str(src), str(root / "f.txt")])
    (v1, _, _), = history(s3, bucket, "f.txt")
    assert v1 != "null"
    assert s3.head_object(Bucket=bucket, Key="f.txt")["VersionId"] == v1
    # an editor's save: a new file renamed over the old one
    src.write_bytes(b"second")
    run(["cp", str(src), str(root / ".f.txt.tmp")])
    run(["mv", str(root / ".f.txt.tmp"), str(root / "f.txt")])
    hist = history(s3, bucket, "f.txt")
    assert [h[0] for h in hist][1:] == [v1] and hist[0][2] is True
    v2 = hist[0][0]
    assert s3.get_object(Bucket=bucket, Key="f.txt", VersionId=v1)["Body"].read() == b"first"
    assert run(["cat", str(root / "f.txt")]).stdout == "second"
    # a change in place gives the current version a new id and keeps the old one
    _in_place(root / "f.txt")
    v3 = s3.head_object(Bucket=bucket, Key="f.txt")["VersionId"]
    assert v3 not in (v1, v2, "null")
    assert s3.get_object(Bucket=bucket, Key="f.txt")["Body"].read() == b"SECOND"
    assert [h[0] for h in history(s3, bucket, "f.txt")] == [v3, v2, v1]
    assert s3.get_object(Bucket=bucket, Key="f.txt", VersionId=v2)["Body"].read() == b"second"
    # the editor's temporary name has no history: no marker was left there
    assert history(s3, bucket, ".f.txt.tmp") == []
    # moving the file away: its old key keeps its history under a delete marker
    run(["mv", str(root / "f.txt"), str(root / "g.txt")])
    hist = history(s3, bucket, "f.txt")
    assert hist[0][1:] == (True, True) and [h[0] for h in hist[1:]] == [v2, v1]
    assert s3.head_object(Bucket=bucket, Key="g.txt")["VersionId"] == v3


def _in_place(path: Path) -> None:
    with open(path, "r+b") as f:
        f.write(b"SECOND")


def test_rm_leaves_marker_and_undelete_restores_the_file(s3: Any,
                                                          vbucket: tuple[str, Path]) -> None:
    bucket, root = vbucket
    s3.put_object(Bucket=bucket, Key="d/g.bin", Body=b"v1")
    v2 = s3.put_object(Bucket=bucket, Key="d/g.bin", Body=b"v2")["VersionId"]
    assert (root / "d" / "g.bin").read_bytes() == b"v2"
    run(["rm", str(root / "d" / "g.bin")])
    assert not (root / "d" / "g.bin").exists()
    hist = history(s3, bucket, "d/g.bin")
    assert hist[0][1:] == (True, True) and len(hist) == 3
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="d/g.bin")
    assert e.value.response["ResponseMetadata"]["HTTPHeaders"]["x-amz-delete-marker"] == "true"
    # removing the marker through S3: the file is back at its path in the mount
    s3.delete_object(Bucket=bucket, Key="d/g.bin", VersionId=hist[0][0])
    assert run(["cat", str(root / "d" / "g.bin")]).stdout == "v2"
    # removing the current version: the one before it is current again
    s3.delete_object(Bucket=bucket, Key="d/g.bin", VersionId=v2)
    assert run(["cat", str(root / "d" / "g.bin")]).stdout == "v1"
    assert sorted(p.name for p in (root / "d").iterdir()) == ["g.bin"]


def test_mount_shows_current_versions_only(s3: Any, vbucket: tuple[str, Path]) -> None:
    bucket, root = vbucket
    for i in range(3):
        s3.put_object(Bucket=bucket, Key="many", Body=f"{i}".encode())
    s3.put_object(Bucket=bucket, Key="gone", Body=b"x")
    s3.delete_object(Bucket=bucket, Key="gone")
    assert sorted(run(["ls", "-A", str(root)]).stdout.split()) == ["many"]
    assert (root / "many").read_bytes() == b"2"
    (root / ".tierd-versions").mkdir()  # the cold store's prefix for old versions
    try:
        with pytest.raises(PermissionError):
            (root / ".tierd-versions" / "x").write_bytes(b"reserved")
    finally:
        (root / ".tierd-versions").rmdir()


def test_suspended_bucket_through_the_mount(s3: Any, vbucket: tuple[str, Path],
                                            tmp_path: Path) -> None:
    """While suspended, a write through the mount replaces the null version and rm leaves
    a null delete marker; versions made while enabled stay."""
    bucket, root = vbucket
    v1 = s3.put_object(Bucket=bucket, Key="s", Body=b"enabled")["VersionId"]
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    src = tmp_path / "src"
    for data in (b"null-1", b"null-2"):
        src.write_bytes(data)
        run(["cp", str(src), str(root / ".s.tmp")])
        run(["mv", str(root / ".s.tmp"), str(root / "s")])
    assert [h[0] for h in history(s3, bucket, "s")] == [v1, "null"]
    assert s3.get_object(Bucket=bucket, Key="s", VersionId="null")["Body"].read() == b"null-2"
    run(["rm", str(root / "s")])
    assert history(s3, bucket, "s") == [(v1, False, False), ("null", True, True)]


def _etag(data: bytes) -> str:
    return '"' + hashlib.md5(data).hexdigest() + '"'


#: in-place overwrites through the mount, each by a real program: (argv, expected bytes)
#: with ``{f}`` the file (holding OLD) and ``{src}`` a local file holding NEW
OLD, NEW = b"0123456789" * 1000, b"new bytes"
IN_PLACE = {
    "cp": (["cp", "{src}", "{f}"], NEW),  # open(O_TRUNC) over the existing file
    "shell": (["sh", "-c", 'cat "$1" > "$2"', "sh", "{src}", "{f}"], NEW),
    "truncate": (["truncate", "-s", "5", "{f}"], OLD[:5]),
    "pwrite": (["dd", "if={src}", "of={f}", "bs=1", "seek=100", "conv=notrunc",
                "status=none"], OLD[:100] + NEW + OLD[100 + len(NEW):]),
}


@pytest.mark.parametrize("how", sorted(IN_PLACE))
def test_in_place_overwrite_keeps_the_previous_version(s3: Any, vbucket: tuple[str, Path],
                                                       tmp_path: Path, how: str) -> None:
    """cp, a shell's ``>``, truncate and a write in the middle change the file the mount
    caches in place: the committed version's bytes are kept as a noncurrent version."""
    bucket, root = vbucket
    v1 = s3.put_object(Bucket=bucket, Key="d/f.bin", Body=OLD)["VersionId"]
    assert (root / "d" / "f.bin").read_bytes() == OLD  # the kernel caches this inode
    src = tmp_path / "src"
    src.write_bytes(NEW)
    argv, want = IN_PLACE[how]
    run([a.format(f=root / "d" / "f.bin", src=src) for a in argv])
    hist = history(s3, bucket, "d/f.bin")
    assert [h[0] for h in hist][1:] == [v1] and hist[0][2] is True, hist
    old = s3.get_object(Bucket=bucket, Key="d/f.bin", VersionId=v1)
    assert old["Body"].read() == OLD and old["ETag"] == _etag(OLD)
    cur = s3.get_object(Bucket=bucket, Key="d/f.bin")
    assert cur["VersionId"] == hist[0][0] != v1
    assert cur["Body"].read() == want and cur["ETag"] == _etag(want)
    assert (root / "d" / "f.bin").read_bytes() == want
    # a second rewrite keeps the first rewrite too
    run(["truncate", "-s", "1", str(root / "d" / "f.bin")])
    hist2 = history(s3, bucket, "d/f.bin")
    assert [h[0] for h in hist2][1:] == [hist[0][0], v1]
    assert s3.get_object(Bucket=bucket, Key="d/f.bin",
                         VersionId=hist[0][0])["Body"].read() == want


def test_in_place_overwrite_of_a_null_version_and_while_suspended(
        s3: Any, vbucket: tuple[str, Path], tmp_path: Path) -> None:
    """The null version (written while suspended) is kept when an enabled bucket's file
    is rewritten in place; while suspended an in-place rewrite replaces the null version
    (as S3) and keeps nothing."""
    bucket, root = vbucket
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    s3.put_object(Bucket=bucket, Key="n", Body=OLD)
    src = tmp_path / "src"
    src.write_bytes(NEW)
    run(["cp", str(src), str(root / "n")])
    assert history(s3, bucket, "n") == [("null", False, True)]
    assert s3.get_object(Bucket=bucket, Key="n")["Body"].read() == NEW
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    run(["sh", "-c", 'printf x > "$1"', "sh", str(root / "n")])
    hist = history(s3, bucket, "n")
    assert [h[0] for h in hist][1:] == ["null"] and hist[0][0] != "null"
    null = s3.get_object(Bucket=bucket, Key="n", VersionId="null")
    assert null["Body"].read() == NEW and null["ETag"] == _etag(NEW)
    assert s3.get_object(Bucket=bucket, Key="n")["Body"].read() == b"x"


def test_every_fsync_of_one_open_writer_is_a_version_kept(
        s3: Any, vbucket: tuple[str, Path]) -> None:
    """One descriptor writes, fsyncs, writes again and fsyncs: in an Enabled bucket each
    committed state is a version S3 keeps, as on the WRITE path.  (Write passthrough
    cannot keep them -- the kernel rewrites the bytes a version names without telling the
    daemon -- so files of versioned buckets are not passed through, except by a writer
    that joins passthrough readers opened before versioning was set: the next test.)"""
    bucket, root = vbucket
    v0 = s3.put_object(Bucket=bucket, Key="w", Body=OLD)["VersionId"]
    fd = os.open(root / "w", os.O_RDWR)
    try:
        os.pwrite(fd, b"A" * 10, 0)
        os.fsync(fd)
        v1 = history(s3, bucket, "w")[0][0]
        os.pwrite(fd, b"B" * 10, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    hist = history(s3, bucket, "w")
    assert [h[0] for h in hist][1:] == [v1, v0], hist
    for vid, head in ((v0, b"0123456789"), (v1, b"A" * 10), (hist[0][0], b"B" * 10)):
        body = s3.get_object(Bucket=bucket, Key="w", VersionId=vid)["Body"].read()
        assert body[:10] == head and body[10:] == OLD[10:], vid


def test_versioning_enabled_while_a_reader_is_open(daemon: Daemon, s3: Any,
                                                   ubucket: tuple[str, Path]) -> None:
    """A reader opened before the bucket's versioning was enabled passes through and holds
    the file's backing file, which the kernel lets no other writer bypass: a writer then
    joins it (before: it waited 2 s for the reader and got ``ETXTBSY``).  The version
    committed before the writer opened is kept, and the reader sees the write at once."""
    bucket, root = ubucket
    f = root / "f"
    f.write_bytes(OLD)
    time.sleep(0.3)  # the writer's RELEASE (after its close) ends its backing file
    reads = fuse_reads(daemon, "read")
    with open(f, "rb", buffering=0) as reader:
        assert reader.read(10) == OLD[:10]
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        t0 = time.monotonic()
        fd = os.open(f, os.O_RDWR)  # an in-place writer
        try:
            os.pwrite(fd, b"A" * 10, 0)
        finally:
            os.close(fd)
        assert time.monotonic() - t0 < 1.5, "the writer waited for the reader"
        reader.seek(0)
        assert reader.read(10) == b"A" * 10
    assert fuse_reads(daemon, "read") == reads, "the reader was not passthrough"
    hist = history(s3, bucket, "f")
    assert [h[0] for h in hist][1:] == ["null"] and hist[0][2] is True, hist
    null = s3.get_object(Bucket=bucket, Key="f", VersionId="null")
    assert null["Body"].read() == OLD and null["ETag"] == _etag(OLD)
    want = b"A" * 10 + OLD[10:]
    cur = s3.get_object(Bucket=bucket, Key="f")
    assert cur["Body"].read() == want and cur["ETag"] == _etag(want)
    assert f.read_bytes() == want
