"""PublicAccessBlock (Get/Put/DeletePublicAccessBlock) and its enforcement by the one
decision function: BlockPublicAcls refuses public ACLs and grants, IgnorePublicAcls takes
the anonymous grants away, BlockPublicPolicy refuses public policies, RestrictPublicBuckets
confines a public policy to signed users; GetBucketPolicyStatus follows.  Anonymous
requests are sent unsigned (``requests``, boto3 without credentials)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import requests
from botocore import UNSIGNED

from s3.test_clients import aws  # noqa: F401  (the fixture)
from tierd.acl.s3map import ALL_USERS
from tierd.acl.s3map import AUTHENTICATED_USERS as AUTH_USERS

from .conftest import Daemon, assert_error, new_user

ALL_ON = {"BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True,
          "RestrictPublicBuckets": True}


def block(**flags: bool) -> dict[str, bool]:
    return {k: flags.get(k, False) for k in ALL_ON}


@pytest.fixture(scope="module")
def erin(daemon: Daemon) -> Any:
    return new_user(daemon, "erin", 4501)


@pytest.fixture(scope="module")
def anon(daemon: Daemon) -> Any:
    """Unsigned requests through boto3."""
    return daemon.client(signature_version=UNSIGNED)


def public_policy(bucket: str, condition: dict[str, Any] | None = None) -> str:
    st: dict[str, Any] = {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                          "Resource": f"arn:aws:s3:::{bucket}/*"}
    if condition:
        st["Condition"] = condition
    return json.dumps({"Version": "2012-10-17", "Statement": [st]})


def test_get_without_one_is_404(alice: Any, alice_bucket: str) -> None:
    assert_error("NoSuchPublicAccessBlockConfiguration", 404,
                 alice.get_public_access_block, Bucket=alice_bucket)


def test_put_get_delete_round_trip(alice: Any, alice_bucket: str) -> None:
    alice.put_public_access_block(Bucket=alice_bucket, PublicAccessBlockConfiguration=block(
        BlockPublicAcls=True, RestrictPublicBuckets=True))
    got = alice.get_public_access_block(Bucket=alice_bucket)["PublicAccessBlockConfiguration"]
    assert got == block(BlockPublicAcls=True, RestrictPublicBuckets=True)
    alice.put_public_access_block(Bucket=alice_bucket, PublicAccessBlockConfiguration=ALL_ON)
    got = alice.get_public_access_block(Bucket=alice_bucket)["PublicAccessBlockConfiguration"]
    assert got == ALL_ON
    alice.delete_public_access_block(Bucket=alice_bucket)
    assert_error("NoSuchPublicAccessBlockConfiguration", 404,
                 alice.get_public_access_block, Bucket=alice_bucket)
    alice.delete_public_access_block(Bucket=alice_bucket)  # again: still 204


def test_malformed_and_missing_bucket(daemon: Daemon, alice: Any, alice_bucket: str) -> None:
    def bad_body(params: Any, **kw: Any) -> None:
        params["body"] = (b'<PublicAccessBlockConfiguration><BlockPublicAcls>yes'
                          b'</BlockPublicAcls></PublicAccessBlockConfiguration>')

    client = daemon.client()
    client.meta.events.register("before-call.s3.PutPublicAccessBlock", bad_body)
    assert_error("MalformedXML", 400, client.put_public_access_block, Bucket=alice_bucket,
                 PublicAccessBlockConfiguration=ALL_ON)
    assert_error("NoSuchBucket", 404, alice.get_public_access_block, Bucket="no-such-bkt-x1")


def test_only_the_owner_manages_it(alice: Any, erin: Any, anon: Any,
                                   alice_bucket: str) -> None:
    assert_error("AccessDenied", 403, erin.put_public_access_block, Bucket=alice_bucket,
                 PublicAccessBlockConfiguration=ALL_ON)
    alice.put_public_access_block(Bucket=alice_bucket, PublicAccessBlockConfiguration=ALL_ON)
    assert_error("AccessDenied", 403, erin.get_public_access_block, Bucket=alice_bucket)
    assert_error("AccessDenied", 403, anon.get_public_access_block, Bucket=alice_bucket)
    assert_error("AccessDenied", 403, erin.delete_public_access_block, Bucket=alice_bucket)
    alice.delete_public_access_block(Bucket=alice_bucket)


def test_block_public_acls_refuses_public_acls_and_grants(alice: Any,
                                                         alice_bucket: str) -> None:
    alice.put_object(Bucket=alice_bucket, Key="k", Body=b"v")
    alice.put_public_access_block(Bucket=alice_bucket,
                                  PublicAccessBlockConfiguration=block(BlockPublicAcls=True))
    for acl in ("public-read", "public-read-write", "authenticated-read"):
        assert_error("AccessDenied", 403, alice.put_object, Bucket=alice_bucket, Key="n",
                     Body=b"x", ACL=acl)
        assert_error("AccessDenied", 403, alice.put_object_acl, Bucket=alice_bucket, Key="k",
                     ACL=acl)
    assert_error("AccessDenied", 403, alice.put_bucket_acl, Bucket=alice_bucket,
                 ACL="public-read")
    assert_error("AccessDenied", 403, alice.put_object, Bucket=alice_bucket, Key="n",
                 Body=b"x", GrantRead=f'uri="{ALL_USERS}"')
    assert_error("AccessDenied", 403, alice.copy_object, Bucket=alice_bucket, Key="n",
                 CopySource={"Bucket": alice_bucket, "Key": "k"}, ACL="public-read")
    assert_error("AccessDenied", 403, alice.create_multipart_upload, Bucket=alice_bucket,
                 Key="n", GrantRead=f'uri="{AUTH_USERS}"')
    owner = alice.get_object_acl(Bucket=alice_bucket, Key="k")["Owner"]
    assert_error("AccessDenied", 403, alice.put_object_acl, Bucket=alice_bucket, Key="k",
                 AccessControlPolicy={"Owner": owner, "Grants": [
                     {"Grantee": {"Type": "Group", "URI": ALL_USERS}, "Permission": "READ"}]})
    keys = [o["Key"] for o in alice.list_objects_v2(Bucket=alice_bucket)["Contents"]]
    assert keys == ["k"]
    # private ACLs and grants to users are not public
    alice.put_object(Bucket=alice_bucket, Key="p", Body=b"x", ACL="private")
    alice.put_object_acl(Bucket=alice_bucket, Key="k", ACL="bucket-owner-full-control")
    alice.delete_public_access_block(Bucket=alice_bucket)
    alice.put_object_acl(Bucket=alice_bucket, Key="k", ACL="public-read")


def test_ignore_public_acls_takes_the_anonymous_grant_away(alice: Any, anon: Any,
                                                          alice_bucket: str) -> None:
    alice.put_bucket_acl(Bucket=alice_bucket, ACL="public-read")
    alice.put_object(Bucket=alice_bucket, Key="pub", Body=b"p", ACL="public-read")
    url = f"{alice.meta.endpoint_url}/{alice_bucket}/pub"
    assert requests.get(url, timeout=10).content == b"p"
    anon.list_objects_v2(Bucket=alice_bucket)
    alice.put_public_access_block(Bucket=alice_bucket,
                                  PublicAccessBlockConfiguration=block(IgnorePublicAcls=True))
    r = requests.get(url, timeout=10)
    assert r.status_code == 403 and "IgnorePublicAcls" in r.text
    assert_error("AccessDenied", 403, anon.list_objects_v2, Bucket=alice_bucket)
    # signed users keep what the ACL gives them; a policy still lets anonymous requests in
    assert alice.get_object(Bucket=alice_bucket, Key="pub")["Body"].read() == b"p"
    alice.put_bucket_policy(Bucket=alice_bucket, Policy=public_policy(alice_bucket))
    assert requests.get(url, timeout=10).content == b"p"
    alice.delete_bucket_policy(Bucket=alice_bucket)
    alice.delete_public_access_block(Bucket=alice_bucket)
    assert requests.get(url, timeout=10).content == b"p"


def test_block_public_policy_refuses_public_policies(alice: Any, alice_bucket: str) -> None:
    alice.put_public_access_block(Bucket=alice_bucket,
                                  PublicAccessBlockConfiguration=block(BlockPublicPolicy=True))
    assert_error("AccessDenied", 403, alice.put_bucket_policy, Bucket=alice_bucket,
                 Policy=public_policy(alice_bucket))
    assert_error("NoSuchBucketPolicy", 404, alice.get_bucket_policy, Bucket=alice_bucket)
    # a conditional one is not public
    alice.put_bucket_policy(Bucket=alice_bucket, Policy=public_policy(
        alice_bucket, {"IpAddress": {"aws:SourceIp": "10.9.9.0/24"}}))
    alice.delete_public_access_block(Bucket=alice_bucket)


def test_restrict_public_buckets_confines_a_public_policy(alice: Any, erin: Any,
                                                          alice_bucket: str) -> None:
    alice.put_bucket_acl(Bucket=alice_bucket, ACL="public-read")
    alice.put_object(Bucket=alice_bucket, Key="k", Body=b"v")  # private: the policy opens it
    alice.put_bucket_policy(Bucket=alice_bucket, Policy=public_policy(alice_bucket))
    url = f"{alice.meta.endpoint_url}/{alice_bucket}/k"
    assert requests.get(url, timeout=10).content == b"v"
    assert erin.get_object(Bucket=alice_bucket, Key="k")["Body"].read() == b"v"
    status = alice.get_bucket_policy_status(Bucket=alice_bucket)["PolicyStatus"]
    assert status["IsPublic"] is True
    alice.put_public_access_block(Bucket=alice_bucket, PublicAccessBlockConfiguration=block(
        RestrictPublicBuckets=True))
    r = requests.get(url, timeout=10)
    assert r.status_code == 403 and "RestrictPublicBuckets" in r.text
    # a signed user of this server is still a principal the policy allows
    assert erin.get_object(Bucket=alice_bucket, Key="k")["Body"].read() == b"v"
    status = alice.get_bucket_policy_status(Bucket=alice_bucket)["PolicyStatus"]
    assert status["IsPublic"] is False
    alice.delete_public_access_block(Bucket=alice_bucket)
    assert requests.get(url, timeout=10).content == b"v"


def test_restrict_public_buckets_also_stops_the_anonymous_grant(alice: Any, anon: Any,
                                                                alice_bucket: str) -> None:
    alice.put_bucket_acl(Bucket=alice_bucket, ACL="public-read")
    alice.put_object(Bucket=alice_bucket, Key="pub", Body=b"p", ACL="public-read")
    alice.put_bucket_policy(Bucket=alice_bucket, Policy=public_policy(alice_bucket))
    alice.put_public_access_block(Bucket=alice_bucket, PublicAccessBlockConfiguration=block(
        RestrictPublicBuckets=True))
    assert_error("AccessDenied", 403, anon.list_objects_v2, Bucket=alice_bucket)
    url = f"{alice.meta.endpoint_url}/{alice_bucket}/pub"
    assert requests.get(url, timeout=10).status_code == 403
    alice.delete_bucket_policy(Bucket=alice_bucket)  # no public policy: the ACL decides
    assert requests.get(url, timeout=10).content == b"p"
    alice.delete_public_access_block(Bucket=alice_bucket)


def test_policy_status_without_a_policy_is_not_public(alice: Any, alice_bucket: str) -> None:
    status = alice.get_bucket_policy_status(Bucket=alice_bucket)["PolicyStatus"]
    assert status["IsPublic"] is False


def test_block_public_acls_covers_browser_form_uploads(alice: Any, alice_bucket: str) -> None:
    """The ACL of a POST form (its ``acl`` field) is refused like x-amz-acl."""
    alice.put_public_access_block(Bucket=alice_bucket,
                                  PublicAccessBlockConfiguration=block(BlockPublicAcls=True))
    p = alice.generate_presigned_post(alice_bucket, "form", Fields={"acl": "public-read"},
                                      Conditions=[{"acl": "public-read"}], ExpiresIn=60)
    r = requests.post(p["url"], data=p["fields"], files={"file": ("f", b"x")}, timeout=30)
    assert r.status_code == 403 and "BlockPublicAcls" in r.text, r.text
    p = alice.generate_presigned_post(alice_bucket, "form", Fields={"acl": "private"},
                                      Conditions=[{"acl": "private"}], ExpiresIn=60)
    r = requests.post(p["url"], data=p["fields"], files={"file": ("f", b"x")}, timeout=30)
    assert r.status_code == 204, r.text
    alice.delete_public_access_block(Bucket=alice_bucket)


def test_admin_api_policy_of_a_blocked_bucket_without_a_policy(daemon: Daemon, alice: Any,
                                                                alice_bucket: str) -> None:
    """The admin API reads the bucket's own policy, not the block's placeholder."""
    alice.put_public_access_block(Bucket=alice_bucket, PublicAccessBlockConfiguration=ALL_ON)
    doc = json.loads((daemon.data_dir / "endpoints.json").read_text())
    token = (daemon.data_dir / "admin-token").read_text().strip()
    r = requests.get(f"{doc['admin']['url']}/v1/buckets/{alice_bucket}/policy", timeout=10,
                     headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 404, r.text
    alice.delete_public_access_block(Bucket=alice_bucket)


def test_aws_cli_put_get_delete(aws: Callable[..., str], s3: Any,  # noqa: F811
                                bucket: str) -> None:
    """The second client: ``aws s3api`` sets, reads and deletes the block, and the block it
    set is enforced (a public canned ACL is refused)."""
    aws("s3api", "put-public-access-block", "--bucket", bucket,
        "--public-access-block-configuration", json.dumps(block(BlockPublicAcls=True)))
    got = json.loads(aws("s3api", "get-public-access-block", "--bucket", bucket))
    assert got["PublicAccessBlockConfiguration"] == block(BlockPublicAcls=True)
    assert_error("AccessDenied", 403, s3.put_bucket_acl, Bucket=bucket, ACL="public-read")
    aws("s3api", "delete-public-access-block", "--bucket", bucket)
    assert_error("NoSuchPublicAccessBlockConfiguration", 404, s3.get_public_access_block,
                 Bucket=bucket)
