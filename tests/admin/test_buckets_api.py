"""Buckets and bucket policies through the admin API (a real daemon): the listing, and
policies that the S3 door enforces on its next request and validates the same way; plus
``/v1/tiers`` and ``/v1/mounts``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from botocore.exceptions import ClientError

from tierd.acl.policy import MAX_POLICY_BYTES

from .conftest import Admin, start_admin


def public_read(bucket: str, prefix: str = "pub/") -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": [{
        "Sid": "PublicRead", "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
        "Resource": f"arn:aws:s3:::{bucket}/{prefix}*"}]}


def put_policy(admin: Admin, bucket: str, body: bytes) -> tuple[int, Any]:
    return admin.call("PUT", f"/v1/buckets/{bucket}/policy", body=body,
                      headers={"Content-Type": "application/json"})


def test_buckets_are_listed_with_owner_and_policy(admin: Admin) -> None:
    s3 = admin.d.client()
    s3.create_bucket(Bucket="listed-one")
    status, user = admin.call("POST", "/v1/users", {"name": "bea", "uid": 4242})
    assert status == 201, user
    status, key = admin.call("POST", "/v1/keys", {"user": "bea"})
    assert status == 201
    bea = admin.d.client(key["access_key"], key["secret"])
    bea.create_bucket(Bucket="listed-two")
    before = time.time()

    status, doc = admin.call("GET", "/v1/buckets")
    assert status == 200, doc
    by_name = {b["name"]: b for b in doc["buckets"]}
    assert [b["name"] for b in doc["buckets"]] == sorted(by_name)
    one, two = by_name["listed-one"], by_name["listed-two"]
    assert one["owner_uid"] == 0 and one["owner"] == "root"
    assert two["owner_uid"] == 4242 and two["owner"] == "bea"
    assert two["policy"] is False and two["public"] is False and two["acl"] == "private"
    assert two["created"].endswith("Z") and two["created_ns"] / 1e9 <= before + 1
    status, single = admin.call("GET", "/v1/buckets/listed-two")
    assert status == 200 and single == two
    status, err = admin.call("GET", "/v1/buckets/no-such-bucket-here")
    assert status == 404 and err["error"] == "no_such_bucket"


def test_policy_put_here_is_enforced_by_the_s3_door(admin: Admin) -> None:
    s3 = admin.d.client()
    s3.create_bucket(Bucket="pol-enforced")
    s3.put_object(Bucket="pol-enforced", Key="pub/a.txt", Body=b"public bytes")
    anon = f"{admin.d.url}/pol-enforced/pub/a.txt"
    assert requests.get(anon, timeout=10).status_code == 403

    status, err = admin.call("GET", "/v1/buckets/pol-enforced/policy")
    assert status == 404 and err["error"] == "no_such_policy", err
    policy = public_read("pol-enforced")
    status, doc = put_policy(admin, "pol-enforced", json.dumps(policy).encode())
    assert status == 200, doc
    assert doc == {"bucket": "pol-enforced", "policy": policy, "public": True}
    r = requests.get(anon, timeout=10)
    assert r.status_code == 200 and r.content == b"public bytes"
    # the S3 door reads the very text stored here, and the listing says so
    assert json.loads(s3.get_bucket_policy(Bucket="pol-enforced")["Policy"]) == policy
    status, listing = admin.call("GET", "/v1/buckets")
    b = next(b for b in listing["buckets"] if b["name"] == "pol-enforced")
    assert b["policy"] is True and b["public"] is True
    status, got = admin.call("GET", "/v1/buckets/pol-enforced/policy")
    assert status == 200 and got == doc

    status, gone = admin.call("DELETE", "/v1/buckets/pol-enforced/policy")
    assert status == 200 and gone == {"bucket": "pol-enforced", "deleted": True}
    assert requests.get(anon, timeout=10).status_code == 403
    with pytest.raises(ClientError):
        s3.get_bucket_policy(Bucket="pol-enforced")
    status, again = admin.call("DELETE", "/v1/buckets/pol-enforced/policy")
    assert status == 200 and again["deleted"] is False


@pytest.mark.parametrize("policy", [
    b"not json",
    b"[]",
    json.dumps({"Statement": []}).encode(),
    json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
        "Resource": "arn:aws:s3:::some-other-bucket/*"}]}).encode(),
    json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Maybe", "Principal": "*", "Action": "s3:GetObject",
        "Resource": "arn:aws:s3:::pol-bad/*"}]}).encode(),
    b" " * (MAX_POLICY_BYTES + 1),
])
def test_malformed_policies_get_the_s3_doors_message(admin: Admin, policy: bytes) -> None:
    s3 = admin.d.client()
    try:
        s3.create_bucket(Bucket="pol-bad")
    except ClientError as e:
        assert e.response["Error"]["Code"] == "BucketAlreadyOwnedByYou"
    status, err = put_policy(admin, "pol-bad", policy)
    assert status == 400 and err["error"] == "malformed_policy", err
    with pytest.raises(ClientError) as info:
        s3.put_bucket_policy(Bucket="pol-bad", Policy=policy.decode())
    assert info.value.response["Error"]["Code"] == "MalformedPolicy"
    message = info.value.response["Error"]["Message"]
    if len(policy) > MAX_POLICY_BYTES:  # S3 stops reading at the limit: its own words
        assert "20 KiB" in message and "20 KiB" in err["message"]
    else:
        assert message == err["message"]
    status, _ = admin.call("GET", "/v1/buckets/pol-bad/policy")
    assert status == 404  # nothing stored


def test_policy_of_a_missing_bucket_is_404(admin: Admin) -> None:
    body = json.dumps(public_read("pol-missing")).encode()
    for method in ("GET", "PUT", "DELETE"):
        status, err = admin.call(method, "/v1/buckets/pol-missing/policy",
                                 body=body if method == "PUT" else None)
        assert status == 404 and err["error"] == "no_such_bucket", (method, err)
    status, _ = admin.call("GET", "/v1/buckets", token=None)
    assert status == 401


def test_tiers_report_capacity_use_and_hits(admin: Admin) -> None:
    s3 = admin.d.client()
    s3.create_bucket(Bucket="tier-stats")
    payload = os.urandom(300_000)
    s3.put_object(Bucket="tier-stats", Key="x", Body=payload)
    for _ in range(3):
        assert s3.get_object(Bucket="tier-stats", Key="x")["Body"].read() == payload
    status, doc = admin.call("GET", "/v1/tiers")
    assert status == 200, doc
    tiers = {t["name"]: t for t in doc["tiers"]}
    assert {"hot", "cold"} <= set(tiers)
    hot = tiers["hot"]
    assert hot["capacity"] > 0 and hot["used"] >= len(payload)
    assert hot["free"] == max(0, hot["capacity"] - hot["used"])
    assert hot["hits"] >= 1 and hot["hits"] == doc["hits"]  # reads served from hot
    assert 0 < doc["hit_ratio"] <= 1
    assert tiers["cold"]["reachable"] is True and tiers["cold"]["url"].startswith("file://")
    assert doc["dirty"] >= 0 and doc["dirty_limit"] > 0
    if "mem" in tiers:
        assert tiers["mem"]["capacity"] >= tiers["mem"]["used"] >= 0


def test_mounts_without_and_with_a_mount(admin: Admin, tmp_path: Path) -> None:
    status, doc = admin.call("GET", "/v1/mounts")
    assert status == 200 and doc == {"mounts": []}
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is missing: no FUSE here")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = start_admin(tmp_path / "data", "--mount", str(mnt))
    try:
        status, doc = mounted.call("GET", "/v1/mounts")
        assert status == 200
        assert doc == {"mounts": [{"door": "fuse", "mountpoint": str(mnt), "source": "/"}]}
    finally:
        mounted.d.stop()
