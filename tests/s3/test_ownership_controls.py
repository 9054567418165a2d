"""BucketOwnershipControls (Get/Put/Delete) and what each rule does to a write: under
BucketOwnerEnforced ACLs are disabled and every object written belongs to the bucket's
owner; under BucketOwnerPreferred a write with ``bucket-owner-full-control`` gives the
object to the bucket's owner; ObjectWriter (and no rule) keeps the writer as owner.
Ownership is the POSIX owner (docs/permissions.md), read back as GetObjectAcl's Owner."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import requests

from s3.test_clients import aws  # noqa: F401  (the fixture)

from .conftest import Daemon, assert_error, new_user


def rule(name: str) -> dict[str, Any]:
    return {"Rules": [{"ObjectOwnership": name}]}


@pytest.fixture(scope="module")
def frank(daemon: Daemon) -> Any:
    return new_user(daemon, "frank", 4601)


def owner_name(client: Any, bucket: str, key: str) -> str:
    return str(client.get_object_acl(Bucket=bucket, Key=key)["Owner"]["DisplayName"])


def writable_by(alice: Any, bucket: str, other: Any) -> None:
    """Let ``other`` write (and list) alice's bucket."""
    cid = other.list_buckets()["Owner"]["ID"]
    alice.put_bucket_acl(Bucket=bucket, GrantFullControl=f'id="{cid}"')


def test_get_without_one_is_404(alice: Any, alice_bucket: str) -> None:
    assert_error("OwnershipControlsNotFoundError", 404, alice.get_bucket_ownership_controls,
                 Bucket=alice_bucket)


def test_put_get_delete_round_trip(alice: Any, alice_bucket: str) -> None:
    for name in ("BucketOwnerEnforced", "BucketOwnerPreferred", "ObjectWriter"):
        alice.put_bucket_ownership_controls(Bucket=alice_bucket, OwnershipControls=rule(name))
        got = alice.get_bucket_ownership_controls(Bucket=alice_bucket)["OwnershipControls"]
        assert got == rule(name)
    alice.delete_bucket_ownership_controls(Bucket=alice_bucket)
    assert_error("OwnershipControlsNotFoundError", 404, alice.get_bucket_ownership_controls,
                 Bucket=alice_bucket)


def test_malformed_rule_and_other_users(alice: Any, frank: Any, alice_bucket: str) -> None:
    assert_error("MalformedXML", 400, alice.put_bucket_ownership_controls,
                 Bucket=alice_bucket, OwnershipControls=rule("Everyone"))
    assert_error("MalformedXML", 400, alice.put_bucket_ownership_controls,
                 Bucket=alice_bucket, OwnershipControls={"Rules": []})
    assert_error("AccessDenied", 403, frank.put_bucket_ownership_controls,
                 Bucket=alice_bucket, OwnershipControls=rule("BucketOwnerEnforced"))
    assert_error("NoSuchBucket", 404, alice.get_bucket_ownership_controls,
                 Bucket="no-such-bkt-x2")


def test_enforced_disables_acls(alice: Any, alice_bucket: str) -> None:
    alice.put_object(Bucket=alice_bucket, Key="k", Body=b"v")
    alice.put_bucket_ownership_controls(Bucket=alice_bucket,
                                        OwnershipControls=rule("BucketOwnerEnforced"))
    for acl in ("public-read", "authenticated-read", "bucket-owner-read"):
        assert_error("AccessControlListNotSupported", 400, alice.put_object_acl,
                     Bucket=alice_bucket, Key="k", ACL=acl)
        assert_error("AccessControlListNotSupported", 400, alice.put_object,
                     Bucket=alice_bucket, Key="n", Body=b"x", ACL=acl)
    assert_error("AccessControlListNotSupported", 400, alice.put_bucket_acl,
                 Bucket=alice_bucket, ACL="public-read")
    assert_error("AccessControlListNotSupported", 400, alice.put_object, Bucket=alice_bucket,
                 Key="n", Body=b"x",
                 GrantRead='uri="http://acs.amazonaws.com/groups/global/AuthenticatedUsers"')
    # what amounts to the bucket owner's full control is still accepted, and ACLs read
    alice.put_object_acl(Bucket=alice_bucket, Key="k", ACL="bucket-owner-full-control")
    alice.put_object_acl(Bucket=alice_bucket, Key="k", ACL="private")
    alice.put_bucket_acl(Bucket=alice_bucket, ACL="private")
    alice.put_object(Bucket=alice_bucket, Key="m", Body=b"x", ACL="bucket-owner-full-control")
    alice.get_object_acl(Bucket=alice_bucket, Key="k")


def test_enforced_gives_objects_to_the_bucket_owner(alice: Any, frank: Any,
                                                    alice_bucket: str) -> None:
    writable_by(alice, alice_bucket, frank)
    frank.put_object(Bucket=alice_bucket, Key="before", Body=b"b")
    assert owner_name(alice, alice_bucket, "before") != "alice"
    alice.put_bucket_ownership_controls(Bucket=alice_bucket,
                                        OwnershipControls=rule("BucketOwnerEnforced"))
    frank.put_object(Bucket=alice_bucket, Key="after", Body=b"a")
    assert owner_name(alice, alice_bucket, "after") == "alice"
    frank.copy_object(Bucket=alice_bucket, Key="copied",
                      CopySource={"Bucket": alice_bucket, "Key": "before"})
    assert owner_name(alice, alice_bucket, "copied") == "alice"
    up = frank.create_multipart_upload(Bucket=alice_bucket, Key="mpu")
    part = frank.upload_part(Bucket=alice_bucket, Key="mpu", UploadId=up["UploadId"],
                             PartNumber=1, Body=b"m")
    frank.complete_multipart_upload(Bucket=alice_bucket, Key="mpu", UploadId=up["UploadId"],
                                    MultipartUpload={"Parts": [
                                        {"PartNumber": 1, "ETag": part["ETag"]}]})
    assert owner_name(alice, alice_bucket, "mpu") == "alice"
    # the bucket owner can read what others wrote; the writer gave it away (private)
    assert alice.get_object(Bucket=alice_bucket, Key="after")["Body"].read() == b"a"
    assert_error("AccessDenied", 403, frank.get_object, Bucket=alice_bucket, Key="after")


def test_preferred_with_bucket_owner_full_control(alice: Any, frank: Any,
                                                  alice_bucket: str) -> None:
    writable_by(alice, alice_bucket, frank)
    alice.put_bucket_ownership_controls(Bucket=alice_bucket,
                                        OwnershipControls=rule("BucketOwnerPreferred"))
    frank.put_object(Bucket=alice_bucket, Key="given", Body=b"g",
                     ACL="bucket-owner-full-control")
    assert owner_name(alice, alice_bucket, "given") == "alice"
    frank.put_object(Bucket=alice_bucket, Key="kept", Body=b"k")
    assert owner_name(alice, alice_bucket, "kept") != "alice"
    frank.put_object(Bucket=alice_bucket, Key="pub", Body=b"p", ACL="public-read")  # ACLs work
    assert owner_name(alice, alice_bucket, "pub") != "alice"


def test_object_writer_keeps_the_writer(alice: Any, frank: Any, alice_bucket: str) -> None:
    writable_by(alice, alice_bucket, frank)
    alice.put_bucket_ownership_controls(Bucket=alice_bucket,
                                        OwnershipControls=rule("ObjectWriter"))
    frank.put_object(Bucket=alice_bucket, Key="w", Body=b"w", ACL="bucket-owner-full-control")
    assert owner_name(alice, alice_bucket, "w") != "alice"
    # bucket-owner-full-control gives alice access without ownership
    assert alice.get_object(Bucket=alice_bucket, Key="w")["Body"].read() == b"w"


def test_create_bucket_object_ownership_header(s3: Any) -> None:
    name = f"o-{uuid.uuid4().hex[:16]}"
    assert_error("NotImplemented", 501, s3.create_bucket, Bucket=name,
                 ObjectOwnership="BucketOwnerEnforced")
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.create_bucket(Bucket=name, ObjectOwnership="ObjectWriter")  # what it is anyway
    s3.delete_bucket(Bucket=name)


def test_enforced_covers_browser_form_uploads(alice: Any, frank: Any,
                                              alice_bucket: str) -> None:
    writable_by(alice, alice_bucket, frank)
    alice.put_bucket_ownership_controls(Bucket=alice_bucket,
                                        OwnershipControls=rule("BucketOwnerEnforced"))
    p = frank.generate_presigned_post(alice_bucket, "form", ExpiresIn=60)
    r = requests.post(p["url"], data=p["fields"], files={"file": ("f", b"x")}, timeout=30)
    assert r.status_code == 204, r.text
    assert owner_name(alice, alice_bucket, "form") == "alice"
    p = frank.generate_presigned_post(alice_bucket, "pub", Fields={"acl": "public-read"},
                                      Conditions=[{"acl": "public-read"}], ExpiresIn=60)
    r = requests.post(p["url"], data=p["fields"], files={"file": ("f", b"x")}, timeout=30)
    assert r.status_code == 400 and "AccessControlListNotSupported" in r.text, r.text


def test_aws_cli_put_get_delete(aws: Callable[..., str], s3: Any,  # noqa: F811
                                bucket: str) -> None:
    """The second client: ``aws s3api`` sets, reads and deletes the rule, and the rule it
    set is enforced (BucketOwnerEnforced refuses ACLs)."""
    aws("s3api", "put-bucket-ownership-controls", "--bucket", bucket,
        "--ownership-controls", json.dumps({"Rules": [{"ObjectOwnership":
                                                       "BucketOwnerEnforced"}]}))
    got = json.loads(aws("s3api", "get-bucket-ownership-controls", "--bucket", bucket))
    assert got["OwnershipControls"]["Rules"] == [{"ObjectOwnership": "BucketOwnerEnforced"}]
    assert_error("AccessControlListNotSupported", 400, s3.put_bucket_acl, Bucket=bucket,
                 ACL="public-read")
    aws("s3api", "delete-bucket-ownership-controls", "--bucket", bucket)
    assert_error("OwnershipControlsNotFoundError", 404, s3.get_bucket_ownership_controls,
                 Bucket=bucket)
