"""S3 grants beyond canned ACLs: the ``x-amz-grant-*`` headers on CreateBucket, PutObject,
CopyObject, CreateMultipartUpload, PutBucketAcl and PutObjectAcl, and full
``AccessControlPolicy`` bodies, through boto3, s3cmd (``setacl --acl-public``, a
read-modify-write of the whole policy) and the aws cli.  Each grant must hold for the
grantee through S3, read back through Get*Acl, and never give more than was asked (the
mapping is the table in ``tierd/acl/s3map.py``, documented in docs/permissions.md)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from s3.test_clients import clean_env, runner, tool
from tierd.acl.s3map import ALL_USERS
from tierd.acl.s3map import AUTHENTICATED_USERS as AUTH_USERS

from .conftest import (
    REGION,
    ROOT_KEY,
    ROOT_SECRET,
    Daemon,
    assert_error,
    empty_bucket,
    new_user,
)


@pytest.fixture(scope="module")
def carol(daemon: Daemon) -> Any:
    return new_user(daemon, "carol", 4401)


@pytest.fixture(scope="module")
def dave(daemon: Daemon) -> Any:
    return new_user(daemon, "dave", 4402)


def cid(client: Any) -> str:
    """The canonical id of a client's user (ListBuckets' Owner)."""
    return str(client.list_buckets()["Owner"]["ID"])


def name_of(client: Any) -> str:
    return str(client.list_buckets()["Owner"]["DisplayName"])


def grants(acl: dict[str, Any]) -> set[tuple[str, str]]:
    return {(g["Grantee"].get("URI") or g["Grantee"].get("DisplayName", ""), g["Permission"])
            for g in acl["Grants"]}


@pytest.fixture
def gbucket(s3: Any) -> Iterator[str]:
    name = f"g-{uuid.uuid4().hex[:16]}"
    yield name
    empty_bucket(s3, name)


def test_create_bucket_grant_read_lets_the_grantee_list(s3: Any, carol: Any, dave: Any,
                                                        gbucket: str) -> None:
    s3.create_bucket(Bucket=gbucket, GrantRead=f'id="{cid(carol)}"')
    s3.put_object(Bucket=gbucket, Key="k", Body=b"v", GrantRead=f"id={cid(carol)}")
    assert [o["Key"] for o in carol.list_objects_v2(Bucket=gbucket)["Contents"]] == ["k"]
    assert carol.get_object(Bucket=gbucket, Key="k")["Body"].read() == b"v"
    assert grants(s3.get_bucket_acl(Bucket=gbucket)) == {("root", "FULL_CONTROL"),
                                                         (name_of(carol), "READ")}
    assert grants(s3.get_object_acl(Bucket=gbucket, Key="k")) == {
        ("root", "FULL_CONTROL"), (name_of(carol), "READ")}
    # nothing more than asked: carol cannot write, dave gets nothing
    assert_error("AccessDenied", 403, carol.put_object, Bucket=gbucket, Key="c", Body=b"")
    assert_error("AccessDenied", 403, dave.list_objects_v2, Bucket=gbucket)


def test_bucket_grant_write_lets_the_grantee_create_keys_only(s3: Any, carol: Any,
                                                              gbucket: str) -> None:
    s3.create_bucket(Bucket=gbucket, GrantWrite=f'id="{cid(carol)}"')
    carol.put_object(Bucket=gbucket, Key="from-carol", Body=b"c")
    assert_error("AccessDenied", 403, carol.list_objects_v2, Bucket=gbucket)
    assert grants(s3.get_bucket_acl(Bucket=gbucket)) == {("root", "FULL_CONTROL"),
                                                         (name_of(carol), "WRITE")}


def test_grant_full_control_on_put_bucket_acl(s3: Any, carol: Any, gbucket: str) -> None:
    s3.create_bucket(Bucket=gbucket)
    assert_error("AccessDenied", 403, carol.list_objects_v2, Bucket=gbucket)
    s3.put_bucket_acl(Bucket=gbucket, GrantFullControl=f'id="{cid(carol)}"')
    carol.put_object(Bucket=gbucket, Key="x", Body=b"x")
    carol.list_objects_v2(Bucket=gbucket)
    # FULL_CONTROL's ACP half stays the owner's: read back as READ and WRITE
    assert grants(s3.get_bucket_acl(Bucket=gbucket)) == {
        ("root", "FULL_CONTROL"), (name_of(carol), "READ"), (name_of(carol), "WRITE")}
    assert_error("AccessDenied", 403, carol.put_bucket_acl, Bucket=gbucket, ACL="private")


def test_group_grants_all_users_and_authenticated_users(s3: Any, carol: Any,
                                                         gbucket: str) -> None:
    s3.create_bucket(Bucket=gbucket, GrantRead=f'uri="{ALL_USERS}"')
    s3.put_object(Bucket=gbucket, Key="pub", Body=b"p", GrantRead=f'uri="{ALL_USERS}"')
    s3.put_object(Bucket=gbucket, Key="auth", Body=b"a", GrantRead=f'uri="{AUTH_USERS}"')
    url = f"{s3.meta.endpoint_url}/{gbucket}"
    assert requests.get(f"{url}/pub", timeout=10).content == b"p"
    assert requests.get(f"{url}/auth", timeout=10).status_code == 403
    assert carol.get_object(Bucket=gbucket, Key="auth")["Body"].read() == b"a"
    assert grants(s3.get_object_acl(Bucket=gbucket, Key="pub")) == {
        ("root", "FULL_CONTROL"), (AUTH_USERS, "READ"), (ALL_USERS, "READ")}
    assert grants(s3.get_object_acl(Bucket=gbucket, Key="auth")) == {
        ("root", "FULL_CONTROL"), (AUTH_USERS, "READ")}


def test_several_grantees_in_one_header_and_several_headers(s3: Any, carol: Any, dave: Any,
                                                            gbucket: str) -> None:
    s3.create_bucket(Bucket=gbucket, GrantRead=f'id="{cid(carol)}", id="{cid(dave)}"',
                     GrantWrite=f'id="{cid(dave)}"')
    assert grants(s3.get_bucket_acl(Bucket=gbucket)) == {
        ("root", "FULL_CONTROL"), (name_of(carol), "READ"), (name_of(dave), "READ"),
        (name_of(dave), "WRITE")}
    dave.put_object(Bucket=gbucket, Key="d", Body=b"d")
    assert_error("AccessDenied", 403, carol.put_object, Bucket=gbucket, Key="c", Body=b"")


def test_grants_add_up_with_group_grants(s3: Any, carol: Any, gbucket: str) -> None:
    """A named grant adds to what every signed user gets (POSIX's named entry would
    replace the other bits)."""
    s3.create_bucket(Bucket=gbucket, GrantRead=f'uri="{AUTH_USERS}"',
                     GrantWrite=f'id="{cid(carol)}"')
    carol.put_object(Bucket=gbucket, Key="c", Body=b"c")
    carol.list_objects_v2(Bucket=gbucket)


def test_copy_object_and_multipart_carry_grants(s3: Any, carol: Any, gbucket: str) -> None:
    s3.create_bucket(Bucket=gbucket, GrantRead=f'id="{cid(carol)}"')
    s3.put_object(Bucket=gbucket, Key="src", Body=b"s")
    assert_error("AccessDenied", 403, carol.get_object, Bucket=gbucket, Key="src")
    s3.copy_object(Bucket=gbucket, Key="copy", CopySource={"Bucket": gbucket, "Key": "src"},
                   GrantRead=f'id="{cid(carol)}"')
    assert carol.get_object(Bucket=gbucket, Key="copy")["Body"].read() == b"s"
    up = s3.create_multipart_upload(Bucket=gbucket, Key="mpu", GrantRead=f'uri="{AUTH_USERS}"')
    part = s3.upload_part(Bucket=gbucket, Key="mpu", UploadId=up["UploadId"], PartNumber=1,
                          Body=b"m" * 10)
    s3.complete_multipart_upload(Bucket=gbucket, Key="mpu", UploadId=up["UploadId"],
                                 MultipartUpload={"Parts": [
                                     {"PartNumber": 1, "ETag": part["ETag"]}]})
    assert carol.get_object(Bucket=gbucket, Key="mpu")["Body"].read() == b"m" * 10
    assert (AUTH_USERS, "READ") in grants(s3.get_object_acl(Bucket=gbucket, Key="mpu"))


def test_read_acp_grants_nothing_more(s3: Any, carol: Any, gbucket: str) -> None:
    s3.create_bucket(Bucket=gbucket)
    s3.put_object(Bucket=gbucket, Key="k", Body=b"v", GrantReadACP=f'id="{cid(carol)}"')
    assert grants(s3.get_object_acl(Bucket=gbucket, Key="k")) == {("root", "FULL_CONTROL")}


def test_write_acp_to_another_user_is_not_implemented(s3: Any, carol: Any,
                                                      gbucket: str) -> None:
    s3.create_bucket(Bucket=gbucket)
    assert_error("NotImplemented", 501, s3.put_object, Bucket=gbucket, Key="k", Body=b"v",
                 GrantWriteACP=f'id="{cid(carol)}"')
    # to the owner itself it changes nothing and is accepted
    s3.put_object(Bucket=gbucket, Key="k", Body=b"v", GrantWriteACP=f'id="{cid(s3)}"')


def test_email_grantee_is_a_clear_error(s3: Any, gbucket: str) -> None:
    s3.create_bucket(Bucket=gbucket)
    resp = assert_error("UnresolvableGrantByEmailAddress", 400, s3.put_object, Bucket=gbucket,
                        Key="k", Body=b"v", GrantRead='emailAddress="x@example.com"')
    assert "e-mail" in resp["Error"]["Message"]
    assert "Contents" not in s3.list_objects_v2(Bucket=gbucket)  # nothing was stored


def test_unknown_id_and_bad_grants_are_invalid_argument(s3: Any, gbucket: str) -> None:
    s3.create_bucket(Bucket=gbucket)
    for value in ('id="' + "0" * 64 + '"', 'uri="http://acs.amazonaws.com/groups/s3/'
                  'LogDelivery"', "nonsense", 'color="red"', ""):
        assert_error("InvalidArgument", 400, s3.put_object, Bucket=gbucket, Key="k",
                     Body=b"v", GrantRead=value)
    name = f"g-{uuid.uuid4().hex[:16]}"
    assert_error("InvalidArgument", 400, s3.create_bucket, Bucket=name,
                 GrantRead='id="' + "1" * 64 + '"')
    assert_error("InvalidRequest", 400, s3.put_object, Bucket=gbucket, Key="k", Body=b"v",
                 ACL="public-read", GrantRead=f'uri="{ALL_USERS}"')
    assert "Contents" not in s3.list_objects_v2(Bucket=gbucket)


def test_put_object_acl_body_with_grants_round_trips(s3: Any, carol: Any, dave: Any,
                                                     gbucket: str) -> None:
    s3.create_bucket(Bucket=gbucket, GrantRead=f'uri="{AUTH_USERS}"')
    s3.put_object(Bucket=gbucket, Key="k", Body=b"v")
    owner = s3.get_object_acl(Bucket=gbucket, Key="k")["Owner"]
    policy = {"Owner": owner, "Grants": [
        {"Grantee": {"Type": "CanonicalUser", "ID": owner["ID"]}, "Permission": "FULL_CONTROL"},
        {"Grantee": {"Type": "CanonicalUser", "ID": cid(carol)}, "Permission": "READ"},
        {"Grantee": {"Type": "CanonicalUser", "ID": cid(dave)}, "Permission": "WRITE"}]}
    s3.put_object_acl(Bucket=gbucket, Key="k", AccessControlPolicy=policy)
    got = s3.get_object_acl(Bucket=gbucket, Key="k")
    assert grants(got) == {("root", "FULL_CONTROL"), (name_of(carol), "READ"),
                           (name_of(dave), "WRITE")}
    assert carol.get_object(Bucket=gbucket, Key="k")["Body"].read() == b"v"
    assert_error("AccessDenied", 403, dave.get_object, Bucket=gbucket, Key="k")
    # what Get answered, put back, changes nothing (clients edit ACLs that way)
    s3.put_object_acl(Bucket=gbucket, Key="k", AccessControlPolicy={
        "Owner": got["Owner"], "Grants": got["Grants"]})
    assert grants(s3.get_object_acl(Bucket=gbucket, Key="k")) == grants(got)
    # only the owner may change it; another owner in the body is refused
    assert_error("AccessDenied", 403, carol.put_object_acl, Bucket=gbucket, Key="k",
                 AccessControlPolicy=policy)
    other = {"Owner": {"ID": cid(carol)}, "Grants": policy["Grants"]}
    assert_error("InvalidArgument", 400, s3.put_object_acl, Bucket=gbucket, Key="k",
                 AccessControlPolicy=other)


def test_put_bucket_acl_body_with_group_and_user(s3: Any, carol: Any, gbucket: str) -> None:
    s3.create_bucket(Bucket=gbucket)
    owner = s3.get_bucket_acl(Bucket=gbucket)["Owner"]
    s3.put_bucket_acl(Bucket=gbucket, AccessControlPolicy={"Owner": owner, "Grants": [
        {"Grantee": {"Type": "Group", "URI": AUTH_USERS}, "Permission": "READ"},
        {"Grantee": {"Type": "CanonicalUser", "ID": cid(carol)}, "Permission": "WRITE"}]})
    assert grants(s3.get_bucket_acl(Bucket=gbucket)) == {
        ("root", "FULL_CONTROL"), (AUTH_USERS, "READ"), (name_of(carol), "READ"),
        (name_of(carol), "WRITE")}  # carol's WRITE adds to what every signed user reads
    carol.put_object(Bucket=gbucket, Key="c", Body=b"c")
    email = {"Owner": owner, "Grants": [
        {"Grantee": {"Type": "AmazonCustomerByEmail", "EmailAddress": "a@b.c"},
         "Permission": "READ"}]}
    assert_error("UnresolvableGrantByEmailAddress", 400, s3.put_bucket_acl, Bucket=gbucket,
                 AccessControlPolicy=email)


def test_put_object_acl_grant_headers(s3: Any, carol: Any, gbucket: str) -> None:
    s3.create_bucket(Bucket=gbucket, GrantRead=f'uri="{AUTH_USERS}"')
    s3.put_object(Bucket=gbucket, Key="k", Body=b"v")
    assert_error("AccessDenied", 403, carol.get_object, Bucket=gbucket, Key="k")
    s3.put_object_acl(Bucket=gbucket, Key="k", GrantRead=f'id="{cid(carol)}"')
    assert carol.get_object(Bucket=gbucket, Key="k")["Body"].read() == b"v"
    s3.put_object_acl(Bucket=gbucket, Key="k", ACL="private")
    assert_error("AccessDenied", 403, carol.get_object, Bucket=gbucket, Key="k")


def _s3cmd(daemon: Daemon, tmp_path: Path) -> Callable[..., str]:
    host = daemon.url.removeprefix("http://")
    cfg = tmp_path / "s3cfg"
    cfg.write_text(f"[default]\naccess_key = {ROOT_KEY}\nsecret_key = {ROOT_SECRET}\n"
                   f"host_base = {host}\nhost_bucket = {host}\nuse_https = False\n"
                   f"bucket_location = {REGION}\n")
    return runner(tool("s3cmd"), clean_env(tmp_path), "-c", str(cfg), "--no-progress")


def test_s3cmd_setacl_public_and_grant(daemon: Daemon, s3: Any, carol: Any, gbucket: str,
                                       tmp_path: Path) -> None:
    run = _s3cmd(daemon, tmp_path)
    s3.create_bucket(Bucket=gbucket, ACL="public-read")
    s3.put_object(Bucket=gbucket, Key="f.txt", Body=b"hello")
    url = f"{daemon.url}/{gbucket}/f.txt"
    assert requests.get(url, timeout=10).status_code == 403
    run("setacl", "--acl-public", f"s3://{gbucket}/f.txt")
    assert requests.get(url, timeout=10).content == b"hello"
    run("setacl", "--acl-private", f"s3://{gbucket}/f.txt")
    assert requests.get(url, timeout=10).status_code == 403
    run("setacl", f"--acl-grant=read:{cid(carol)}", f"s3://{gbucket}/f.txt")
    assert carol.get_object(Bucket=gbucket, Key="f.txt")["Body"].read() == b"hello"
    info = run("info", f"s3://{gbucket}/f.txt")
    assert "READ" in info and name_of(carol) in info, info


def test_aws_cli_grants(daemon: Daemon, s3: Any, carol: Any, gbucket: str,
                        tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    env.update(AWS_ACCESS_KEY_ID=ROOT_KEY, AWS_SECRET_ACCESS_KEY=ROOT_SECRET,
               AWS_DEFAULT_REGION=REGION)

    aws = runner(tool("aws"), env, "--endpoint-url", daemon.url, "s3api")

    aws("create-bucket", "--bucket", gbucket, "--grant-read", f"id={cid(carol)}")
    (tmp_path / "b").write_bytes(b"cli")
    aws("put-object", "--bucket", gbucket, "--key", "k", "--body", str(tmp_path / "b"),
        "--grant-read", f"uri={AUTH_USERS}")
    assert carol.get_object(Bucket=gbucket, Key="k")["Body"].read() == b"cli"
    aws("put-object-acl", "--bucket", gbucket, "--key", "k", "--grant-full-control",
        f"id={cid(carol)}")
    assert grants(s3.get_object_acl(Bucket=gbucket, Key="k")) == {
        ("root", "FULL_CONTROL"), (name_of(carol), "READ"), (name_of(carol), "WRITE")}
