"""Buckets and listings: bucket calls, owners, ListObjects v1/v2 pagination, delimiters,
URL encoding, ListObjectVersions."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import boto3
import pytest
import requests
from botocore.config import Config

from tierd.acl.keys import canonical_user_id

from .conftest import DOMAIN, ROOT_KEY, ROOT_SECRET, Daemon, assert_error, empty_bucket


def test_bucket_calls(s3: Any) -> None:
    name = f"b-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert s3.head_bucket(Bucket=name)["ResponseMetadata"]["HTTPHeaders"][
        "x-amz-bucket-region"] == "us-east-1"
    assert s3.get_bucket_location(Bucket=name)["LocationConstraint"] is None
    v = s3.get_bucket_versioning(Bucket=name)
    assert "Status" not in v and v["ResponseMetadata"]["HTTPStatusCode"] == 200
    s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Suspended"})
    assert s3.get_bucket_versioning(Bucket=name)["Status"] == "Suspended"
    s3.delete_bucket(Bucket=name)
    assert_error("404", 404, s3.head_bucket, Bucket=name)
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    # a location constraint naming our region is accepted
    s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "us-east-1"})
    s3.delete_bucket(Bucket=name)


def test_owner_is_stable_per_user(s3: Any, alice: Any) -> None:
    owner = s3.list_buckets()["Owner"]
    assert owner == {"ID": canonical_user_id(0), "DisplayName": "root"}
    assert alice.list_buckets()["Owner"] == {"ID": canonical_user_id(1000),
                                             "DisplayName": "alice"}
    name = f"alice-{uuid.uuid4().hex[:8]}"
    alice.create_bucket(Bucket=name)
    try:
        alice.put_object(Bucket=name, Key="k", Body=b"x")
        obj = s3.list_objects(Bucket=name)["Contents"][0]
        assert obj["Owner"]["ID"] == canonical_user_id(1000)
        v2 = s3.list_objects_v2(Bucket=name, FetchOwner=True)["Contents"][0]
        assert v2["Owner"]["DisplayName"] == "alice"
        assert "Owner" not in s3.list_objects_v2(Bucket=name)["Contents"][0]
        # alice sees only her buckets; root sees all
        assert [b["Name"] for b in alice.list_buckets()["Buckets"]] == [name]
        assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    finally:
        empty_bucket(alice, name)


@pytest.fixture(scope="module")
def many(daemon: Daemon) -> Any:
    """A bucket of 1,234 keys in a few directories, built once for the listing tests."""
    s3 = daemon.client()
    name = f"many-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=name)
    keys = [f"flat{i:04d}" for i in range(700)]
    keys += [f"dir{d}/sub/{i:03d}" for d in range(3) for i in range(150)]
    keys += [f"odd/{c}" for c in ("a b", "a+b", "a%b", "ä", "a&b<c>", "tab\tx", "q?x", "h#x")]
    keys += ["zz/deep/a/b/c/d", "zz/e"]
    keys += [f"z{i:03d}" for i in range(74)]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: s3.put_object(Bucket=name, Key=k, Body=k.encode()), keys))
    yield s3, name, sorted(keys)
    empty_bucket(s3, name)


def _collect_v2(s3: Any, **kw: Any) -> tuple[list[str], list[str], int]:
    keys: list[str] = []
    prefixes: list[str] = []
    pages = 0
    for page in s3.get_paginator("list_objects_v2").paginate(**kw):
        pages += 1
        keys += [o["Key"] for o in page.get("Contents", [])]
        prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    return keys, prefixes, pages


def _collect_v1(s3: Any, **kw: Any) -> tuple[list[str], list[str], int]:
    keys: list[str] = []
    prefixes: list[str] = []
    pages = 0
    for page in s3.get_paginator("list_objects").paginate(**kw):
        pages += 1
        keys += [o["Key"] for o in page.get("Contents", [])]
        prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    return keys, prefixes, pages


@pytest.mark.parametrize("collect", [_collect_v1, _collect_v2], ids=["v1", "v2"])
def test_listing_pagination(many: Any, collect: Any) -> None:
    s3, name, keys = many
    got, _, pages = collect(s3, Bucket=name)
    assert got == keys and pages == 2
    got, _, pages = collect(s3, Bucket=name, PaginationConfig={"PageSize": 100})
    assert got == keys and pages == (len(keys) + 99) // 100
    got, _, _ = collect(s3, Bucket=name, Prefix="dir1/", PaginationConfig={"PageSize": 7})
    assert got == [k for k in keys if k.startswith("dir1/")]
    got, prefixes, pages = collect(s3, Bucket=name, Delimiter="/",
                                   PaginationConfig={"PageSize": 50})
    assert prefixes == ["dir0/", "dir1/", "dir2/", "odd/", "zz/"]
    assert got == [k for k in keys if "/" not in k]
    got, prefixes, _ = collect(s3, Bucket=name, Prefix="zz/", Delimiter="/")
    assert got == ["zz/e"] and prefixes == ["zz/deep/"]
    got, prefixes, _ = collect(s3, Bucket=name, Prefix="dir", Delimiter="/sub/",
                               PaginationConfig={"PageSize": 2})
    assert prefixes == ["dir0/sub/", "dir1/sub/", "dir2/sub/"] and got == []


def test_listing_v2_tokens_start_after_and_url_encoding(daemon: Daemon, many: Any) -> None:
    s3, name, keys = many
    r = s3.list_objects_v2(Bucket=name, StartAfter="flat0500", MaxKeys=10)
    assert [o["Key"] for o in r["Contents"]] == [k for k in keys if k > "flat0500"][:10]
    assert r["KeyCount"] == 10 and r["IsTruncated"] and r["StartAfter"] == "flat0500"
    r2 = s3.list_objects_v2(Bucket=name, ContinuationToken=r["NextContinuationToken"],
                            MaxKeys=5)
    assert [o["Key"] for o in r2["Contents"]] == [k for k in keys if k > "flat0500"][10:15]
    assert_error("InvalidArgument", 400, s3.list_objects_v2, Bucket=name,
                 ContinuationToken="!!not-a-token!!")
    # boto3 asks for encoding-type=url and decodes; odd characters come back intact
    r = s3.list_objects_v2(Bucket=name, Prefix="odd/")
    assert [o["Key"] for o in r["Contents"]] == sorted(k for k in keys if k.startswith("odd/"))
    assert r["EncodingType"] == "url"
    # the raw XML is URL-encoded
    url = s3.generate_presigned_url("list_objects_v2", Params={
        "Bucket": name, "Prefix": "odd/a", "EncodingType": "url"})
    body = requests.get(url, timeout=10).text
    assert "<Key>odd/a%20b</Key>" in body and "<Key>odd/a%2Bb</Key>" in body
    assert "<Key>odd/a%26b%3Cc%3E</Key>" in body
    # and plain (escaped) without encoding-type (boto3 adds it unless told not to)
    from botocore.handlers import set_list_objects_encoding_type_url
    plain = daemon.client()
    plain.meta.events.unregister("before-parameter-build.s3.ListObjects",
                                 set_list_objects_encoding_type_url)
    url = plain.generate_presigned_url("list_objects", Params={"Bucket": name,
                                                               "Prefix": "odd/a"})
    assert "encoding-type" not in url
    body = requests.get(url, timeout=10).text
    assert "<Key>odd/a&amp;b&lt;c&gt;</Key>" in body
    r = s3.list_objects(Bucket=name, MaxKeys=0)
    assert "Contents" not in r
    r = s3.list_objects(Bucket=name, Marker="z072")
    assert [o["Key"] for o in r["Contents"]] == ["z073", "zz/deep/a/b/c/d", "zz/e"]


def test_listing_entries(many: Any) -> None:
    s3, name, _ = many
    o = s3.list_objects_v2(Bucket=name, Prefix="flat0001")["Contents"][0]
    assert o["ETag"] == f'"{hashlib.md5(b"flat0001").hexdigest()}"'
    assert o["Size"] == 8 and o["StorageClass"] == "STANDARD"


def test_list_object_versions(many: Any) -> None:
    s3, name, keys = many
    got: list[str] = []
    for page in s3.get_paginator("list_object_versions").paginate(
            Bucket=name, PaginationConfig={"PageSize": 300}):
        for v in page.get("Versions", []):
            assert v["VersionId"] == "null" and v["IsLatest"] is True
            got.append(v["Key"])
        assert "DeleteMarkers" not in page
    assert got == keys
    r = s3.list_object_versions(Bucket=name, Prefix="zz/", Delimiter="/")
    assert [v["Key"] for v in r["Versions"]] == ["zz/e"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["zz/deep/"]
    r = s3.list_object_versions(Bucket=name, KeyMarker="z072", VersionIdMarker="null")
    assert [v["Key"] for v in r["Versions"]] == ["z073", "zz/deep/a/b/c/d", "zz/e"]


def test_healthz_does_not_shadow_a_bucket_named_healthz(daemon: Daemon, s3: Any) -> None:
    r = requests.get(daemon.url + "/healthz", timeout=10)
    assert r.status_code == 200 and r.text.strip() == "ok"
    s3.create_bucket(Bucket="healthz")
    try:
        s3.put_object(Bucket="healthz", Key="k", Body=b"x")
        assert [o["Key"] for o in s3.list_objects(Bucket="healthz")["Contents"]] == ["k"]
        r = requests.get(daemon.url + "/healthz", timeout=10)
        assert r.status_code == 200 and r.text.strip() == "ok"
        r = requests.get(daemon.url + "/healthz?list-type=2", timeout=10)
        assert r.status_code == 403 and "<Code>AccessDenied</Code>" in r.text
    finally:
        empty_bucket(s3, "healthz")


def test_virtual_host_style(daemon: Daemon, s3: Any, bucket: str) -> None:
    """BUCKET.s3.test addressing; the client reaches the daemon through it as a proxy
    (absolute-form requests), so no DNS entry is needed."""
    port = daemon.url.rsplit(":", 1)[1]
    vh = boto3.client(
        "s3", endpoint_url=f"http://{DOMAIN}:{port}", region_name="us-east-1",
        aws_access_key_id=ROOT_KEY, aws_secret_access_key=ROOT_SECRET,
        config=Config(s3={"addressing_style": "virtual"}, proxies={"http": daemon.url},
                      retries={"max_attempts": 1}))
    r = vh.put_object(Bucket=bucket, Key="vh/key.txt", Body=b"virtual")
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert vh.get_object(Bucket=bucket, Key="vh/key.txt")["Body"].read() == b"virtual"
    assert [o["Key"] for o in vh.list_objects_v2(Bucket=bucket)["Contents"]] == ["vh/key.txt"]
    # the same object through path style
    assert s3.get_object(Bucket=bucket, Key="vh/key.txt")["Body"].read() == b"virtual"
    assert vh.head_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert vh.list_buckets()["Owner"]["DisplayName"] == "root"
