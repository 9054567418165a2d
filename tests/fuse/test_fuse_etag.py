"""The ETag of content written through the mount: left unknown at the close (not hashed
behind the writer) and computed when first needed.  Every S3 answer that shows or compares
it gives the MD5 of the bytes, whichever asks first; the persister's upload records the same
MD5, and the cold object holds those bytes.  Real programs write (``dd``), boto3 asks."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import BUCKET, Daemon, run
from test_fuse_kernel import admin

pytestmark = pytest.mark.timeout(120)


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _status(e: ClientError) -> int:
    return int(e.response["ResponseMetadata"]["HTTPStatusCode"])


def _head(s3: Any, key: str, _: str) -> str:
    return str(s3.head_object(Bucket=BUCKET, Key=key)["ETag"])


def _get(s3: Any, key: str, _: str) -> str:
    return str(s3.get_object(Bucket=BUCKET, Key=key)["ETag"])


def _list(s3: Any, key: str, _: str) -> str:
    rows = s3.list_objects_v2(Bucket=BUCKET, Prefix=key)["Contents"]
    return str(next(r["ETag"] for r in rows if r["Key"] == key))


def _versions(s3: Any, key: str, _: str) -> str:
    rows = s3.list_object_versions(Bucket=BUCKET, Prefix=key)["Versions"]
    return str(next(r["ETag"] for r in rows if r["Key"] == key))


def _attributes(s3: Any, key: str, _: str) -> str:
    doc = s3.get_object_attributes(Bucket=BUCKET, Key=key, ObjectAttributes=["ETag"])
    return str(doc["ETag"])


def _if_match(s3: Any, key: str, want: str) -> str:
    with pytest.raises(ClientError) as e:  # a wrong ETag first: the unknown one is no match
        s3.get_object(Bucket=BUCKET, Key=key, IfMatch='"' + "0" * 32 + '"')
    assert _status(e.value) == 412
    return str(s3.get_object(Bucket=BUCKET, Key=key, IfMatch=f'"{want}"')["ETag"])


def _if_none_match(s3: Any, key: str, want: str) -> str:
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=BUCKET, Key=key, IfNoneMatch=f'"{want}"')
    assert _status(e.value) == 304
    return f'"{want}"'


def _copy_if_match(s3: Any, key: str, want: str) -> str:
    s3.copy_object(Bucket=BUCKET, Key=key + ".copy", CopySource={"Bucket": BUCKET, "Key": key},
                   CopySourceIfMatch=f'"{want}"')
    return str(s3.head_object(Bucket=BUCKET, Key=key + ".copy")["ETag"])


def _put_if_match(s3: Any, key: str, want: str) -> str:
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"x", IfMatch='"' + "0" * 32 + '"')
    assert _status(e.value) == 412
    return f'"{want}"'


ASKS: dict[str, Callable[[Any, str, str], str]] = {
    "head": _head, "get": _get, "list": _list, "versions": _versions,
    "attributes": _attributes, "if-match": _if_match, "if-none-match": _if_none_match,
    "copy-if-match": _copy_if_match, "put-if-match": _put_if_match,
}


@pytest.mark.parametrize("ask", sorted(ASKS))
def test_first_s3_answer_after_a_mount_write_has_the_md5(
    daemon: Daemon, s3: Any, work: Path, tmp_path: Path, ask: str,
) -> None:
    """Each S3 operation is the first to need the ETag of its own freshly written file."""
    data = os.urandom((2 << 20) + 123)
    src = tmp_path / "src"
    src.write_bytes(data)
    run(["dd", f"if={src}", f"of={work / 'f.bin'}", "bs=1M", "status=none"])
    key = f"{work.relative_to(daemon.mnt / BUCKET)}/f.bin"
    assert ASKS[ask](s3, key, md5(data)).strip('"') == md5(data)
    assert _head(s3, key, "").strip('"') == md5(data)  # and it stays so


def test_the_persisted_object_and_the_namespace_agree(
    daemon: Daemon, s3: Any, work: Path,
) -> None:
    """Nobody asks before the persister uploads: the MD5 it computes is the ETag S3 shows,
    and the cold object holds those bytes.  Rewritten in place afterwards, the ETag follows
    the new bytes."""
    data = os.urandom((3 << 20) + 5)
    (work / "p.bin").write_bytes(data)
    key = f"{work.relative_to(daemon.mnt / BUCKET)}/p.bin"
    admin(daemon, "POST", "/v1/placement/persist", {"prefix": f"{BUCKET}/{key}", "timeout": 60})
    cold = daemon.data_dir / "cold" / BUCKET / key
    assert cold.read_bytes() == data
    assert s3.head_object(Bucket=BUCKET, Key=key)["ETag"].strip('"') == md5(data)
    with open(work / "p.bin", "r+b") as f:  # an in-place change of a persisted file
        f.seek(1000)
        f.write(b"changed")
    new = data[:1000] + b"changed" + data[1007:]
    admin(daemon, "POST", "/v1/placement/persist", {"prefix": f"{BUCKET}/{key}", "timeout": 60})
    assert cold.read_bytes() == new
    got = s3.get_object(Bucket=BUCKET, Key=key)
    assert got["Body"].read() == new and got["ETag"].strip('"') == md5(new)
