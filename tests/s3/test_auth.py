"""Authentication end to end: SigV4 variants, aws-chunked bodies (signed chunks, unsigned
chunks with trailing checksums from real botocore), presigned URLs, clock skew, keys."""

from __future__ import annotations

import base64
import configparser
import datetime
import hashlib
import os
import stat
import zlib
from pathlib import Path
from typing import Any
from unittest import mock

import botocore.httpchecksum
import pytest
import requests
from botocore.auth import S3SigV4QueryAuth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tierd.s3.auth import signing_key

from .conftest import (
    REGION,
    ROOT_KEY,
    ROOT_SECRET,
    Daemon,
    assert_error,
    client_error,
    start_daemon,
)

EMPTY = hashlib.sha256(b"").hexdigest()


def signed(daemon: Daemon, method: str, path: str, body: bytes = b"",
           headers: dict[str, str] | None = None, when: datetime.datetime | None = None,
           key: str = ROOT_KEY, secret: str = ROOT_SECRET) -> tuple[AWSRequest, str]:
    """A SigV4-signed request (botocore's signer) with the x-amz-content-sha256 given in
    ``headers`` (or the body's hash); returns it and its seed signature."""
    h = {"X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest()}
    h.update(headers or {})
    req = AWSRequest(method=method, url=daemon.url + path, data=body, headers=h)
    when = when or datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    with mock.patch("botocore.auth.get_current_datetime", return_value=when):
        SigV4Auth(Credentials(key, secret), "s3", REGION).add_auth(req)
    sig = req.headers["Authorization"].rsplit("Signature=", 1)[1]
    return req, sig


def send(req: AWSRequest) -> requests.Response:
    return requests.request(req.method, req.url, headers=dict(req.headers.items()),
                            data=req.body, timeout=30)


def chunked_body(data: bytes, seed: str, amz_date: str, chunk: int = 64 << 10,
                 trailer: tuple[str, str] | None = None, break_at: int = -1) -> bytes:
    """An aws-chunked body with chunk signatures (and a signed trailer when given)."""
    key = signing_key(ROOT_SECRET, amz_date[:8], REGION)
    scope = f"{amz_date[:8]}/{REGION}/s3/aws4_request"
    out = b""
    prev = seed
    pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)] + [b""]
    for i, piece in enumerate(pieces):
        sts = "\n".join(("AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, prev, EMPTY,
                         hashlib.sha256(piece).hexdigest()))
        import hmac
        prev = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
        sig = "f" * 64 if i == break_at else prev
        out += f"{len(piece):x};chunk-signature={sig}\r\n".encode() + piece
        if piece:
            out += b"\r\n"
    if trailer is None:
        return out + b"\r\n"
    name, value = trailer
    canon = f"{name}:{value}\n"
    sts = "\n".join(("AWS4-HMAC-SHA256-TRAILER", amz_date, scope, prev,
                     hashlib.sha256(canon.encode()).hexdigest()))
    import hmac
    tsig = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
    return out + f"{name}:{value}\r\nx-amz-trailer-signature:{tsig}\r\n\r\n".encode()


def streaming_put(daemon: Daemon, path: str, data: bytes, *, break_at: int = -1,
                  trailer: tuple[str, str] | None = None) -> requests.Response:
    payload = ("STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER" if trailer
               else "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
    headers = {"X-Amz-Content-SHA256": payload, "Content-Encoding": "aws-chunked",
               "X-Amz-Decoded-Content-Length": str(len(data))}
    if trailer:
        headers["X-Amz-Trailer"] = trailer[0]
    # the seed signature covers Content-Length: sign with the final length
    req, seed = signed(daemon, "PUT", path, b"", headers)
    amz_date = req.headers["X-Amz-Date"]
    body = chunked_body(data, seed, amz_date, trailer=trailer, break_at=break_at)
    headers["Content-Length"] = str(len(body))
    req, seed = signed(daemon, "PUT", path, b"", headers)
    body = chunked_body(data, seed, req.headers["X-Amz-Date"], trailer=trailer,
                        break_at=break_at)
    hdrs = dict(req.headers.items())
    return requests.put(req.url, headers=hdrs, data=body, timeout=30)


def test_signed_streaming_chunks(daemon: Daemon, s3: Any, bucket: str) -> None:
    data = os.urandom(300_000)
    r = streaming_put(daemon, f"/{bucket}/chunked", data)
    assert r.status_code == 200, r.text
    assert r.headers["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    assert s3.get_object(Bucket=bucket, Key="chunked")["Body"].read() == data
    # a bad chunk signature in the middle: refused, the old object stays
    r = streaming_put(daemon, f"/{bucket}/chunked", os.urandom(300_000), break_at=2)
    assert r.status_code == 403 and "<Code>SignatureDoesNotMatch</Code>" in r.text
    assert s3.get_object(Bucket=bucket, Key="chunked")["Body"].read() == data
    # signed chunks with a signed trailing checksum
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    r = streaming_put(daemon, f"/{bucket}/trailer", data, trailer=("x-amz-checksum-crc32", crc))
    assert r.status_code == 200, r.text
    h = s3.head_object(Bucket=bucket, Key="trailer", ChecksumMode="ENABLED")
    assert h["ChecksumCRC32"] == crc
    r = streaming_put(daemon, f"/{bucket}/trailer", data,
                      trailer=("x-amz-checksum-crc32", "AAAAAA=="))
    assert r.status_code == 400 and "<Code>BadDigest</Code>" in r.text


@pytest.fixture
def trailer_client(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> Any:
    """boto3 as it behaves over HTTPS (where it sends STREAMING-UNSIGNED-PAYLOAD-TRAILER
    bodies with trailing checksums by default), talking plain HTTP to the test daemon."""
    real = botocore.httpchecksum.urlparse
    monkeypatch.setattr(botocore.httpchecksum, "urlparse",
                        lambda url: real(url)._replace(scheme="https"))
    client = daemon.client()
    seen: list[str] = []
    client.meta.events.register("before-send.s3.*", lambda request, **kw: seen.append(
        request.headers.get("X-Amz-Content-SHA256", b"").decode()
        if isinstance(request.headers.get("X-Amz-Content-SHA256"), bytes)
        else str(request.headers.get("X-Amz-Content-SHA256"))))
    client.seen = seen
    return client


def test_unsigned_payload_trailers_from_boto3(trailer_client: Any, s3: Any, bucket: str,
                                              tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    for alg in ("CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"):
        r = trailer_client.put_object(Bucket=bucket, Key=f"t-{alg}", Body=data,
                                      ChecksumAlgorithm=alg)
        h = s3.head_object(Bucket=bucket, Key=f"t-{alg}", ChecksumMode="ENABLED")
        assert h[f"Checksum{alg}"] == r[f"Checksum{alg}"]
        assert h["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    assert "STREAMING-UNSIGNED-PAYLOAD-TRAILER" in trailer_client.seen
    # multipart with trailers on every part (upload_file's defaults)
    from boto3.s3.transfer import TransferConfig
    src = tmp_path / "f"
    src.write_bytes(os.urandom(13 << 20))
    trailer_client.upload_file(str(src), bucket, "mp", Config=TransferConfig(
        multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
    dst = tmp_path / "g"
    s3.download_file(bucket, "mp", str(dst))
    assert dst.read_bytes() == src.read_bytes()
    assert s3.head_object(Bucket=bucket, Key="mp", ChecksumMode="ENABLED")[
        "ChecksumCRC32"].endswith("-3")


def test_unsigned_trailer_with_wrong_checksum_keeps_old_object(
        daemon: Daemon, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"old")
    data = b"new data" * 1000
    body = (f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n"
            + b"x-amz-checksum-crc32:AAAAAA==\r\n\r\n")
    headers = {"X-Amz-Content-SHA256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
               "Content-Encoding": "aws-chunked", "X-Amz-Trailer": "x-amz-checksum-crc32",
               "X-Amz-Decoded-Content-Length": str(len(data)),
               "Content-Length": str(len(body))}
    req, _ = signed(daemon, "PUT", f"/{bucket}/k", b"", headers)
    r = requests.put(req.url, headers=dict(req.headers.items()), data=body, timeout=30)
    assert r.status_code == 400 and "<Code>BadDigest</Code>" in r.text
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"old"
    good = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    body = body.replace(b"AAAAAA==", good.encode())
    r = requests.put(req.url, headers=dict(req.headers.items()), data=body, timeout=30)
    assert r.status_code == 200, r.text
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == data


def test_unsigned_payload_and_content_sha256(daemon: Daemon, s3: Any, bucket: str) -> None:
    req, _ = signed(daemon, "PUT", f"/{bucket}/u", b"unsigned",
                    {"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"})
    assert send(req).status_code == 200
    assert s3.get_object(Bucket=bucket, Key="u")["Body"].read() == b"unsigned"
    req, _ = signed(daemon, "PUT", f"/{bucket}/u", b"other",
                    {"X-Amz-Content-SHA256": hashlib.sha256(b"something else").hexdigest()})
    r = send(req)
    assert r.status_code == 400 and "<Code>XAmzContentSHA256Mismatch</Code>" in r.text
    assert s3.get_object(Bucket=bucket, Key="u")["Body"].read() == b"unsigned"
    # the RFC 1123 Date header may replace X-Amz-Date
    req, _ = signed(daemon, "GET", f"/{bucket}/u", headers={"Date": "x"})
    assert "X-Amz-Date" not in req.headers
    r = send(req)
    assert r.status_code == 200 and r.content == b"unsigned"


def test_clock_skew(daemon: Daemon, bucket: str) -> None:
    old = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) - datetime.timedelta(
        minutes=16)
    req, _ = signed(daemon, "GET", f"/{bucket}", when=old)
    r = send(req)
    assert r.status_code == 403 and "<Code>RequestTimeTooSkewed</Code>" in r.text
    ok = old + datetime.timedelta(minutes=2)
    assert send(signed(daemon, "GET", f"/{bucket}", when=ok)[0]).status_code == 200


def test_presigned_expiry(daemon: Daemon, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="p", Body=b"x")
    old = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) - datetime.timedelta(
        hours=2)
    req = AWSRequest(method="GET", url=f"{daemon.url}/{bucket}/p")
    with mock.patch("botocore.auth.get_current_datetime", return_value=old):
        S3SigV4QueryAuth(Credentials(ROOT_KEY, ROOT_SECRET), "s3", REGION,
                         expires=3600).add_auth(req)
    r = requests.get(req.url, timeout=10)
    assert r.status_code == 403 and "<Code>AccessDenied</Code>" in r.text
    assert "Request has expired" in r.text
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "p"},
                                    ExpiresIn=8 * 24 * 3600)
    r = requests.get(url, timeout=10)
    assert r.status_code == 400 and "AuthorizationQueryParametersError" in r.text
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "p"},
                                    ExpiresIn=7 * 24 * 3600)
    assert requests.get(url, timeout=10).content == b"x"


def test_anonymous_and_bad_credentials(daemon: Daemon, bucket: str) -> None:
    for method, path in (("GET", "/"), ("GET", f"/{bucket}"), ("PUT", f"/{bucket}/k"),
                         ("HEAD", f"/{bucket}")):
        r = requests.request(method, daemon.url + path, timeout=10)
        assert r.status_code == 403, (method, path)
        if method != "HEAD":
            assert "<Code>AccessDenied</Code>" in r.text
    e = client_error(daemon.client("NOSUCHKEY", "secret-secret").list_buckets)
    assert e.response["Error"]["Code"] == "InvalidAccessKeyId"
    e = client_error(daemon.client(ROOT_KEY, "wrong-secret-wrong").list_buckets)
    assert e.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    r = requests.get(daemon.url + "/", headers={"Authorization": "AWS AKIA:abc"}, timeout=10)
    assert r.status_code == 400 and "Signature Version 2" in r.text


def test_posix_permissions_apply_to_s3_users(s3: Any, alice: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="readable", Body=b"x", ACL="authenticated-read")
    assert_error("AccessDenied", 403, alice.get_object, Bucket=bucket, Key="readable")
    # root's bucket is private; shared with every signed user (0755): alice may read, not
    # write
    s3.put_bucket_acl(Bucket=bucket, ACL="authenticated-read")
    assert alice.get_object(Bucket=bucket, Key="readable")["Body"].read() == b"x"
    assert_error("AccessDenied", 403, alice.put_object, Bucket=bucket, Key="new", Body=b"y")
    assert_error("AccessDenied", 403, alice.delete_object, Bucket=bucket, Key="readable")
    assert_error("AccessDenied", 403, alice.delete_bucket, Bucket=bucket)


def test_root_credentials_bootstrap(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    data_dir = tmp_path / "boot"
    d = start_daemon(data_dir, env=env)
    try:
        cred = data_dir / "root-credentials"
        assert stat.S_IMODE(cred.stat().st_mode) == 0o600
        cp = configparser.ConfigParser()
        cp.read(cred)
        key = cp["default"]["aws_access_key_id"]
        secret = cp["default"]["aws_secret_access_key"]
        assert key.startswith("TIERD") and len(secret) >= 40
        log = d.log.read_text()
        assert str(cred) in log and key in log and secret not in log
        c = d.client(key, secret)
        c.create_bucket(Bucket="boot")
        assert [b["Name"] for b in c.list_buckets()["Buckets"]] == ["boot"]
    finally:
        d.stop()
    # a restart keeps the same key
    d = start_daemon(data_dir, env=env)
    try:
        assert d.client(key, secret).list_buckets()["Buckets"][0]["Name"] == "boot"
    finally:
        d.stop()
    # the environment pair replaces it
    d = start_daemon(data_dir, env=dict(env, TIERD_ROOT_ACCESS_KEY="ENVROOT",
                                        TIERD_ROOT_SECRET_KEY="env-secret-123"))
    try:
        assert d.client("ENVROOT", "env-secret-123").list_buckets()["Buckets"]
        e = client_error(d.client(key, secret).list_buckets)
        assert e.response["Error"]["Code"] == "InvalidAccessKeyId"
        assert "ENVROOT" in (data_dir / "root-credentials").read_text()
    finally:
        d.stop()
    # only one of the two variables: refused at start
    with pytest.raises(RuntimeError, match="TIERD_ROOT_SECRET_KEY"):
        start_daemon(tmp_path / "other", env=dict(env, TIERD_ROOT_ACCESS_KEY="X" * 10))
