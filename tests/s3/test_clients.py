"""Other real clients against the daemon: minio-py and the AWS CLI (bytes and ETags)."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import REGION, ROOT_KEY, ROOT_SECRET, Daemon

MiB = 1 << 20


def test_minio_py_round_trip(daemon: Daemon, s3: Any, bucket: str) -> None:
    minio = pytest.importorskip("minio")
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
    import requests
    assert requests.get(url, timeout=10).status_code == 404


@pytest.fixture
def aws(daemon: Daemon, tmp_path: Path) -> Any:
    exe = shutil.which("aws")
    if exe is None:
        pytest.skip("the AWS CLI is not installed")
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = {ROOT_KEY}\n"
                     f"aws_secret_access_key = {ROOT_SECRET}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TIERD_"))}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_DEFAULT_REGION=REGION, AWS_MAX_ATTEMPTS="1")

    def run(*args: str) -> str:
        r = subprocess.run([exe, "--endpoint-url", daemon.url, *args], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r.stdout
    return run


def test_aws_cli_round_trip(aws: Any, s3: Any, bucket: str, tmp_path: Path) -> None:
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
