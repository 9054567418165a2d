"""ListBuckets paging (``max-buckets``, ``continuation-token``, ``prefix``,
``bucket-region``) through boto3, its paginator and the AWS CLI; an empty
``continuation-token`` on ListObjectsV2; CreateBucket of a bucket that already exists."""

from __future__ import annotations

import json
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from .conftest import (
    ROOT_KEY,
    ROOT_SECRET,
    Daemon,
    add_user_key,
    assert_error,
    empty_bucket,
    start_daemon,
)
from .test_auth import send, signed
from .test_clients import aws  # noqa: F401  (the AWS CLI fixture)

NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


@pytest.fixture(scope="module")
def named(daemon: Daemon) -> Iterator[tuple[str, list[str]]]:
    """Seven buckets under one unique prefix (other tests' buckets share the daemon)."""
    s3 = daemon.client()
    prefix = f"lbp{uuid.uuid4().hex[:6]}-"
    names = [f"{prefix}{i:02d}" for i in range(7)]
    for n in names:
        s3.create_bucket(Bucket=n)
    yield prefix, names
    for n in names:
        empty_bucket(s3, n)


def test_max_buckets_pages_with_continuation_token(s3: Any,
                                                   named: tuple[str, list[str]]) -> None:
    prefix, names = named
    got: list[str] = []
    kw: dict[str, Any] = {"MaxBuckets": 3, "Prefix": prefix}
    pages = 0
    while True:
        r = s3.list_buckets(**kw)
        pages += 1
        assert len(r["Buckets"]) <= 3
        assert r["Prefix"] == prefix
        got += [b["Name"] for b in r["Buckets"]]
        if "ContinuationToken" not in r:
            break
        kw["ContinuationToken"] = r["ContinuationToken"]
    assert got == names and pages == 3


def test_last_full_page_has_no_token(s3: Any, named: tuple[str, list[str]]) -> None:
    prefix, names = named
    r = s3.list_buckets(MaxBuckets=7, Prefix=prefix)
    assert [b["Name"] for b in r["Buckets"]] == names
    assert "ContinuationToken" not in r


def test_paginator_walks_every_bucket(s3: Any, named: tuple[str, list[str]]) -> None:
    prefix, names = named
    pages = list(s3.get_paginator("list_buckets").paginate(
        Prefix=prefix, PaginationConfig={"PageSize": 2}))
    assert [len(p["Buckets"]) for p in pages] == [2, 2, 2, 1]
    assert [b["Name"] for p in pages for b in p["Buckets"]] == names


def test_bucket_region_filter(s3: Any, named: tuple[str, list[str]]) -> None:
    prefix, names = named
    here = s3.list_buckets(Prefix=prefix, BucketRegion="us-east-1")["Buckets"]
    assert [b["Name"] for b in here] == names
    assert all(b["BucketRegion"] == "us-east-1" for b in here)
    assert s3.list_buckets(Prefix=prefix, BucketRegion="eu-west-1")["Buckets"] == []


def _list(daemon: Daemon, query: str) -> Any:
    return send(signed(daemon, "GET", "/?" + query)[0])


@pytest.mark.parametrize("value", ["0", "10001", "-1", "ten"])
def test_max_buckets_out_of_range_is_invalid_argument(daemon: Daemon, value: str) -> None:
    r = _list(daemon, f"max-buckets={value}")
    assert r.status_code == 400, r.text
    doc = ET.fromstring(r.content)
    assert doc.findtext("Code") == "InvalidArgument"
    assert doc.findtext("ArgumentName") == "max-buckets"


def test_max_buckets_bounds_are_accepted(daemon: Daemon) -> None:
    for value in ("1", "10000"):
        assert _list(daemon, f"max-buckets={value}").status_code == 200


def test_bad_continuation_token_is_invalid_argument(daemon: Daemon) -> None:
    r = _list(daemon, "continuation-token=%25%25notbase64")
    assert r.status_code == 400 and b"InvalidArgument" in r.content


def test_empty_continuation_token_on_list_buckets_is_absent(
        daemon: Daemon, named: tuple[str, list[str]]) -> None:
    prefix, names = named
    r = _list(daemon, f"continuation-token=&prefix={prefix}")
    assert r.status_code == 200, r.text
    doc = ET.fromstring(r.content)
    assert [e.text for e in doc.iter(NS + "Name")] == names


def test_alice_pages_only_her_buckets(alice: Any, named: tuple[str, list[str]]) -> None:
    prefix, _ = named
    assert alice.list_buckets(Prefix=prefix, MaxBuckets=1)["Buckets"] == []


def test_aws_cli_list_buckets_pages(aws: Callable[..., str],  # noqa: F811
                                    named: tuple[str, list[str]]) -> None:
    prefix, names = named
    page = json.loads(aws("s3api", "list-buckets", "--no-paginate", "--max-buckets", "4",
                          "--prefix", prefix, "--output", "json"))
    assert [b["Name"] for b in page["Buckets"]] == names[:4]
    rest = json.loads(aws("s3api", "list-buckets", "--no-paginate", "--prefix", prefix,
                          "--continuation-token", page["ContinuationToken"],
                          "--output", "json"))
    assert [b["Name"] for b in rest["Buckets"]] == names[4:]
    assert "ContinuationToken" not in rest
    # the CLI's own pagination (page size 2) gathers the same list
    every = json.loads(aws("s3api", "list-buckets", "--prefix", prefix, "--page-size", "2",
                           "--output", "json"))
    assert [b["Name"] for b in every["Buckets"]] == names


def test_empty_continuation_token_on_list_objects_v2_is_absent(
        daemon: Daemon, s3: Any, bucket: str) -> None:
    for k in ("a", "b"):
        s3.put_object(Bucket=bucket, Key=k, Body=b"x")
    r = send(signed(daemon, "GET", f"/{bucket}?list-type=2&continuation-token=")[0])
    assert r.status_code == 200, r.text
    doc = ET.fromstring(r.content)
    assert [e.text for e in doc.iter(NS + "Key")] == ["a", "b"]
    assert doc.find(NS + "ContinuationToken") is None


# -- CreateBucket of an existing bucket ---------------------------------------------------

def test_create_own_bucket_again_in_us_east_1_is_200(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="keep", Body=b"x")
    r = s3.create_bucket(Bucket=bucket)
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert r["Location"] == "/" + bucket
    # untouched: its objects stay
    assert s3.get_object(Bucket=bucket, Key="keep")["Body"].read() == b"x"


def test_create_own_bucket_again_with_canned_acl_applies_it(s3: Any, bucket: str) -> None:
    s3.create_bucket(Bucket=bucket, ACL="public-read")
    grants = s3.get_bucket_acl(Bucket=bucket)["Grants"]
    assert any(g["Grantee"].get("URI", "").endswith("/AllUsers")
               and g["Permission"] == "READ" for g in grants), grants


def test_create_another_owners_bucket_is_409_already_exists(alice: Any, bucket: str) -> None:
    assert_error("BucketAlreadyExists", 409, alice.create_bucket, Bucket=bucket)


def _regional(d: Daemon, key: str, secret: str) -> Any:
    return boto3.client("s3", endpoint_url=d.url, aws_access_key_id=key,
                        aws_secret_access_key=secret, region_name="eu-west-1",
                        config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                                      retries={"max_attempts": 1}))


def test_create_own_bucket_again_outside_us_east_1_is_409(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    add_user_key(data_dir, "TIERDREGIONALICE", "tierd-region-alice-secret-0123456789", 1000,
                 "alice")
    d = start_daemon(data_dir, "--region", "eu-west-1")
    try:
        s3 = _regional(d, ROOT_KEY, ROOT_SECRET)
        name = f"r-{uuid.uuid4().hex[:12]}"
        cfg = {"LocationConstraint": "eu-west-1"}
        s3.create_bucket(Bucket=name, CreateBucketConfiguration=cfg)
        assert_error("BucketAlreadyOwnedByYou", 409, s3.create_bucket, Bucket=name,
                     CreateBucketConfiguration=cfg)
        other = _regional(d, "TIERDREGIONALICE", "tierd-region-alice-secret-0123456789")
        assert_error("BucketAlreadyExists", 409, other.create_bucket, Bucket=name,
                     CreateBucketConfiguration=cfg)
    finally:
        d.stop()
