"""One namespace: an S3 PUT is the same file the namespace (the mount's API) reads, and a
file written with POSIX calls is an object with a correct MD5 ETag.  (The FUSE mount is its
own issue; until ``tierd serve --mount`` works this goes through the namespace API with the
daemon stopped, on the same data directory.)"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

from nsplacement import close_namespace, open_namespace

from tierd.acl import Identity
from tierd.meta import MetaStore

from .conftest import start_daemon


async def _posix(data_dir: Path, put_data: bytes, posix_data: bytes) -> None:
    meta = MetaStore.open_lmdb(data_dir / "meta")
    ns = await open_namespace(meta, data_dir)
    try:
        root = Identity.ROOT
        # the S3 PUT is a file at <bucket>/<key>
        inode = await ns.resolve(root, "uni/dir/put.bin")
        assert inode.is_reg and inode.size == len(put_data)
        assert inode.etag == hashlib.md5(put_data).hexdigest()
        fh = await ns.open(root, inode.ino, os.O_RDONLY)
        try:
            assert await ns.read(fh, 0, len(put_data) + 10) == put_data
        finally:
            await ns.release(fh)
        # a POSIX write, out of order: the ETag must still be the MD5 of the content
        d = await ns.resolve(root, "uni")
        sub = await ns.mkdir(root, d.ino, b"posix", 0o755)
        _, fh = await ns.create(root, sub.ino, b"file.bin", 0o644, os.O_WRONLY | os.O_CREAT)
        half = len(posix_data) // 2
        await ns.write(fh, half, posix_data[half:])
        await ns.write(fh, 0, posix_data[:half])
        await ns.release(fh)
    finally:
        await close_namespace(ns)
        meta.close()


def test_s3_and_posix_see_the_same_files(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    put_data = os.urandom(700_000)
    posix_data = os.urandom(1_234_567)
    d = start_daemon(data_dir)
    try:
        s3 = d.client()
        s3.create_bucket(Bucket="uni")
        s3.put_object(Bucket="uni", Key="dir/put.bin", Body=put_data)
    finally:
        d.stop()
    asyncio.run(_posix(data_dir, put_data, posix_data))
    d = start_daemon(data_dir)
    try:
        s3 = d.client()
        g = s3.get_object(Bucket="uni", Key="posix/file.bin")
        assert g["Body"].read() == posix_data
        assert g["ETag"] == f'"{hashlib.md5(posix_data).hexdigest()}"'
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="uni")["Contents"]]
        assert keys == ["dir/put.bin", "posix/file.bin"]
        # the empty directory made by mkdir lists as a marker once its file is gone
        s3.delete_object(Bucket="uni", Key="posix/file.bin")
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="uni")["Contents"]]
        assert keys == ["dir/put.bin", "posix/"]
    finally:
        d.stop()


def test_s3_and_the_mount_see_the_same_files(tmp_path: Path) -> None:
    """With ``tierd serve --mount``: a PUT is visible at once to stat/cat on the mount, an
    S3 overwrite is not hidden by the kernel cache, a POSIX write is an object."""
    import pytest

    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        pytest.skip("FUSE mounts need /dev/fuse and root here")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        d = start_daemon(tmp_path / "data", "--mount", str(mnt))
    except RuntimeError as e:
        pytest.skip(f"tierd serve --mount does not start here: {str(e)[-300:]}")
    try:
        s3 = d.client()
        s3.create_bucket(Bucket="mnt-bucket")
        data = os.urandom(300_000)
        s3.put_object(Bucket="mnt-bucket", Key="a/b.bin", Body=data)
        path = mnt / "mnt-bucket" / "a" / "b.bin"
        assert path.stat().st_size == len(data)
        assert path.read_bytes() == data
        s3.put_object(Bucket="mnt-bucket", Key="a/b.bin", Body=b"second version")
        assert path.stat().st_size == len(b"second version")
        assert path.read_bytes() == b"second version"
        posix = os.urandom(123_457)
        (mnt / "mnt-bucket" / "posix.bin").write_bytes(posix)
        g = s3.get_object(Bucket="mnt-bucket", Key="posix.bin")
        assert g["Body"].read() == posix
        assert g["ETag"] == f'"{hashlib.md5(posix).hexdigest()}"'
        s3.delete_object(Bucket="mnt-bucket", Key="a/b.bin")
        assert not path.exists()
        assert sorted(os.listdir(mnt / "mnt-bucket")) == ["posix.bin"]
    finally:
        d.stop()
