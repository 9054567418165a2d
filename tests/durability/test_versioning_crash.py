"""Versions survive kill -9 and live in the cold store.

* Every acknowledged version (PUTs over a key, delete markers, a permanent delete) is
  exactly there after SIGKILL and a restart, readable by id with its bytes; a crash inside
  an overwrite (after its commit, before its flush) leaves the old version readable either
  way (its record replaced the garbage key in the same commit).
* Noncurrent versions persist to ``<bucket>/.tierd-versions/<key>/<version id>`` while the
  current one stays the plain ``<bucket>/<key>``; with every hot copy evicted, every version
  reads back by id from the cold store, a restart does not import the version objects as
  keys, and undeleting moves the object back to its plain key.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .coldlib import Cold, Tierd, wait_for

pytestmark = pytest.mark.timeout(240)

BUCKET = "vcrash"


def versioned(s3: Any) -> None:
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})


def check(s3: Any, acked: dict[str, bytes | None], key: str) -> None:
    """Every acknowledged version of ``key``: its bytes, or a delete marker (None)."""
    for vid, data in acked.items():
        if data is None:
            with pytest.raises(ClientError) as e:
                s3.head_object(Bucket=BUCKET, Key=key, VersionId=vid)
            assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 405
        else:
            got = s3.get_object(Bucket=BUCKET, Key=key, VersionId=vid)["Body"].read()
            assert got == data, vid


def test_acknowledged_versions_survive_kill9(tmp_path: Path) -> None:
    t = Tierd(tmp_path, Cold("file", tmp_path), TIERD_PERSIST_DELAY="3600")
    t.start()
    try:
        s3 = t.s3()
        versioned(s3)
        acked: dict[str, bytes | None] = {}
        for i in range(4):
            data = os.urandom(5000 + i)
            acked[s3.put_object(Bucket=BUCKET, Key="k", Body=data)["VersionId"]] = data
        acked[s3.delete_object(Bucket=BUCKET, Key="k")["VersionId"]] = None
        data = os.urandom(70_000)
        acked[s3.put_object(Bucket=BUCKET, Key="k", Body=data)["VersionId"]] = data
        gone = next(iter(acked))
        s3.delete_object(Bucket=BUCKET, Key="k", VersionId=gone)  # permanently
        del acked[gone]
        t.kill9()
        t.start()
        s3 = t.s3()
        check(s3, acked, "k")
        with pytest.raises(ClientError) as e:
            s3.get_object(Bucket=BUCKET, Key="k", VersionId=gone)
        assert e.value.response["Error"]["Code"] == "NoSuchVersion"
        listed = s3.list_object_versions(Bucket=BUCKET)
        vids = {v["VersionId"] for v in listed["Versions"]} | {
            m["VersionId"] for m in listed["DeleteMarkers"]}
        assert vids == set(acked)
        assert s3.get_object(Bucket=BUCKET, Key="k")["Body"].read() == data
    finally:
        t.stop()


@pytest.mark.parametrize("point", ["put.committed", "delete.committed"])
def test_crash_inside_a_versioned_overwrite_keeps_the_old_version(tmp_path: Path,
                                                                  point: str) -> None:
    armed = tmp_path / "armed"
    t = Tierd(tmp_path, Cold("file", tmp_path), TIERD_PERSIST_DELAY="3600",
              TIERD_CRASHPOINT=f"{point}@{armed}")
    t.start()
    try:
        s3 = t.s3()
        versioned(s3)
        old = os.urandom(300_000)
        v1 = s3.put_object(Bucket=BUCKET, Key="k", Body=old)["VersionId"]
        armed.touch()
        with pytest.raises(Exception):  # noqa: B017 (the daemon dies mid-request)
            if point == "put.committed":
                s3.put_object(Bucket=BUCKET, Key="k", Body=b"new")
            else:
                s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": "k"}]})
        assert t.proc is not None
        assert t.proc.wait(30) == -signal.SIGKILL
        armed.unlink()
        t.start()
        s3 = t.s3()
        check(s3, {v1: old}, "k")
    finally:
        t.stop()


def test_noncurrent_versions_persist_and_read_back_from_cold(tmp_path: Path) -> None:
    cold = Cold("file", tmp_path)
    t = Tierd(tmp_path, cold)
    t.start()
    try:
        s3 = t.s3()
        versioned(s3)
        acked: dict[str, bytes | None] = {}
        for i in range(3):
            data = os.urandom(200_000 + i)
            acked[s3.put_object(Bucket=BUCKET, Key="d/k", Body=data)["VersionId"]] = data
        marker = s3.delete_object(Bucket=BUCKET, Key="d/k")["VersionId"]
        acked[marker] = None
        s3.put_object(Bucket=BUCKET, Key="other", Body=b"plain")
        assert t.persist_wait(BUCKET)["persisted"] is True
        want = {f"{BUCKET}/.tierd-versions/d/k/{vid}": data
                for vid, data in acked.items() if data is not None}
        wait_for(lambda: cold.objects() == {*want, f"{BUCKET}/other"}, what="cold layout")
        for key, data in want.items():
            assert cold.get(key) == data
        doc = t.admin("POST", "/v1/placement/evict", {"prefix": f"{BUCKET}/", "tier": "all"})
        assert doc["evicted"] >= sum(len(d) for d in want.values())
        check(s3, acked, "d/k")
        # a restart imports what cold has: never the version objects as keys
        t.stop()
        t.start()
        s3 = t.s3()
        assert t.listing(BUCKET) == {"other"}
        check(s3, acked, "d/k")
        # undelete: the newest version goes back to the plain key, in cold too
        s3.delete_object(Bucket=BUCKET, Key="d/k", VersionId=marker)
        del acked[marker]
        newest = next(v for v, d in reversed(acked.items()) if d is not None)
        assert t.persist_wait(BUCKET)["persisted"] is True
        want.pop(f"{BUCKET}/.tierd-versions/d/k/{newest}")
        wait_for(lambda: cold.objects() == {*want, f"{BUCKET}/other", f"{BUCKET}/d/k"},
                 what="the undeleted version back at its key")
        assert cold.get(f"{BUCKET}/d/k") == acked[newest]
        # the current version's bytes only in cold (evicted), then superseded and kill -9
        # right after the acknowledgement: its object must move under .tierd-versions
        # (fetched back first if the new upload would replace it), never be lost
        t.admin("POST", "/v1/placement/evict", {"prefix": f"{BUCKET}/", "tier": "all"})
        data = os.urandom(150_000)
        acked[s3.put_object(Bucket=BUCKET, Key="d/k", Body=data)["VersionId"]] = data
        t.kill9()
        t.start()
        s3 = t.s3()
        assert t.persist_wait(BUCKET)["persisted"] is True
        want[f"{BUCKET}/.tierd-versions/d/k/{newest}"] = acked[newest]
        wait_for(lambda: cold.objects() == {*want, f"{BUCKET}/other", f"{BUCKET}/d/k"},
                 what="the superseded version under .tierd-versions after kill -9")
        assert cold.get(f"{BUCKET}/.tierd-versions/d/k/{newest}") == acked[newest]
        t.admin("POST", "/v1/placement/evict", {"prefix": f"{BUCKET}/", "tier": "all"})
        check(s3, acked, "d/k")
    finally:
        t.stop()
