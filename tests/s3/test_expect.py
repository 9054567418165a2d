"""``Expect: 100-continue``: the gateway says "send the body" only to a request it has
authenticated and authorized, and other expectations are not a bare 417 from the framework.

A raw socket shows exactly what the server sends before the body (a client library hides
the interim response); curl (``--aws-sigv4``, which sends ``Expect: 100-continue`` for
bodies over 1 MiB) and boto3 show the same through real clients.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from .conftest import REGION, ROOT_KEY, ROOT_SECRET, USER_KEY, USER_SECRET, Daemon

BODY = b"hello"


def _connect(daemon: Daemon) -> socket.socket:
    u = urlsplit(daemon.url)
    s = socket.create_connection((u.hostname or "127.0.0.1", u.port or 80), timeout=10)
    return s


def _head_of(data: bytes) -> tuple[int, bytes]:
    line = data.split(b"\r\n", 1)[0]
    return int(line.split()[1]), data


def _read_response(s: socket.socket, deadline: float = 5.0) -> bytes:
    """What the server sends until it pauses (the interim 100 or a whole final answer)."""
    s.settimeout(deadline)
    out = b""
    try:
        while b"\r\n\r\n" not in out:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        s.settimeout(0.3)
        while True:  # the rest of a final answer's body, if any
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except TimeoutError:
        pass
    return out


def _signed_headers(daemon: Daemon, path: str, expect: str, key: str = ROOT_KEY,
                    secret: str = ROOT_SECRET) -> dict[str, str]:
    req = AWSRequest(method="PUT", url=daemon.url + path, data=BODY,
                     headers={"Expect": expect, "Content-Length": str(len(BODY))})
    S3SigV4Auth(Credentials(key, secret), "s3", REGION).add_auth(req)
    return dict(req.headers.items())


def _send_head(s: socket.socket, daemon: Daemon, path: str, headers: dict[str, str]) -> None:
    host = urlsplit(daemon.url).netloc
    lines = [f"PUT {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() != "host"]
    s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())


def test_unsigned_put_gets_403_before_any_100_continue(daemon: Daemon, bucket: str) -> None:
    with _connect(daemon) as s:
        _send_head(s, daemon, f"/{bucket}/anon", {"Content-Length": str(len(BODY)),
                                                   "Expect": "100-continue"})
        status, data = _head_of(_read_response(s))
    assert status == 403, data
    assert b"AccessDenied" in data and b"100 Continue" not in data, data


def test_bad_signature_gets_403_before_any_100_continue(daemon: Daemon, bucket: str) -> None:
    headers = _signed_headers(daemon, f"/{bucket}/forged", "100-continue",
                              secret=ROOT_SECRET + "x")
    with _connect(daemon) as s:
        _send_head(s, daemon, f"/{bucket}/forged", headers)
        status, data = _head_of(_read_response(s))
    assert status == 403 and b"SignatureDoesNotMatch" in data, data


def _put_after_continue(daemon: Daemon, path: str) -> None:
    """A signed PUT of ``path`` with ``Expect: 100-continue``: 100, then the body, then 200."""
    with _connect(daemon) as s:
        _send_head(s, daemon, path, _signed_headers(daemon, path, "100-continue"))
        status, data = _head_of(_read_response(s))
        assert status == 100, data
        s.sendall(BODY)
        status, data = _head_of(_read_response(s))
    assert status == 200, data


def test_signed_put_gets_100_then_200(daemon: Daemon, bucket: str, s3: Any) -> None:
    _put_after_continue(daemon, f"/{bucket}/signed")
    assert s3.get_object(Bucket=bucket, Key="signed")["Body"].read() == BODY


def test_other_expectations_are_not_a_bare_417(daemon: Daemon, bucket: str, s3: Any) -> None:
    path = f"/{bucket}/other-expect"
    with _connect(daemon) as s:
        _send_head(s, daemon, path, _signed_headers(daemon, path, "something-else"))
        s.sendall(BODY)
        status, data = _head_of(_read_response(s))
    assert status == 200, data
    assert s3.get_object(Bucket=bucket, Key="other-expect")["Body"].read() == BODY
    with _connect(daemon) as s:  # unsigned: an S3 error document, never the framework's 417
        _send_head(s, daemon, path, {"Content-Length": "5", "Expect": "nonsense"})
        s.sendall(BODY)
        status, data = _head_of(_read_response(s))
    assert status == 403 and b"<Error>" in data, data


def test_a_refused_user_is_answered_before_the_body(daemon: Daemon, bucket: str) -> None:
    """alice (uid 1000) may not write into root's private bucket: a bucket policy is not
    needed to refuse her, and she is refused before she sends the body."""
    path = f"/{bucket}/alice"
    headers = _signed_headers(daemon, path, "100-continue", USER_KEY, USER_SECRET)
    with _connect(daemon) as s:
        _send_head(s, daemon, path, headers)
        t0 = time.monotonic()
        status, data = _head_of(_read_response(s))
    assert status == 403 and b"AccessDenied" in data, data
    assert time.monotonic() - t0 < 4, "the refusal waited for a body"


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_upload_without_credentials_is_refused_before_the_body(
        daemon: Daemon, bucket: str, tmp_path: Any) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * (2 << 20))  # curl sends Expect: 100-continue above 1 MiB
    r = subprocess.run(["curl", "-sS", "-v", "-o", "/dev/null", "-w", "%{http_code}",
                        "--expect100-timeout", "30", "-T", str(big),
                        f"{daemon.url}/{bucket}/curl-anon"],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout == "403", (r.stdout, r.stderr[-2000:])
    assert "Expect: 100-continue" in r.stderr and "HTTP/1.1 100" not in r.stderr, r.stderr
    r = subprocess.run(["curl", "-sS", "-v", "-o", "/dev/null", "-w", "%{http_code}",
                        "--expect100-timeout", "30", "--aws-sigv4", f"aws:amz:{REGION}:s3",
                        "--user", f"{ROOT_KEY}:{ROOT_SECRET}",
                        "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-T", str(big),
                        f"{daemon.url}/{bucket}/curl-signed"],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout == "200", (r.stdout, r.stderr[-2000:])
    assert "HTTP/1.1 100" in r.stderr, r.stderr[-2000:]


def test_upload_part_into_another_keys_upload_is_refused_before_the_body(
        daemon: Daemon, bucket: str, s3: Any) -> None:
    """UploadPart checks before "100 Continue" what it would check before reading the body:
    an upload ID of another key is NoSuchUpload at once; its own key gets 100 then 200."""
    up = s3.create_multipart_upload(Bucket=bucket, Key="mpu-key")["UploadId"]
    try:
        wrong = f"/{bucket}/other-key?partNumber=1&uploadId={up}"
        with _connect(daemon) as s:
            _send_head(s, daemon, wrong, _signed_headers(daemon, wrong, "100-continue"))
            status, data = _head_of(_read_response(s))
        assert status == 404 and b"NoSuchUpload" in data, data
        _put_after_continue(daemon, f"/{bucket}/mpu-key?partNumber=1&uploadId={up}")
    finally:
        s3.abort_multipart_upload(Bucket=bucket, Key="mpu-key", UploadId=up)
