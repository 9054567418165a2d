"""Secure defaults of the S3 door: what one key creates without a canned ACL is private to
it, ``public-read``/``public-read-write`` give anonymous requests what S3 clients expect (an
anonymous grant, shown as ``AllUsers``), anonymous requests learn that a bucket or key is
missing only where they could know it, and the admin API reports a bucket's effective
access."""

from __future__ import annotations

import uuid
from typing import Any

import boto3
import pytest
import requests
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

from .conftest import REGION, Daemon, admin_call, assert_error, empty_bucket, new_user

ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"
AUTH_USERS = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers"


@pytest.fixture(scope="module")
def bob(daemon: Daemon) -> Any:
    return new_user(daemon, "bob", 4301)


@pytest.fixture(scope="module")
def anon(daemon: Daemon) -> Any:
    """boto3 without credentials: unsigned requests."""
    return boto3.client("s3", endpoint_url=daemon.url, region_name=REGION,
                        config=Config(signature_version=UNSIGNED,
                                      s3={"addressing_style": "path"},
                                      retries={"max_attempts": 1}))


def _refused(fn: Any, **kw: Any) -> None:
    """403, whether or not the answer could carry an error document (HEAD)."""
    with pytest.raises(ClientError) as info:
        fn(**kw)
    resp = info.value.response
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 403, resp
    assert resp["Error"]["Code"] in ("AccessDenied", "403"), resp


def _grants(acl: dict[str, Any]) -> set[tuple[str, str]]:
    return {(g["Grantee"].get("URI") or g["Grantee"].get("DisplayName", ""), g["Permission"])
            for g in acl["Grants"]}


def test_what_a_key_creates_is_private_to_it(alice: Any, bob: Any, alice_bucket: str) -> None:
    alice.put_object(Bucket=alice_bucket, Key="dir/secret", Body=b"alice's")
    alice.put_object(Bucket=alice_bucket, Key="top", Body=b"alice's too")
    assert alice.get_object(Bucket=alice_bucket, Key="dir/secret")["Body"].read() == b"alice's"
    for key in ("dir/secret", "top"):
        assert_error("AccessDenied", 403, bob.get_object, Bucket=alice_bucket, Key=key)
        _refused(bob.head_object, Bucket=alice_bucket, Key=key)
    assert_error("AccessDenied", 403, bob.list_objects_v2, Bucket=alice_bucket)
    _refused(bob.head_bucket, Bucket=alice_bucket)
    bobs = f"p-{uuid.uuid4().hex[:16]}"
    bob.create_bucket(Bucket=bobs)
    try:
        assert_error("AccessDenied", 403, bob.copy_object, Bucket=bobs, Key="stolen",
                     CopySource={"Bucket": alice_bucket, "Key": "top"})
        up = bob.create_multipart_upload(Bucket=bobs, Key="stolen")
        assert_error("AccessDenied", 403, bob.upload_part_copy, Bucket=bobs, Key="stolen",
                     UploadId=up["UploadId"], PartNumber=1,
                     CopySource={"Bucket": alice_bucket, "Key": "top"})
        bob.abort_multipart_upload(Bucket=bobs, Key="stolen", UploadId=up["UploadId"])
    finally:
        empty_bucket(bob, bobs)
    # GetObjectAcl/GetBucketAcl say so: the owner alone
    assert _grants(alice.get_object_acl(Bucket=alice_bucket, Key="top")) == {("alice",
                                                                         "FULL_CONTROL")}
    assert _grants(alice.get_bucket_acl(Bucket=alice_bucket)) == {("alice", "FULL_CONTROL")}
    # sharing is explicit: authenticated-read on the bucket and the object
    alice.put_bucket_acl(Bucket=alice_bucket, ACL="authenticated-read")
    alice.put_object_acl(Bucket=alice_bucket, Key="top", ACL="authenticated-read")
    assert bob.get_object(Bucket=alice_bucket, Key="top")["Body"].read() == b"alice's too"
    assert_error("AccessDenied", 403, bob.get_object, Bucket=alice_bucket, Key="dir/secret")


def test_public_read_gives_anonymous_requests_read(daemon: Daemon, alice: Any, anon: Any,
                                                   alice_bucket: str) -> None:
    url = f"{daemon.url}/{alice_bucket}"
    alice.put_object(Bucket=alice_bucket, Key="pub/a.txt", Body=b"public", ACL="public-read")
    alice.put_object(Bucket=alice_bucket, Key="pub/private.txt", Body=b"mine")
    # the bucket is private: not even a public-read object is reachable through it
    assert requests.get(f"{url}/pub/a.txt", timeout=10).status_code == 403
    alice.put_bucket_acl(Bucket=alice_bucket, ACL="public-read")
    alice.put_object_acl(Bucket=alice_bucket, Key="pub/", ACL="public-read")  # the prefix too
    r = requests.get(f"{url}/pub/a.txt", timeout=10)
    assert r.status_code == 200 and r.content == b"public"
    assert requests.head(f"{url}/pub/a.txt", timeout=10).status_code == 200
    assert anon.get_object(Bucket=alice_bucket, Key="pub/a.txt")["Body"].read() == b"public"
    assert_error("AccessDenied", 403, anon.get_object, Bucket=alice_bucket, Key="pub/private.txt")
    listed = anon.list_objects_v2(Bucket=alice_bucket, Prefix="pub/")
    assert {o["Key"] for o in listed["Contents"]} == {"pub/a.txt", "pub/private.txt"}
    got = _grants(alice.get_object_acl(Bucket=alice_bucket, Key="pub/a.txt"))
    assert got == {("alice", "FULL_CONTROL"), (AUTH_USERS, "READ"), (ALL_USERS, "READ")}
    # anonymous requests may not write, nor read ACLs (that needs a policy)
    assert requests.put(f"{url}/pub/new", data=b"x", timeout=10).status_code == 403
    assert requests.delete(f"{url}/pub/a.txt", timeout=10).status_code == 403
    assert requests.get(f"{url}/pub/a.txt?acl", timeout=10).status_code == 403
    # making it private again takes the grant away, for anonymous requests too
    alice.put_object_acl(Bucket=alice_bucket, Key="pub/a.txt", ACL="private")
    assert requests.get(f"{url}/pub/a.txt", timeout=10).status_code == 403
    assert (ALL_USERS, "READ") not in _grants(alice.get_object_acl(Bucket=alice_bucket,
                                                                   Key="pub/a.txt"))


def test_public_read_write_lets_anonymous_requests_write(daemon: Daemon, alice: Any,
                                                         anon: Any) -> None:
    name = f"p-{uuid.uuid4().hex[:16]}"
    alice.create_bucket(Bucket=name, ACL="public-read-write")
    try:
        got = _grants(alice.get_bucket_acl(Bucket=name))
        assert {(ALL_USERS, "READ"), (ALL_USERS, "WRITE")} <= got, got
        anon.put_object(Bucket=name, Key="drop/box", Body=b"from nobody", ACL="public-read")
        assert anon.get_object(Bucket=name, Key="drop/box")["Body"].read() == b"from nobody"
        owner = alice.get_object_acl(Bucket=name, Key="drop/box")["Owner"]
        assert owner["ID"] != alice.get_bucket_acl(Bucket=name)["Owner"]["ID"]
        anon.delete_object(Bucket=name, Key="drop/box")
        assert_error("NoSuchKey", 404, alice.get_object, Bucket=name, Key="drop/box")
    finally:
        empty_bucket(alice, name)


def test_anonymous_not_found_only_where_it_could_know(daemon: Daemon, alice: Any,
                                                      alice_bucket: str) -> None:
    url = daemon.url
    r = requests.get(f"{url}/no-such-bucket-{uuid.uuid4().hex[:8]}/k", timeout=10)
    assert r.status_code == 404 and "<Code>NoSuchBucket</Code>" in r.text, r.text
    r = requests.get(f"{url}/no-such-bucket-{uuid.uuid4().hex[:8]}?list-type=2", timeout=10)
    assert r.status_code == 404 and "<Code>NoSuchBucket</Code>" in r.text, r.text
    # a private bucket: whether a key exists is not the caller's to know
    r = requests.get(f"{url}/{alice_bucket}/missing", timeout=10)
    assert r.status_code == 403 and "<Code>AccessDenied</Code>" in r.text, r.text
    alice.put_bucket_acl(Bucket=alice_bucket, ACL="public-read")  # now anyone may list it
    r = requests.get(f"{url}/{alice_bucket}/missing", timeout=10)
    assert r.status_code == 404 and "<Code>NoSuchKey</Code>" in r.text, r.text
    # creating a bucket stays refused to anonymous requests
    r = requests.put(f"{url}/anon-{uuid.uuid4().hex[:8]}", timeout=10)
    assert r.status_code == 403, r.text


def test_admin_api_reports_the_effective_access(daemon: Daemon, alice: Any,
                                                alice_bucket: str) -> None:
    def doc() -> dict[str, Any]:
        out: dict[str, Any] = admin_call(daemon, "GET", f"/v1/buckets/{alice_bucket}")
        return out

    assert (doc()["acl"], doc()["public"]) == ("private", False)
    listed = admin_call(daemon, "GET", "/v1/buckets")["buckets"]
    assert next(b for b in listed if b["name"] == alice_bucket)["acl"] == "private"
    for canned, public in (("public-read", True), ("authenticated-read", False),
                           ("public-read-write", True), ("private", False)):
        alice.put_bucket_acl(Bucket=alice_bucket, ACL=canned)
        assert (doc()["acl"], doc()["public"]) == (canned, public), canned
