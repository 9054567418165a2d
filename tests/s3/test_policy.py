"""Bucket policies end to end: a real daemon, boto3 and awscli for the policy calls, and plain
unsigned HTTP (requests) for anonymous access.  The daemon listens on 127.0.0.1, so every
request's aws:SourceIp is 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

from .conftest import REGION, ROOT_KEY, ROOT_SECRET, USER_KEY, Daemon, assert_error
from .test_clients import clean_env, runner, tool


def arn(bucket: str, key: str | None = None) -> str:
    return f"arn:aws:s3:::{bucket}" + (f"/{key}" if key is not None else "")


def doc(*statements: dict[str, Any]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


def stmt(effect: str, principal: Any, action: Any, resource: Any,
         **extra: Any) -> dict[str, Any]:
    return {"Effect": effect, "Principal": principal, "Action": action, "Resource": resource,
            **extra}


def anon_get(daemon: Daemon, path: str, **params: str) -> requests.Response:
    return requests.get(f"{daemon.url}/{path}", params=params, timeout=10)


def denied(r: requests.Response) -> None:
    assert r.status_code == 403, r.text
    assert r.headers["Content-Type"].startswith("application/xml")
    assert "<Code>AccessDenied</Code>" in r.text


def share(s3: Any, bucket: str, *keys: str) -> None:
    """Let every signed user read the bucket and ``keys`` through POSIX (objects are private
    to their owner by default)."""
    s3.put_bucket_acl(Bucket=bucket, ACL="authenticated-read")
    for key in keys:
        s3.put_object_acl(Bucket=bucket, Key=key, ACL="authenticated-read")


def test_anonymous_denied_without_a_policy(daemon: Daemon, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="public/a.txt", Body=b"hello")
    denied(anon_get(daemon, f"{bucket}/public/a.txt"))
    denied(anon_get(daemon, bucket, **{"list-type": "2"}))
    denied(anon_get(daemon, ""))  # ListBuckets
    denied(requests.put(f"{daemon.url}/{bucket}/new", data=b"x", timeout=10))
    denied(requests.delete(f"{daemon.url}/{bucket}/public/a.txt", timeout=10))
    denied(requests.put(f"{daemon.url}/anon-bucket-{uuid.uuid4().hex[:8]}", timeout=10))
    # judged key by key, as for a signed caller: the key is refused, the request answered
    r = requests.post(f"{daemon.url}/{bucket}?delete", timeout=10,
                      data=b"<Delete><Object><Key>public/a.txt</Key></Object></Delete>")
    assert r.status_code == 200 and "<Code>AccessDenied</Code>" in r.text, r.text
    denied(anon_get(daemon, bucket, policy=""))
    denied(requests.put(f"{daemon.url}/{bucket}?policy", data=b"{}", timeout=10))
    denied(anon_get(daemon, f"{bucket}/public/a.txt", acl=""))
    # a bare POST on a bucket is a browser form upload that is not a form (AWS's 412); an
    # anonymous form is judged as an anonymous PutObject
    r = requests.post(f"{daemon.url}/{bucket}", timeout=10)
    assert r.status_code == 412 and "<Code>PreconditionFailed</Code>" in r.text, r.text
    denied(requests.post(f"{daemon.url}/{bucket}", timeout=10,
                         files={"key": (None, "anon.txt"), "file": ("a", b"x")}))
    r = requests.head(f"{daemon.url}/{bucket}/public/a.txt", timeout=10)
    assert r.status_code == 403
    assert s3.get_object(Bucket=bucket, Key="public/a.txt")["Body"].read() == b"hello"
    assert "anon.txt" not in [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]


def test_public_read_of_a_prefix(daemon: Daemon, s3: Any, alice: Any, bucket: str) -> None:
    for key in ("public/a.txt", "public/sub/b.txt", "private/c.txt", "publicity.txt"):
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    s3.put_bucket_policy(Bucket=bucket, Policy=doc(
        stmt("Allow", "*", "s3:GetObject", arn(bucket, "public/*"), Sid="PublicRead")))
    for key in ("public/a.txt", "public/sub/b.txt"):
        r = anon_get(daemon, f"{bucket}/{key}")
        assert r.status_code == 200 and r.content == key.encode()
        assert requests.head(f"{daemon.url}/{bucket}/{key}", timeout=10).status_code == 200
    denied(anon_get(daemon, f"{bucket}/private/c.txt"))
    denied(anon_get(daemon, f"{bucket}/publicity.txt"))
    denied(anon_get(daemon, bucket, **{"list-type": "2", "prefix": "public/"}))
    denied(requests.put(f"{daemon.url}/{bucket}/public/new", data=b"x", timeout=10))
    denied(requests.delete(f"{daemon.url}/{bucket}/public/a.txt", timeout=10))
    # a missing key under the public prefix is NoSuchKey for the anonymous reader too
    r = anon_get(daemon, f"{bucket}/public/missing")
    assert r.status_code == 404 and "<Code>NoSuchKey</Code>" in r.text
    # signed users keep their POSIX rights besides
    share(s3, bucket, "private/", "private/c.txt")
    assert alice.get_object(Bucket=bucket, Key="private/c.txt")["Body"].read() == \
        b"private/c.txt"
    denied(anon_get(daemon, f"{bucket}/private/c.txt"))


def test_allow_grants_what_posix_would_not(daemon: Daemon, s3: Any, alice: Any,
                                           bucket: str) -> None:
    """Root's private object (0600) is closed to alice by POSIX; the policy opens reading
    it (and only it, and only reading) to her."""
    s3.put_object(Bucket=bucket, Key="secret/k", Body=b"s", ACL="private")
    s3.put_object(Bucket=bucket, Key="secret/other", Body=b"o", ACL="private")
    assert_error("AccessDenied", 403, alice.get_object, Bucket=bucket, Key="secret/k")
    s3.put_bucket_policy(Bucket=bucket, Policy=doc(
        stmt("Allow", {"AWS": ["arn:aws:iam::000000000000:user/alice"]}, "s3:GetObject",
             arn(bucket, "secret/k"))))
    assert alice.get_object(Bucket=bucket, Key="secret/k")["Body"].read() == b"s"
    assert_error("AccessDenied", 403, alice.get_object, Bucket=bucket, Key="secret/other")
    assert_error("AccessDenied", 403, alice.put_object, Bucket=bucket, Key="secret/k",
                 Body=b"overwrite")
    denied(anon_get(daemon, f"{bucket}/secret/k"))


def test_allow_listing_by_prefix_condition(daemon: Daemon, s3: Any, bucket: str) -> None:
    for key in ("public/a", "public/b", "private/c"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    s3.put_bucket_policy(Bucket=bucket, Policy=doc(
        stmt("Allow", "*", "s3:ListBucket", arn(bucket),
             Condition={"StringLike": {"s3:prefix": "public/*"}})))
    r = anon_get(daemon, bucket, **{"list-type": "2", "prefix": "public/"})
    assert r.status_code == 200, r.text
    assert "<Key>public/a</Key>" in r.text and "<Key>public/b</Key>" in r.text
    assert "private" not in r.text
    denied(anon_get(daemon, bucket, **{"list-type": "2"}))
    denied(anon_get(daemon, bucket, **{"list-type": "2", "prefix": "private/"}))


def test_explicit_deny_of_a_user_beats_posix(s3: Any, alice: Any, bucket: str,
                                            alice_bucket: str) -> None:
    # root's objects, shared with every signed user: POSIX lets alice read them
    s3.put_object(Bucket=bucket, Key="shared/k", Body=b"v")
    s3.put_object(Bucket=bucket, Key="other", Body=b"w")
    share(s3, bucket, "shared/", "shared/k", "other")
    assert alice.get_object(Bucket=bucket, Key="shared/k")["Body"].read() == b"v"
    s3.put_bucket_policy(Bucket=bucket, Policy=doc(
        stmt("Allow", "*", "s3:GetObject", arn(bucket, "*")),
        stmt("Deny", {"AWS": "alice"}, "s3:GetObject", arn(bucket, "shared/*"),
             Sid="NoAlice")))
    resp = assert_error("AccessDenied", 403, alice.get_object, Bucket=bucket, Key="shared/k")
    assert "NoAlice" in resp["Error"]["Message"]
    assert alice.get_object(Bucket=bucket, Key="other")["Body"].read() == b"w"
    assert s3.get_object(Bucket=bucket, Key="shared/k")["Body"].read() == b"v"
    # in her own bucket, a Deny naming her access key stops even the owner's writes, and
    # DeleteObjects is judged key by key
    alice.put_object(Bucket=alice_bucket, Key="keep/x", Body=b"1")
    alice.put_object(Bucket=alice_bucket, Key="free/y", Body=b"2")
    alice.put_bucket_policy(Bucket=alice_bucket, Policy=doc(
        stmt("Deny", {"AWS": [USER_KEY]}, ["s3:PutObject", "s3:DeleteObject"],
             arn(alice_bucket, "keep/*"))))
    assert_error("AccessDenied", 403, alice.put_object, Bucket=alice_bucket, Key="keep/z",
                 Body=b"3")
    out = alice.delete_objects(Bucket=alice_bucket, Delete={"Objects": [
        {"Key": "keep/x"}, {"Key": "free/y"}]})
    assert [e["Key"] for e in out.get("Errors", [])] == ["keep/x"]
    assert out["Errors"][0]["Code"] == "AccessDenied"
    assert [d["Key"] for d in out["Deleted"]] == ["free/y"]
    assert alice.get_object(Bucket=alice_bucket, Key="keep/x")["Body"].read() == b"1"
    # CopyObject is judged on both sides: a denied target stops it
    assert_error("AccessDenied", 403, alice.copy_object, Bucket=alice_bucket, Key="keep/c",
                 CopySource={"Bucket": alice_bucket, "Key": "keep/x"})
    alice.copy_object(Bucket=alice_bucket, Key="free/c",
                      CopySource={"Bucket": alice_bucket, "Key": "keep/x"})


def test_deny_binds_root_but_root_can_repair(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    s3.put_bucket_policy(Bucket=bucket, Policy=doc(
        stmt("Deny", "*", "s3:*", [arn(bucket), arn(bucket, "*")])))
    assert_error("AccessDenied", 403, s3.get_object, Bucket=bucket, Key="k")
    assert_error("AccessDenied", 403, s3.list_objects_v2, Bucket=bucket)
    assert json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])["Statement"]
    s3.delete_bucket_policy(Bucket=bucket)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"


def test_source_ip_condition(daemon: Daemon, s3: Any, alice: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    share(s3, bucket, "k")

    def allow_from(cidr: str | list[str]) -> dict[str, Any]:
        return stmt("Allow", "*", "s3:GetObject", arn(bucket, "*"),
                    Condition={"IpAddress": {"aws:SourceIp": cidr}})

    s3.put_bucket_policy(Bucket=bucket, Policy=doc(allow_from(["127.0.0.0/8", "::1/128"])))
    assert anon_get(daemon, f"{bucket}/k").content == b"v"
    s3.put_bucket_policy(Bucket=bucket, Policy=doc(allow_from("10.0.0.0/8")))
    denied(anon_get(daemon, f"{bucket}/k"))
    # Deny unless from 10/8: alice (from 127.0.0.1) is refused what POSIX allows her

    def deny_unless(cidr: str) -> dict[str, Any]:
        return stmt("Deny", {"AWS": "alice"}, "s3:*", [arn(bucket), arn(bucket, "*")],
                    Condition={"NotIpAddress": {"aws:SourceIp": cidr}})

    s3.put_bucket_policy(Bucket=bucket, Policy=doc(deny_unless("10.0.0.0/8")))
    assert_error("AccessDenied", 403, alice.get_object, Bucket=bucket, Key="k")
    assert_error("AccessDenied", 403, alice.list_objects_v2, Bucket=bucket)
    s3.put_bucket_policy(Bucket=bucket, Policy=doc(deny_unless("127.0.0.0/8")))
    assert alice.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"


def test_anonymous_write_under_a_policy(daemon: Daemon, s3: Any, bucket: str) -> None:
    s3.put_bucket_policy(Bucket=bucket, Policy=doc(
        stmt("Allow", "*", ["s3:PutObject", "s3:GetObject"], arn(bucket, "drop/*"))))
    r = requests.put(f"{daemon.url}/{bucket}/drop/f", data=b"anon", timeout=10)
    assert r.status_code == 200, r.text
    denied(requests.put(f"{daemon.url}/{bucket}/elsewhere", data=b"anon", timeout=10))
    assert s3.get_object(Bucket=bucket, Key="drop/f")["Body"].read() == b"anon"
    owner = s3.list_objects(Bucket=bucket)["Contents"][0]["Owner"]["DisplayName"]
    assert owner in ("nobody", "uid-65534")


def test_policy_round_trip_and_owner_rules(s3: Any, alice: Any, bucket: str,
                                          alice_bucket: str) -> None:
    assert_error("NoSuchBucketPolicy", 404, s3.get_bucket_policy, Bucket=bucket)
    text = doc(stmt("Allow", "*", "s3:GetObject", arn(bucket, "p/*"), Sid="x"))
    s3.put_bucket_policy(Bucket=bucket, Policy=text)
    assert s3.get_bucket_policy(Bucket=bucket)["Policy"] == text
    status = s3.get_bucket_policy_status(Bucket=bucket)["PolicyStatus"]
    assert status["IsPublic"] is True
    # alice does not own the bucket: she may neither read, replace nor delete its policy
    assert_error("AccessDenied", 403, alice.get_bucket_policy, Bucket=bucket)
    assert_error("AccessDenied", 403, alice.put_bucket_policy, Bucket=bucket, Policy=text)
    assert_error("AccessDenied", 403, alice.delete_bucket_policy, Bucket=bucket)
    # ... and she may set one on her own bucket
    mine = doc(stmt("Allow", {"AWS": "bob"}, "s3:GetObject", arn(alice_bucket, "*")))
    alice.put_bucket_policy(Bucket=alice_bucket, Policy=mine)
    assert alice.get_bucket_policy(Bucket=alice_bucket)["Policy"] == mine
    assert alice.get_bucket_policy_status(Bucket=alice_bucket)["PolicyStatus"][
        "IsPublic"] is False
    s3.delete_bucket_policy(Bucket=bucket)
    assert_error("NoSuchBucketPolicy", 404, s3.get_bucket_policy, Bucket=bucket)
    s3.delete_bucket_policy(Bucket=bucket)  # deleting nothing succeeds
    assert_error("NoSuchBucket", 404, s3.put_bucket_policy, Bucket="no-such-bucket-pol",
                 Policy=text)


def test_deleted_bucket_takes_its_policy(s3: Any) -> None:
    name = f"t-{uuid.uuid4().hex[:16]}"
    s3.create_bucket(Bucket=name)
    s3.put_bucket_policy(Bucket=name, Policy=doc(
        stmt("Allow", "*", "s3:GetObject", arn(name, "*"))))
    s3.delete_bucket(Bucket=name)
    s3.create_bucket(Bucket=name)
    try:
        assert_error("NoSuchBucketPolicy", 404, s3.get_bucket_policy, Bucket=name)
    finally:
        s3.delete_bucket(Bucket=name)


@pytest.mark.parametrize(("policy", "words"), [
    ("{not json", "not valid JSON"),
    (doc(stmt("Allow", "*", "s3:GetObjekt", "arn:aws:s3:::B/*")), "unknown action"),
    (doc(stmt("Allow", "*", "s3:GetObject", "arn:aws:s3:::elsewhere/*")), "not in bucket"),
    (doc(stmt("Permit", "*", "s3:GetObject", "arn:aws:s3:::B/*")), "invalid effect"),
    (doc(stmt("Allow", "*", "s3:GetObject", "arn:aws:s3:::B/*",
              Condition={"IpAddress": {"aws:SourceIp": "10.0.0.300/8"}})), "CIDR"),
    (doc(stmt("Allow", "*", "s3:GetObject", "arn:aws:s3:::B/*", Sid="x" * 21000)),
     "20 KiB"),
])
def test_malformed_policy(s3: Any, bucket: str, policy: str, words: str) -> None:
    policy = policy.replace("arn:aws:s3:::B/", f"arn:aws:s3:::{bucket}/")
    resp = assert_error("MalformedPolicy", 400, s3.put_bucket_policy, Bucket=bucket,
                        Policy=policy)
    assert words in resp["Error"]["Message"], resp["Error"]
    assert_error("NoSuchBucketPolicy", 404, s3.get_bucket_policy, Bucket=bucket)


def test_policy_with_awscli(daemon: Daemon, s3: Any, bucket: str, tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = {ROOT_KEY}\n"
                     f"aws_secret_access_key = {ROOT_SECRET}\n")
    env = clean_env(tmp_path)
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_DEFAULT_REGION=REGION, AWS_MAX_ATTEMPTS="1")
    aws = runner(tool("aws"), env, "--endpoint-url", daemon.url)
    s3.put_object(Bucket=bucket, Key="pub/x", Body=b"cli")
    text = doc(stmt("Allow", "*", "s3:GetObject", arn(bucket, "pub/*")))
    (tmp_path / "p.json").write_text(text)
    aws("s3api", "put-bucket-policy", "--bucket", bucket, "--policy",
        f"file://{tmp_path / 'p.json'}")
    got = json.loads(aws("s3api", "get-bucket-policy", "--bucket", bucket))
    assert json.loads(got["Policy"]) == json.loads(text)
    assert anon_get(daemon, f"{bucket}/pub/x").content == b"cli"
    aws("s3api", "delete-bucket-policy", "--bucket", bucket)
    denied(anon_get(daemon, f"{bucket}/pub/x"))
    (tmp_path / "bad.json").write_text('{"Statement": []}')
    r = subprocess.run([tool("aws"), "--endpoint-url", daemon.url, "s3api",
                        "put-bucket-policy", "--bucket", bucket, "--policy",
                        f"file://{tmp_path / 'bad.json'}"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "MalformedPolicy" in r.stderr, r.stderr


def test_presigned_requests_are_judged_as_their_signer(s3: Any, alice: Any, bucket: str
                                                       ) -> None:
    """A presigned URL acts as the key that signed it; s3:authtype tells the forms apart."""
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    share(s3, bucket, "k")
    url = alice.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"})
    assert requests.get(url, timeout=10).content == b"v"
    s3.put_bucket_policy(Bucket=bucket, Policy=doc(
        stmt("Deny", {"AWS": "alice"}, "s3:GetObject", arn(bucket, "*"),
             Condition={"StringEquals": {"s3:authtype": "REST-QUERY-STRING"}})))
    denied(requests.get(url, timeout=10))
    assert alice.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
    root_url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"})
    assert requests.get(root_url, timeout=10).content == b"v"
