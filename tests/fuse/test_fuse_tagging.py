"""Object tags across doors: tags describe the object, not its bytes, so a write, truncate or
rename through the mount keeps them (checksums, which describe the bytes, are dropped), and
they are not extended attributes of the file (tierd/namespace/tags.py)."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from conftest import BUCKET, Daemon

pytestmark = pytest.mark.timeout(120)



def _tags(s3: Any, key: str) -> dict[str, str]:
    return {t["Key"]: t["Value"]
            for t in s3.get_object_tagging(Bucket=BUCKET, Key=key)["TagSet"]}


def test_tags_survive_writes_truncates_and_renames_through_the_mount(
        daemon: Daemon, s3: Any) -> None:
    key = f"tags-{uuid.uuid4().hex[:8]}/obj.txt"
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"first\n", Tagging="team=ml&stage=raw")
    etag = s3.head_object(Bucket=BUCKET, Key=key)["ETag"]
    path = daemon.mnt / BUCKET / key
    with open(path, "ab") as f:
        f.write(b"appended through the mount\n")
    head = s3.head_object(Bucket=BUCKET, Key=key)
    assert head["ETag"] != etag  # a new version of the bytes ...
    assert _tags(s3, key) == {"team": "ml", "stage": "raw"}  # ... of the same object
    assert head["ResponseMetadata"]["HTTPHeaders"]["x-amz-tagging-count"] == "2"
    os.truncate(path, 3)
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"fir"
    assert _tags(s3, key) == {"team": "ml", "stage": "raw"}
    moved = key.replace("obj.txt", "moved.txt")
    os.rename(path, daemon.mnt / BUCKET / moved)
    assert _tags(s3, moved) == {"team": "ml", "stage": "raw"}


def test_tags_are_not_extended_attributes(daemon: Daemon, s3: Any) -> None:
    key = f"tags-{uuid.uuid4().hex[:8]}.txt"
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"x", Tagging="a=1")
    path = daemon.mnt / BUCKET / key
    assert not [n for n in os.listxattr(path) if "tag" in n]
    os.setxattr(path, "user.note", b"mine")
    assert _tags(s3, key) == {"a": "1"}  # and xattrs are not tags
