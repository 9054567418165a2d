"""Other real clients against the daemon: minio-py, the AWS CLI, s3cmd and rclone (bytes,
ETags/MD5s, listings, sync, delete).  Every client must be installed (``./dev.sh setup``):
a missing one fails the test rather than skipping it."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import minio
import minio.deleteobjects
import pytest
import requests

from .conftest import REGION, ROOT_KEY, ROOT_SECRET, Daemon

MiB = 1 << 20


def test_minio_py_round_trip(daemon: Daemon, s3: Any, bucket: str) -> None:
    mc = minio.Minio(daemon.url.removeprefix("http://"), access_key=ROOT_KEY,
                     secret_key=ROOT_SECRET, secure=False, region=REGION)
    assert mc.bucket_exists(bucket)
    data = os.urandom(300_000)
    r = mc.put_object(bucket, "m/small", io.BytesIO(data), len(data),
                      content_type="text/plain", metadata={"x-amz-meta-k": "v"})
    assert r.etag == hashlib.md5(data).hexdigest()
    resp = mc.get_object(bucket, "m/small")
    try:
        assert resp.read() == data
    finally:
        resp.close()
        resp.release_conn()
    st = mc.stat_object(bucket, "m/small")
    assert st.size == len(data) and st.content_type == "text/plain"
    assert st.metadata["x-amz-meta-k"] == "v"
    # minio-py switches to multipart above part_size, with unknown length streamed
    big = os.urandom(12 * MiB + 3)
    mc.put_object(bucket, "m/big", io.BytesIO(big), -1, part_size=5 * MiB)
    parts = [big[i:i + 5 * MiB] for i in range(0, len(big), 5 * MiB)]
    want = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    assert mc.stat_object(bucket, "m/big").etag == f"{want}-3"
    resp = mc.get_object(bucket, "m/big", offset=5 * MiB, length=100)
    try:
        assert resp.read() == big[5 * MiB:5 * MiB + 100]
    finally:
        resp.close()
        resp.release_conn()
    names = sorted(o.object_name for o in mc.list_objects(bucket, prefix="m/", recursive=True))
    assert names == ["m/big", "m/small"]
    mc.remove_object(bucket, "m/small")
    errors = list(mc.remove_objects(bucket, [minio.deleteobjects.DeleteObject("m/big")]))
    assert errors == []
    assert list(mc.list_objects(bucket, prefix="m/")) == []
    url = mc.presigned_get_object(bucket, "nope")
    assert requests.get(url, timeout=10).status_code == 404


def tool(name: str) -> str:
    """A client program: the one installed in this venv (pip: awscli), else on PATH (Debian:
    s3cmd, rclone).  Missing is a failure, not a skip: ``./dev.sh setup`` installs them all,
    and CI must run every client."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    exe = shutil.which(name)
    if exe is None:
        pytest.fail(f"{name} is not installed: run ./dev.sh setup (it installs the S3 "
                    "clients the tests drive)", pytrace=False)
    return exe


def clean_env(tmp_path: Path) -> dict[str, str]:
    """The environment for a client program: none of the caller's AWS/tierd/rclone
    settings (an AWS_CA_BUNDLE, say, breaks rclone's plain-HTTP transport)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "TIERD_", "RCLONE_", "S3CMD"))}
    env["HOME"] = str(tmp_path)
    return env


def runner(exe: str, env: dict[str, str], *pre: str) -> Callable[..., str]:
    def run(*args: str) -> str:
        r = subprocess.run([exe, *pre, *args], env=env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r.stdout
    return run


@pytest.fixture
def aws(daemon: Daemon, tmp_path: Path) -> Callable[..., str]:
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = {ROOT_KEY}\n"
                     f"aws_secret_access_key = {ROOT_SECRET}\n")
    env = clean_env(tmp_path)
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_DEFAULT_REGION=REGION, AWS_MAX_ATTEMPTS="1")
    return runner(tool("aws"), env, "--endpoint-url", daemon.url)


def test_aws_cli_round_trip(aws: Callable[..., str], s3: Any, bucket: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {"a.txt": b"alpha", "sub/b.bin": os.urandom(100_000),
             "sub/big.bin": os.urandom(9 * MiB)}
    for name, data in files.items():
        (src / name).write_bytes(data)
    aws("s3", "cp", str(src / "a.txt"), f"s3://{bucket}/one/a.txt")
    aws("s3", "sync", str(src), f"s3://{bucket}/tree/")
    out = aws("s3", "ls", f"s3://{bucket}/tree/", "--recursive")
    assert sorted(line.split()[-1] for line in out.splitlines()) == sorted(
        f"tree/{n}" for n in files)
    for name, data in files.items():
        assert s3.get_object(Bucket=bucket, Key=f"tree/{name}")["Body"].read() == data
    h = s3.head_object(Bucket=bucket, Key="tree/sub/big.bin")
    assert h["ETag"].endswith('-2"')  # 8 MiB parts by default
    dst = tmp_path / "dst"
    aws("s3", "sync", f"s3://{bucket}/tree/", str(dst))
    for name, data in files.items():
        assert (dst / name).read_bytes() == data
    # a second sync has nothing to do
    assert aws("s3", "sync", str(src), f"s3://{bucket}/tree/").strip() == ""
    out = aws("s3api", "head-object", "--bucket", bucket, "--key", "one/a.txt")
    assert hashlib.md5(b"alpha").hexdigest() in out
    aws("s3", "rm", f"s3://{bucket}/tree/", "--recursive")
    aws("s3", "rm", f"s3://{bucket}/one/a.txt")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    out = aws("s3", "ls")
    assert bucket in out


def _tree(root: Path) -> dict[str, bytes]:
    """A small tree with a multipart-sized file: name -> bytes, written under ``root``."""
    files = {"a.txt": b"alpha\n", "sub/b.bin": os.urandom(100_000),
             "sub/deeper/c.bin": os.urandom(3), "big.bin": os.urandom(11 * MiB + 5)}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def _etag(data: bytes, part: int = 0) -> str:
    if not part or len(data) <= part:
        return f'"{hashlib.md5(data).hexdigest()}"'
    parts = [data[i:i + part] for i in range(0, len(data), part)]
    digest = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    return f'"{digest}-{len(parts)}"'


def _check_objects(s3: Any, bucket: str, prefix: str, files: dict[str, bytes],
                   part: int) -> None:
    """The objects under ``prefix`` are exactly ``files``, byte for byte, with the ETags of
    single-part (or ``part``-sized multipart) uploads."""
    listed = {o["Key"]: o["ETag"] for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix) for o in page.get("Contents", [])}
    assert sorted(listed) == sorted(prefix + n for n in files)
    for name, data in files.items():
        assert s3.get_object(Bucket=bucket, Key=prefix + name)["Body"].read() == data
        assert listed[prefix + name] == _etag(data, part), name


def test_s3cmd_round_trip(daemon: Daemon, s3: Any, tmp_path: Path) -> None:
    host = daemon.url.removeprefix("http://")
    cfg = tmp_path / "s3cfg"
    cfg.write_text(f"[default]\naccess_key = {ROOT_KEY}\nsecret_key = {ROOT_SECRET}\n"
                   f"host_base = {host}\nhost_bucket = {host}\nuse_https = False\n"
                   f"bucket_location = {REGION}\nsignature_v2 = False\n"
                   "multipart_chunk_size_mb = 5\n")
    run = runner(tool("s3cmd"), clean_env(tmp_path), "-c", str(cfg), "--no-progress")
    bucket = f"s3cmd-{uuid.uuid4().hex[:12]}"
    run("mb", f"s3://{bucket}")
    assert f"s3://{bucket}" in run("ls")
    src = tmp_path / "src"
    files = _tree(src)
    run("put", str(src / "a.txt"), f"s3://{bucket}/one/a.txt")
    run("put", str(src / "big.bin"), f"s3://{bucket}/one/big.bin")
    assert s3.head_object(Bucket=bucket, Key="one/big.bin")["ETag"] == _etag(
        files["big.bin"], 5 * MiB)
    run("get", f"s3://{bucket}/one/big.bin", str(tmp_path / "big.got"))
    assert (tmp_path / "big.got").read_bytes() == files["big.bin"]
    # ls --list-md5 shows the MD5 of single-part objects: the ETag
    md5s = {line.split()[-1]: line.split()[3]
            for line in run("ls", "--list-md5", f"s3://{bucket}/one/").splitlines()}
    assert md5s[f"s3://{bucket}/one/a.txt"] == hashlib.md5(files["a.txt"]).hexdigest()
    run("sync", f"{src}/", f"s3://{bucket}/tree/")
    _check_objects(s3, bucket, "tree/", files, 5 * MiB)
    out = run("ls", "-r", f"s3://{bucket}/tree/")
    assert sorted(line.split()[-1] for line in out.splitlines()) == sorted(
        f"s3://{bucket}/tree/{n}" for n in files)
    # nothing changed: a second sync uploads nothing
    assert "upload:" not in run("sync", f"{src}/", f"s3://{bucket}/tree/")
    (src / "a.txt").write_bytes(b"changed\n")
    files["a.txt"] = b"changed\n"
    assert "upload:" in run("sync", f"{src}/", f"s3://{bucket}/tree/")
    dst = tmp_path / "dst"
    run("sync", f"s3://{bucket}/tree/", f"{dst}/")
    for name, data in files.items():
        assert (dst / name).read_bytes() == data
    info = run("info", f"s3://{bucket}/tree/a.txt")
    assert hashlib.md5(b"changed\n").hexdigest() in info
    run("cp", f"s3://{bucket}/tree/a.txt", f"s3://{bucket}/copied.txt")
    assert s3.get_object(Bucket=bucket, Key="copied.txt")["Body"].read() == b"changed\n"
    run("del", f"s3://{bucket}/one/a.txt")
    run("del", "--recursive", "--force", f"s3://{bucket}/")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    run("rb", f"s3://{bucket}")
    assert f"s3://{bucket}" not in run("ls")


def test_rclone_round_trip(daemon: Daemon, s3: Any, tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    (tmp_path / "rclone.conf").write_text("")
    env.update(RCLONE_CONFIG=str(tmp_path / "rclone.conf"), RCLONE_CONFIG_T_TYPE="s3",
               RCLONE_CONFIG_T_PROVIDER="Other", RCLONE_CONFIG_T_ACCESS_KEY_ID=ROOT_KEY,
               RCLONE_CONFIG_T_SECRET_ACCESS_KEY=ROOT_SECRET,
               RCLONE_CONFIG_T_ENDPOINT=daemon.url, RCLONE_CONFIG_T_REGION=REGION,
               RCLONE_CONFIG_T_FORCE_PATH_STYLE="true")
    run = runner(tool("rclone"), env, "--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M",
                 "--low-level-retries", "1", "--retries", "1")
    bucket = f"rclone-{uuid.uuid4().hex[:12]}"
    run("mkdir", f"t:{bucket}")
    assert bucket in run("lsd", "t:")
    src = tmp_path / "src"
    files = _tree(src)
    run("copyto", str(src / "big.bin"), f"t:{bucket}/one/big.bin")
    assert s3.head_object(Bucket=bucket, Key="one/big.bin")["ETag"] == _etag(
        files["big.bin"], 5 * MiB)
    run("sync", str(src), f"t:{bucket}/tree")
    _check_objects(s3, bucket, "tree/", files, 5 * MiB)
    assert sorted(run("lsf", "-R", "--files-only", f"t:{bucket}/tree").split()) == sorted(
        files)
    # rclone compares MD5s: ETags for single-part objects, its own metadata for multipart
    sums = dict(reversed(line.split()) for line in run("md5sum", f"t:{bucket}/tree")
                .splitlines())
    assert sums == {n: hashlib.md5(d).hexdigest() for n, d in files.items()}
    assert run("cat", f"t:{bucket}/tree/a.txt") == "alpha\n"
    run("check", str(src), f"t:{bucket}/tree")
    run("check", "--download", str(src), f"t:{bucket}/tree")
    dst = tmp_path / "dst"
    run("sync", f"t:{bucket}/tree", str(dst))
    for name, data in files.items():
        assert (dst / name).read_bytes() == data
    (src / "sub" / "b.bin").unlink()
    del files["sub/b.bin"]
    run("sync", str(src), f"t:{bucket}/tree")  # deletes the removed file remotely
    _check_objects(s3, bucket, "tree/", files, 5 * MiB)
    run("copyto", f"t:{bucket}/tree/a.txt", f"t:{bucket}/copied.txt")  # server-side copy
    assert s3.get_object(Bucket=bucket, Key="copied.txt")["Body"].read() == files["a.txt"]
    run("delete", f"t:{bucket}/copied.txt")
    run("purge", f"t:{bucket}")
    assert bucket not in run("lsd", "t:")
