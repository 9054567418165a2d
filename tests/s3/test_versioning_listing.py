"""ListObjectVersions on a versioned bucket: order, IsLatest, delete markers, prefixes and
delimiters, and key-marker / version-id-marker paging (boto3, its paginator, minio-py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import minio
import pytest

from s3.test_versioning import wipe

from .conftest import ROOT_KEY, ROOT_SECRET, Daemon, assert_error


@pytest.fixture(scope="module")
def hist(s3: Any) -> Iterator[tuple[str, list[tuple[str, str, bool]]]]:
    """A bucket with a history: (key, version id, is delete marker), newest first per key,
    in key order."""
    name = f"vl-{uuid.uuid4().hex[:14]}"
    s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key="a", Body=b"pre")  # a null version from before
    s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    want: dict[str, list[tuple[str, bool]]] = {"a": [("null", False)]}
    for key, n in (("a", 2), ("b/x", 3), ("b/y", 1), ("c", 2)):
        for i in range(n):
            vid = s3.put_object(Bucket=name, Key=key, Body=f"{key}{i}".encode())["VersionId"]
            want.setdefault(key, []).insert(0, (vid, False))
    m = s3.delete_object(Bucket=name, Key="b/y")["VersionId"]
    want["b/y"].insert(0, (m, True))
    flat = [(k, v, d) for k in sorted(want) for v, d in want[k]]
    yield name, flat
    wipe(s3, name)


def entries(page: dict[str, Any]) -> list[tuple[str, str, bool, bool]]:
    rows = [(v["Key"], v["VersionId"], False, v["IsLatest"]) for v in page.get("Versions", [])]
    rows += [(m["Key"], m["VersionId"], True, m["IsLatest"])
             for m in page.get("DeleteMarkers", [])]
    # boto3 splits versions and markers: put them back in S3's order (version ids of one
    # key sort newest first; the null version is the oldest in these tests)
    return sorted(rows, key=lambda r: (r[0], r[1] == "null", r[1]))


def test_full_listing_order_and_latest(s3: Any, hist: Any) -> None:
    name, flat = hist
    page = s3.list_object_versions(Bucket=name)
    got = entries(page)
    assert [(k, v, d) for k, v, d, _ in got] == flat
    latest = {k: v for k, v, _, is_latest in got if is_latest}
    assert latest == {k: next(v for kk, v, _ in flat if kk == k) for k, _, _ in flat}
    assert page["IsTruncated"] is False
    # versions in one key appear newest first in the document itself
    assert [v["VersionId"] for v in page["Versions"] if v["Key"] == "a"][-1] == "null"
    dm = page["DeleteMarkers"][0]
    assert dm["Key"] == "b/y" and dm["IsLatest"] is True and "Owner" in dm


def test_paging_by_key_and_version_markers(s3: Any, hist: Any) -> None:
    name, flat = hist
    seen: list[tuple[str, str, bool]] = []
    kw: dict[str, Any] = {}
    pages = 0
    while True:
        page = s3.list_object_versions(Bucket=name, MaxKeys=2, **kw)
        pages += 1
        seen += [(k, v, d) for k, v, d, _ in entries(page)]
        if not page["IsTruncated"]:
            break
        kw = {"KeyMarker": page["NextKeyMarker"],
              "VersionIdMarker": page["NextVersionIdMarker"]}
    assert seen == flat and pages == (len(flat) + 1) // 2
    # the paginator does the same
    got = []
    for page in s3.get_paginator("list_object_versions").paginate(
            Bucket=name, PaginationConfig={"PageSize": 3}):
        got += [(k, v, d) for k, v, d, _ in entries(page)]
    assert got == flat
    # a key marker alone starts after every version of that key
    page = s3.list_object_versions(Bucket=name, KeyMarker="b/x")
    assert [k for k, _, _, _ in entries(page)] == [k for k, _, _ in flat if k > "b/x"]


def test_prefix_and_delimiter(s3: Any, hist: Any) -> None:
    name, flat = hist
    page = s3.list_object_versions(Bucket=name, Delimiter="/")
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["b/"]
    assert {k for k, _, _, _ in entries(page)} == {"a", "c"}
    page = s3.list_object_versions(Bucket=name, Prefix="b/", Delimiter="/")
    assert "CommonPrefixes" not in page
    assert [(k, v, d) for k, v, d, _ in entries(page)] == [r for r in flat
                                                           if r[0].startswith("b/")]
    page = s3.list_object_versions(Bucket=name, Delimiter="/", MaxKeys=1, KeyMarker="a",
                                   VersionIdMarker="null")
    assert [p["Prefix"] for p in page.get("CommonPrefixes", [])] == ["b/"]
    assert page["IsTruncated"] is True and page["NextKeyMarker"] == "b/"


def test_listing_errors(s3: Any, hist: Any) -> None:
    name, _ = hist
    assert_error("InvalidArgument", 400, s3.list_object_versions, Bucket=name,
                 VersionIdMarker="null")
    assert_error("InvalidArgument", 400, s3.list_object_versions, Bucket=name,
                 KeyMarker="a", VersionIdMarker="bogus")
    assert_error("NoSuchBucket", 404, s3.list_object_versions, Bucket="no-such-bkt-vl")


def test_minio_lists_versions(daemon: Daemon, hist: Any) -> None:
    name, flat = hist
    mc = minio.Minio(daemon.url.removeprefix("http://"), access_key=ROOT_KEY,
                     secret_key=ROOT_SECRET, secure=False)
    got = [(o.object_name, o.version_id or "null", bool(o.is_delete_marker))
           for o in mc.list_objects(name, recursive=True, include_version=True)]
    assert sorted(got, key=lambda r: (r[0], r[1] == "null", r[1])) == flat  # (as boto3)
    # minio-py reads a version by id
    vid = next(v for k, v, d in flat if k == "c" and not d)
    resp = mc.get_object(name, "c", version_id=vid)
    try:
        assert resp.read() == b"c1"
    finally:
        resp.close()
        resp.release_conn()
