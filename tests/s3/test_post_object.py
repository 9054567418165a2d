"""POST object (tierd/s3/post_object.py): browser form uploads signed by boto3's
``generate_presigned_post`` (SigV4, and SigV2: botocore's default for a custom endpoint) and
by forms built here, the policy's conditions, the size limits, the answers, and the errors."""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
import requests
from botocore.config import Config

from s3.conftest import (
    REGION,
    ROOT_KEY,
    ROOT_SECRET,
    USER_KEY,
    USER_SECRET,
    Daemon,
    start_daemon,
)
from tierd.s3.auth import signing_key

MiB = 1 << 20


def code(r: requests.Response) -> str:
    return r.text.split("<Code>")[1].split("</Code>")[0]


def form(bucket: str, conditions: list[Any], fields: dict[str, str], *,
         key: str = ROOT_KEY, secret: str = ROOT_SECRET, expires_in: int = 300,
         policy: dict[str, Any] | None = None) -> dict[str, str]:
    """Form fields with a SigV4-signed policy of ``conditions`` (plus the bucket and the
    signature fields, as boto3 writes them)."""
    now = datetime.datetime.now(datetime.UTC)
    date = now.strftime("%Y%m%d")
    cred = f"{key}/{date}/{REGION}/s3/aws4_request"
    sig = {"x-amz-algorithm": "AWS4-HMAC-SHA256", "x-amz-credential": cred,
           "x-amz-date": now.strftime("%Y%m%dT%H%M%SZ")}
    doc = policy or {
        "expiration": (now + datetime.timedelta(seconds=expires_in)).strftime(
            "%Y-%m-%dT%H:%M:%S.000Z"),
        "conditions": [{"bucket": bucket}, *conditions, *({k: v} for k, v in sig.items())]}
    encoded = base64.b64encode(json.dumps(doc).encode()).decode()
    signature = hmac.new(signing_key(secret, date, REGION), encoded.encode(),
                         hashlib.sha256).hexdigest()
    return {**fields, **sig, "policy": encoded, "x-amz-signature": signature}


def post(daemon: Daemon, bucket: str, fields: dict[str, str], data: bytes = b"content",
         filename: str = "photo.jpg", **kw: Any) -> requests.Response:
    return requests.post(f"{daemon.url}/{bucket}", data=fields, timeout=60,
                         files={"file": (filename, data, "application/octet-stream")},
                         allow_redirects=False, **kw)


def test_boto3_presigned_post_sigv4(daemon: Daemon, s3: Any, bucket: str) -> None:
    p = s3.generate_presigned_post(bucket, "up/k.txt", ExpiresIn=60)
    assert "x-amz-signature" in p["fields"]
    r = requests.post(p["url"], data=p["fields"], files={"file": ("k.txt", b"hello form")},
                      timeout=30)
    assert r.status_code == 204, r.text
    assert r.headers["ETag"] == f'"{hashlib.md5(b"hello form").hexdigest()}"'
    assert s3.get_object(Bucket=bucket, Key="up/k.txt")["Body"].read() == b"hello form"


def test_boto3_default_presigned_post_is_sigv2(daemon: Daemon, s3: Any, bucket: str) -> None:
    c = boto3.client("s3", endpoint_url=daemon.url, aws_access_key_id=ROOT_KEY,
                     aws_secret_access_key=ROOT_SECRET, region_name=REGION,
                     config=Config(retries={"max_attempts": 1}))
    p = c.generate_presigned_post(bucket, "v2", ExpiresIn=60)
    assert "AWSAccessKeyId" in p["fields"] and "signature" in p["fields"]
    r = requests.post(p["url"], data=p["fields"], files={"file": ("f", b"v2 form")},
                      timeout=30)
    assert r.status_code == 204, r.text
    assert s3.get_object(Bucket=bucket, Key="v2")["Body"].read() == b"v2 form"
    bad = dict(p["fields"], signature="AAAA" + p["fields"]["signature"][4:])
    r = requests.post(p["url"], data=bad, files={"file": ("f", b"x")}, timeout=30)
    assert (r.status_code, code(r)) == (403, "SignatureDoesNotMatch")


def test_minio_presigned_post_policy(daemon: Daemon, s3: Any, bucket: str) -> None:
    import minio
    from minio.datatypes import PostPolicy

    mc = minio.Minio(daemon.url.removeprefix("http://"), access_key=ROOT_KEY,
                     secret_key=ROOT_SECRET, secure=False, region=REGION)
    policy = PostPolicy(bucket, datetime.datetime.now(datetime.UTC)
                        + datetime.timedelta(minutes=5))
    policy.add_starts_with_condition("key", "minio/")
    policy.add_starts_with_condition("Content-Type", "text/")
    policy.add_content_length_range_condition(1, 1024)
    fields = mc.presigned_post_policy(policy)
    r = requests.post(f"{daemon.url}/{bucket}", timeout=30,
                      data={**fields, "key": "minio/${filename}", "Content-Type": "text/plain"},
                      files={"file": ("note.txt", b"from minio-py")})
    assert r.status_code == 204, r.text
    got = s3.get_object(Bucket=bucket, Key="minio/note.txt")
    assert got["Body"].read() == b"from minio-py" and got["ContentType"] == "text/plain"
    r = requests.post(f"{daemon.url}/{bucket}", timeout=30,
                      data={**fields, "key": "elsewhere", "Content-Type": "text/plain"},
                      files={"file": ("note.txt", b"x")})
    assert (r.status_code, code(r)) == (403, "AccessDenied")


def test_success_action_status_and_redirect(daemon: Daemon, s3: Any, bucket: str) -> None:
    f = form(bucket, [{"key": "a"}, {"success_action_status": "201"}],
             {"key": "a", "success_action_status": "201"})
    r = post(daemon, bucket, f, b"one")
    assert r.status_code == 201, r.text
    assert "<Key>a</Key>" in r.text and f"<Bucket>{bucket}</Bucket>" in r.text
    assert hashlib.md5(b"one").hexdigest() in r.text and "<PostResponse" in r.text
    f = form(bucket, [{"key": "b"}, {"success_action_status": "200"}],
             {"key": "b", "success_action_status": "200"})
    r = post(daemon, bucket, f)
    assert r.status_code == 200 and r.content == b""
    target = "https://app.example.com/done?x=1"
    f = form(bucket, [{"key": "c"}, ["starts-with", "$success_action_redirect", "https://"]],
             {"key": "c", "success_action_redirect": target})
    r = post(daemon, bucket, f, b"three")
    assert r.status_code == 303, r.text
    loc = urlsplit(r.headers["Location"])
    assert loc.netloc == "app.example.com" and loc.path == "/done"
    q = parse_qs(loc.query)
    assert q["x"] == ["1"] and q["bucket"] == [bucket] and q["key"] == ["c"]
    assert q["etag"] == [f'"{hashlib.md5(b"three").hexdigest()}"']


def test_filename_metadata_content_type_and_acl(daemon: Daemon, s3: Any, bucket: str) -> None:
    f = form(bucket, [["starts-with", "$key", "uploads/"],
                      ["starts-with", "$Content-Type", "image/"], {"x-amz-meta-owner": "eve"},
                      {"acl": "public-read"}],
             {"key": "uploads/${filename}", "Content-Type": "image/jpeg",
              "x-amz-meta-owner": "eve", "acl": "public-read"})
    r = post(daemon, bucket, f, b"jpeg bytes", filename="cat.jpg")
    assert r.status_code == 204, r.text
    h = s3.head_object(Bucket=bucket, Key="uploads/cat.jpg")
    assert h["ContentType"] == "image/jpeg" and h["Metadata"] == {"owner": "eve"}
    grants = s3.get_object_acl(Bucket=bucket, Key="uploads/cat.jpg")["Grants"]
    assert any(g["Grantee"].get("URI", "").endswith("AllUsers") for g in grants)


def test_tagging_field_and_version_id(daemon: Daemon, s3: Any, bucket: str) -> None:
    tagging = ("<Tagging><TagSet><Tag><Key>team</Key><Value>a b&amp;c</Value></Tag>"
               "</TagSet></Tagging>")
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    f = form(bucket, [{"key": "t"}, {"tagging": tagging}], {"key": "t", "tagging": tagging})
    r = post(daemon, bucket, f)
    assert r.status_code == 204, r.text
    vid = r.headers["x-amz-version-id"]
    assert s3.head_object(Bucket=bucket, Key="t")["VersionId"] == vid
    assert s3.get_object_tagging(Bucket=bucket, Key="t")["TagSet"] == [
        {"Key": "team", "Value": "a b&c"}]
    bad = "<Tagging><TagSet>" + "".join(
        f"<Tag><Key>k{i}</Key><Value>v</Value></Tag>" for i in range(11)) + "</TagSet></Tagging>"
    f = form(bucket, [{"key": "t2"}, {"tagging": bad}], {"key": "t2", "tagging": bad})
    assert code(post(daemon, bucket, f)) == "InvalidTag"


def test_content_length_range(daemon: Daemon, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="sized", Body=b"old")
    f = form(bucket, [{"key": "sized"}, ["content-length-range", 10, 100]], {"key": "sized"})
    r = post(daemon, bucket, f, b"x" * 101)
    assert (r.status_code, code(r)) == (400, "EntityTooLarge")
    r = post(daemon, bucket, f, b"x" * 9)
    assert (r.status_code, code(r)) == (400, "EntityTooSmall")
    assert s3.get_object(Bucket=bucket, Key="sized")["Body"].read() == b"old"  # untouched
    assert post(daemon, bucket, f, b"x" * 100).status_code == 204
    assert s3.get_object(Bucket=bucket, Key="sized")["ContentLength"] == 100


def test_policy_refusals(daemon: Daemon, s3: Any, bucket: str) -> None:
    f = form(bucket, [{"key": "k"}], {"key": "k"}, expires_in=-60)
    r = post(daemon, bucket, f)
    assert (r.status_code, code(r)) == (403, "AccessDenied") and "Policy expired" in r.text
    f = form(bucket, [["starts-with", "$key", "mine/"]], {"key": "theirs/k"})
    r = post(daemon, bucket, f)
    assert (r.status_code, code(r)) == (403, "AccessDenied")
    assert "Policy Condition failed" in r.text and "starts-with" in r.text
    f = form(bucket, [["eq", "$key", "k"]], {"key": "other"})
    assert code(post(daemon, bucket, f)) == "AccessDenied"
    f = form(bucket, [{"key": "k"}], {"key": "k", "x-amz-meta-sneaky": "1"})
    r = post(daemon, bucket, f)
    assert (r.status_code, code(r)) == (403, "AccessDenied")
    assert "Extra input fields: x-amz-meta-sneaky" in r.text
    f = form("another-bucket", [{"key": "k"}], {"key": "k"})  # a policy for another bucket
    assert code(post(daemon, bucket, f)) == "AccessDenied"
    f = form(bucket, [{"key": "k"}], {"key": "k"})
    f["x-amz-signature"] = "0" * 64
    assert (post(daemon, bucket, f).status_code, code(post(daemon, bucket, f))) == (
        403, "SignatureDoesNotMatch")
    f = form(bucket, [{"key": "k"}], {"key": "k"})
    del f["x-amz-signature"]
    assert code(post(daemon, bucket, f)) == "InvalidArgument"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys == []  # nothing was stored


def test_malformed_forms(daemon: Daemon, bucket: str) -> None:
    f = form(bucket, [{"key": "k"}], {})
    r = post(daemon, bucket, f)
    assert (r.status_code, code(r)) == (400, "InvalidArgument") and "'key'" in r.text
    r = requests.post(f"{daemon.url}/{bucket}", timeout=10,
                      files={"key": (None, "k"), "policy": (None, "x")})  # no file
    assert (r.status_code, code(r)) == (400, "InvalidArgument")
    r = requests.post(f"{daemon.url}/{bucket}", data=b"not a form", timeout=10,
                      headers={"Content-Type": "text/plain"})
    assert (r.status_code, code(r)) == (412, "PreconditionFailed")
    r = requests.post(f"{daemon.url}/{bucket}", data=b"--xx\r\ngarbage", timeout=10,
                      headers={"Content-Type": "multipart/form-data; boundary=xx"})
    assert (r.status_code, code(r)) == (400, "MalformedPOSTRequest"), r.text
    f = form(bucket, [{"key": "k"}], {"key": "k"})
    f["policy"] = "!!not base64!!"  # signed, so that the policy itself is what fails
    f["x-amz-signature"] = hmac.new(signing_key(ROOT_SECRET, f["x-amz-date"][:8], REGION),
                                    f["policy"].encode(), hashlib.sha256).hexdigest()
    assert (post(daemon, bucket, f).status_code, code(post(daemon, bucket, f))) == (
        400, "InvalidPolicyDocument")
    r = requests.post(f"{daemon.url}/{bucket}", timeout=10, files={
        "key": (None, "k"), "x-ignore-pad": (None, "p" * (65 << 10)), "file": ("f", b"x")})
    assert (r.status_code, code(r)) == (400, "MaxPostPreDataLengthExceeded")


def test_signer_must_be_allowed_to_write(daemon: Daemon, s3: Any, bucket: str) -> None:
    """alice's valid signature does not open root's private bucket; an unsigned form is
    anonymous and refused too."""
    f = form(bucket, [{"key": "k"}], {"key": "k"}, key=USER_KEY, secret=USER_SECRET)
    r = post(daemon, bucket, f)
    assert (r.status_code, code(r)) == (403, "AccessDenied")
    r = post(daemon, bucket, {"key": "k"})
    assert (r.status_code, code(r)) == (403, "AccessDenied")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def _streamed(boundary: str, fields: dict[str, str], size: int,
              digest: Any) -> Iterator[bytes]:
    """A multipart body generated piece by piece (sent chunked: never whole in memory)."""
    for k, v in fields.items():
        yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n"
               f"{v}\r\n").encode()
    yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
           f"filename=\"big.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
    left = size
    while left:
        piece = os.urandom(min(left, MiB))
        digest.update(piece)
        left -= len(piece)
        yield piece
    yield f"\r\n--{boundary}--\r\n".encode()


def test_large_streamed_upload(daemon: Daemon, s3: Any, bucket: str) -> None:
    f = form(bucket, [{"key": "big"}, ["content-length-range", 0, 64 * MiB]], {"key": "big"})
    boundary = uuid.uuid4().hex
    md5 = hashlib.md5()
    r = requests.post(f"{daemon.url}/{bucket}", timeout=120,
                      data=_streamed(boundary, f, 40 * MiB + 3, md5),
                      headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 204, r.text
    assert r.headers["ETag"] == f'"{md5.hexdigest()}"'
    assert s3.head_object(Bucket=bucket, Key="big")["ContentLength"] == 40 * MiB + 3


def test_browser_preflight_then_form_post(daemon: Daemon, s3: Any, bucket: str) -> None:
    origin = "https://app.example.com"
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": [
        {"AllowedMethods": ["POST"], "AllowedOrigins": [origin], "ExposeHeaders": ["ETag"]}]})
    r = requests.options(f"{daemon.url}/{bucket}", timeout=10, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST"})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == origin
    p = s3.generate_presigned_post(bucket, "from-page", ExpiresIn=60)
    r = requests.post(p["url"], data=p["fields"], files={"file": ("f", b"page")},
                      headers={"Origin": origin}, timeout=30)
    assert r.status_code == 204
    assert r.headers["Access-Control-Allow-Origin"] == origin
    assert r.headers["Access-Control-Expose-Headers"] == "ETag"


def _peak_rss(pid: int) -> int:
    """The process's resident-memory high-water mark (bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_streamed_in_bounded_memory_and_durable_when_acknowledged(tmp_path: Path) -> None:
    """A 96 MiB form upload moves the daemon's peak RSS by far less than its size (it is
    streamed, never held); and the 204 comes only once the object is durable (the PutObject
    path): a SIGKILL right after it loses nothing, small (logged) or large (synced)."""
    d = start_daemon(tmp_path / "data")
    try:
        d.client().create_bucket(Bucket="durable")
        small, large = b"s" * 100, os.urandom(3 * MiB)
        for key, data in (("small", small), ("large", large)):
            assert post(d, "durable", form("durable", [{"key": key}], {"key": key}),
                        data).status_code == 204
        before = _peak_rss(d.proc.pid)
        f = form("durable", [{"key": "huge"}, ["content-length-range", 0, 128 * MiB]],
                 {"key": "huge"})
        boundary, md5 = uuid.uuid4().hex, hashlib.md5()
        r = requests.post(f"{d.url}/durable", timeout=300,
                          data=_streamed(boundary, f, 96 * MiB, md5),
                          headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        assert r.status_code == 204 and r.headers["ETag"] == f'"{md5.hexdigest()}"'
        grew = _peak_rss(d.proc.pid) - before
        assert grew < 32 * MiB, f"peak RSS grew by {grew >> 20} MiB for a 96 MiB upload"
        d.proc.kill()
        d.proc.wait(10)
        d = start_daemon(tmp_path / "data")
        s3 = d.client()
        assert s3.get_object(Bucket="durable", Key="small")["Body"].read() == small
        assert s3.get_object(Bucket="durable", Key="large")["Body"].read() == large
    finally:
        d.stop()


@pytest.mark.parametrize("status", ["204", "bogus"])
def test_default_status_is_204(daemon: Daemon, bucket: str, status: str) -> None:
    f = form(bucket, [{"key": "k"}, {"success_action_status": status}],
             {"key": "k", "success_action_status": status})
    assert post(daemon, bucket, f).status_code == 204
