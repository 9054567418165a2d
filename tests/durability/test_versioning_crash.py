"""Versions survive kill -9 and live in the cold store.

* Every acknowledged version (PUTs over a key, delete markers, a permanent delete) is
  exactly there after SIGKILL and a restart, readable by id with its bytes; a crash inside
  an overwrite (after its commit, before its flush) leaves the old version readable either
  way (its record replaced the garbage key in the same commit).
* Noncurrent versions persist to ``<bucket>/.tierd-versions/<key>/<version id>`` while the
  current one stays the plain ``<bucket>/<key>``; with every hot copy evicted, every version
  reads back by id from the cold store, a restart does not import the version objects as
  keys, and undeleting moves the object back to its plain key.
* An in-place overwrite through the FUSE mount (``cp`` over a file, ``truncate``, a write in
  the middle) keeps the previous version, also when its bytes were only in the cold store;
  a kill -9 after its clone is made (before the record naming it) leaves no data file
  behind, and one after the record is durable (before the bytes change) leaves both
  versions whole.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tierd.tiers.local_tier import inventory

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


OLD = os.urandom(300_000)
PATCH = os.urandom(10_000)


def _etag(data: bytes) -> str:
    return '"' + hashlib.md5(data).hexdigest() + '"'


def _overwrite(t: Tierd, how: str, timeout: float = 30) -> None:
    """Change ``k`` in place through the mount with a real program (the daemon may die
    under it: its exit status is not checked)."""
    assert t.mnt is not None
    f = str(t.mnt / BUCKET / "k")
    src = t.base / "patch"
    src.write_bytes(PATCH)
    argv = {"cp": ["cp", str(src), f],
            "truncate": ["truncate", "-s", "1000", f],
            "pwrite": ["dd", f"if={src}", f"of={f}", "bs=4096", "seek=3", "conv=notrunc",
                       "status=none"]}[how]
    subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
                   check=False)


@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse")
def test_in_place_overwrite_of_an_evicted_version_keeps_it(tmp_path: Path) -> None:
    cold = Cold("file", tmp_path)
    t = Tierd(tmp_path, cold, mount=True)
    t.start()
    try:
        s3 = t.s3()
        versioned(s3)
        v1 = s3.put_object(Bucket=BUCKET, Key="k", Body=OLD)["VersionId"]
        assert t.persist_wait(BUCKET)["persisted"] is True
        doc = t.admin("POST", "/v1/placement/evict", {"prefix": f"{BUCKET}/", "tier": "all"})
        assert doc["evicted"] >= len(OLD)
        _overwrite(t, "cp")  # open(O_TRUNC): the old bytes are only in cold
        got = s3.get_object(Bucket=BUCKET, Key="k", VersionId=v1)
        assert got["Body"].read() == OLD and got["ETag"] == _etag(OLD)
        assert s3.get_object(Bucket=BUCKET, Key="k")["Body"].read() == PATCH
        assert t.persist_wait(BUCKET)["persisted"] is True
        want = {f"{BUCKET}/k", f"{BUCKET}/.tierd-versions/k/{v1}"}
        wait_for(lambda: cold.objects() == want, what="the kept version in cold")
        assert cold.get(f"{BUCKET}/.tierd-versions/k/{v1}") == OLD
        t.admin("POST", "/v1/placement/evict", {"prefix": f"{BUCKET}/", "tier": "all"})
        assert s3.get_object(Bucket=BUCKET, Key="k", VersionId=v1)["Body"].read() == OLD
    finally:
        t.stop()


@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse")
@pytest.mark.parametrize(("point", "how"), [("keep.cloned", "pwrite"),
                                            ("keep.durable", "pwrite"),
                                            ("keep.durable", "truncate")])
def test_crash_inside_an_in_place_overwrite_keeps_both_versions(tmp_path: Path, point: str,
                                                                how: str) -> None:
    armed = tmp_path / "armed"
    t = Tierd(tmp_path, Cold("file", tmp_path), mount=True, TIERD_PERSIST_DELAY="3600",
              TIERD_CRASHPOINT=f"{point}@{armed}")
    t.start()
    try:
        s3 = t.s3()
        versioned(s3)
        v1 = s3.put_object(Bucket=BUCKET, Key="k", Body=OLD)["VersionId"]
        hot = t.data_dir / "hot"
        before = inventory(hot)
        armed.touch()
        _overwrite(t, how)
        assert t.proc is not None
        assert t.proc.wait(30) == -signal.SIGKILL
        t.kill9()  # (detaches the mount)
        armed.unlink()
        t.start()
        s3 = t.s3()
        got = s3.get_object(Bucket=BUCKET, Key="k", VersionId=v1)
        assert got["Body"].read() == OLD and got["ETag"] == _etag(OLD)
        cur = s3.get_object(Bucket=BUCKET, Key="k")  # the change in place never started
        assert cur["Body"].read() == OLD and cur["ETag"] == _etag(OLD)
        vids = [v["VersionId"] for v in s3.list_object_versions(Bucket=BUCKET)["Versions"]]
        if point == "keep.cloned":  # no record, and the clone's data file is gone
            assert vids == [v1]
            assert inventory(hot) == before
        else:
            assert len(vids) == 2 and vids[1] == v1 and cur["VersionId"] == vids[0]
    finally:
        t.stop()
