"""Request limits of both HTTP doors (S3 and admin), each checked with a real client on a
real socket: header sizes and counts, idle and slow-header connections, stalled bodies, XML
body sizes and element counts, DeleteObjects key counts, the listing max-keys clamp and the
admin API's body size."""

from __future__ import annotations

import hashlib
import socket
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from s3.conftest import REGION, ROOT_KEY, ROOT_SECRET

from .conftest import Admin, start_admin
from .test_users import s3_client

TIMEOUT = 1.0  # the daemon's s3_idle_timeout and s3_body_timeout here


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Admin]:
    a = start_admin(tmp_path_factory.mktemp("limits") / "data", "--s3-idle-timeout",
                    str(TIMEOUT), "--s3-body-timeout", str(TIMEOUT))
    yield a
    a.d.stop()
    assert "Traceback" not in a.log(), a.log()[-5000:]


def addr(url: str) -> tuple[str, int]:
    u = urlsplit(url)
    assert u.hostname is not None and u.port is not None
    return u.hostname, u.port


def exchange(url: str, data: bytes, wait: float = 5.0) -> bytes:
    """Send ``data`` on a fresh connection; everything received until the server closes
    it or ``wait`` seconds pass."""
    with socket.create_connection(addr(url), timeout=wait) as s:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            out += chunk
        return out


def status_of(reply: bytes) -> int:
    assert reply.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), reply[:200]
    return int(reply.split(b" ", 2)[1])


def signed_headers(method: str, url: str, body: bytes | None,
                   extra: dict[str, str] | None = None) -> dict[str, str]:
    """SigV4 headers of an S3 request (``body=None``: UNSIGNED-PAYLOAD)."""
    sha = "UNSIGNED-PAYLOAD" if body is None else hashlib.sha256(body).hexdigest()
    req = AWSRequest(method=method, url=url, data=body or b"",
                     headers={"x-amz-content-sha256": sha, **(extra or {})})
    SigV4Auth(Credentials(ROOT_KEY, ROOT_SECRET), "s3", REGION).add_auth(req)
    return dict(req.headers.items())


def s3_request(a: Admin, method: str, path: str, body: bytes = b"") -> requests.Response:
    url = a.d.url + path
    return requests.request(method, url, data=body, headers=signed_headers(method, url, body),
                            timeout=30)


def s3_code(resp: requests.Response) -> str:
    assert resp.headers["Content-Type"].startswith("application/xml"), resp.text[:300]
    return resp.text.split("<Code>", 1)[1].split("</Code>", 1)[0]


@pytest.fixture
def bucket(limited: Admin) -> Iterator[str]:
    name = f"lim-{uuid.uuid4().hex[:12]}"
    c = s3_client(limited, ROOT_KEY, ROOT_SECRET)
    c.create_bucket(Bucket=name)
    yield name
    for o in c.list_objects_v2(Bucket=name).get("Contents", []):
        c.delete_object(Bucket=name, Key=o["Key"])
    c.delete_bucket(Bucket=name)


# -- headers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("door", ["s3", "admin"])
def test_header_limits(limited: Admin, door: str) -> None:
    url = limited.d.url if door == "s3" else limited.url
    auth = f"Authorization: Bearer {limited.token}\r\n" if door == "admin" else ""
    ok = exchange(url, f"GET /healthz HTTP/1.1\r\nHost: x\r\n{auth}X-Pad: {'a' * 4000}\r\n"
                  "Connection: close\r\n\r\n".encode())
    assert status_of(ok) == 200
    big = exchange(url, f"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: {'a' * 9000}\r\n"
                   "Connection: close\r\n\r\n".encode())
    assert status_of(big) == 400
    many = "".join(f"X-H{i}: v\r\n" for i in range(200))
    assert status_of(exchange(url, f"GET /healthz HTTP/1.1\r\nHost: x\r\n{many}"
                              "Connection: close\r\n\r\n".encode())) == 400
    line = exchange(url, f"GET /{'p' * 20000} HTTP/1.1\r\nHost: x\r\n"
                    "Connection: close\r\n\r\n".encode())
    assert status_of(line) in (400, 414)


def test_s3_accepts_a_long_presigned_url(limited: Admin, bucket: str) -> None:
    """The limits leave room for what clients legitimately send: a 1,024-byte key of
    non-ASCII characters, percent-encoded, in a presigned URL."""
    c = s3_client(limited, ROOT_KEY, ROOT_SECRET)
    key = "/".join(["é" * 127] * 4)  # 1,019 bytes of UTF-8, ~3,000 characters in the URL
    c.put_object(Bucket=bucket, Key=key, Body=b"x")
    url = c.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key})
    r = requests.get(url, timeout=30)
    assert r.status_code == 200 and r.content == b"x"


# -- connections -----------------------------------------------------------------------------

def test_idle_and_slow_header_connections_are_closed(limited: Admin) -> None:
    t0 = time.monotonic()
    assert exchange(limited.d.url, b"", wait=10) == b""  # nothing sent: closed
    assert time.monotonic() - t0 < TIMEOUT + 3
    with socket.create_connection(addr(limited.d.url), timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
        closed = False
        for _ in range(40):  # one header byte every 0.25 s: never a whole request head
            try:
                s.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            s.settimeout(0.25)
            try:
                if s.recv(1024) == b"":
                    closed = True
                    break
            except ConnectionResetError:  # closed with our last byte unread: a reset
                closed = True
                break
            except TimeoutError:
                pass
        assert closed and time.monotonic() - t0 < TIMEOUT + 3


def test_stalled_body_gets_request_timeout(limited: Admin, bucket: str) -> None:
    url = f"{limited.d.url}/{bucket}/stalled"
    headers = signed_headers("PUT", url, None, {"Content-Length": "100"})
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    host = urlsplit(url).netloc
    with socket.create_connection(addr(url), timeout=10) as s:
        s.sendall(f"PUT /{bucket}/stalled HTTP/1.1\r\nHost: {host}\r\n{head}\r\n".encode()
                  + b"0123456789")
        t0 = time.monotonic()
        reply = s.recv(65536)
    assert status_of(reply) == 400 and b"<Code>RequestTimeout</Code>" in reply
    assert TIMEOUT * 0.9 <= time.monotonic() - t0 < TIMEOUT + 5
    c = s3_client(limited, ROOT_KEY, ROOT_SECRET)
    assert c.list_objects_v2(Bucket=bucket).get("KeyCount") == 0  # nothing half-written


def test_a_slow_but_moving_body_is_fine(limited: Admin, bucket: str) -> None:
    """Only silence counts: a body trickling in slower than the timeout in total, but with
    bytes arriving within every period, completes."""
    url = f"{limited.d.url}/{bucket}/slow"
    body = b"z" * 60  # 6 pieces, 1.8 s in all: longer than the timeout
    headers = signed_headers("PUT", url, None, {"Content-Length": str(len(body))})
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection(addr(url), timeout=10) as s:
        s.sendall(f"PUT /{bucket}/slow HTTP/1.1\r\nHost: {urlsplit(url).netloc}\r\n"
                  f"{head}\r\n".encode())
        for i in range(0, len(body), 10):
            time.sleep(TIMEOUT * 0.3)
            s.sendall(body[i:i + 10])
        reply = s.recv(65536)
    assert status_of(reply) == 200, reply
    got = s3_client(limited, ROOT_KEY, ROOT_SECRET).get_object(Bucket=bucket, Key="slow")
    assert got["Body"].read() == body


# -- XML bodies and counts -------------------------------------------------------------------

def delete_body(keys: list[str], pad: str = "") -> bytes:
    objs = "".join(f"<Object><Key>{k}</Key></Object>" for k in keys)
    return f"<Delete>{objs}{pad}</Delete>".encode()


def test_delete_objects_limits(limited: Admin, bucket: str) -> None:
    c = s3_client(limited, ROOT_KEY, ROOT_SECRET)
    c.put_object(Bucket=bucket, Key="keep", Body=b"k")
    r = s3_request(limited, "POST", f"/{bucket}?delete", delete_body(["keep"] * 1000))
    assert r.status_code == 200, r.text  # exactly 1,000 is allowed
    c.put_object(Bucket=bucket, Key="keep", Body=b"k")
    r = s3_request(limited, "POST", f"/{bucket}?delete", delete_body(["keep"] * 1001))
    assert (r.status_code, s3_code(r)) == (400, "MalformedXML")
    assert "1000" in r.text
    # past the document's byte limit (2 MiB) and past the read limit (4 MiB)
    r = s3_request(limited, "POST", f"/{bucket}?delete",
                   delete_body(["keep"], "<Quiet>false</Quiet>" * 110_000))
    assert (r.status_code, s3_code(r)) == (400, "MalformedXML")
    r = s3_request(limited, "POST", f"/{bucket}?delete", b" " * (5 << 20))
    assert (r.status_code, s3_code(r)) == (400, "EntityTooLarge")
    # element counts: many tiny elements in a small document
    r = s3_request(limited, "POST", f"/{bucket}?delete", delete_body(["keep"], "<a/>" * 5000))
    assert (r.status_code, s3_code(r)) == (400, "MalformedXML")
    # entities and DTDs are refused (no expansion, no external reads)
    bomb = (b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaaaaaaaa">'
            b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><Delete><Object><Key>&b;</Key>'
            b"</Object></Delete>")
    r = s3_request(limited, "POST", f"/{bucket}?delete", bomb)
    assert (r.status_code, s3_code(r)) == (400, "MalformedXML")
    ext = (b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
           b"<Delete><Object><Key>&x;</Key></Object></Delete>")
    r = s3_request(limited, "POST", f"/{bucket}?delete", ext)
    assert (r.status_code, s3_code(r)) == (400, "MalformedXML") and "root:" not in r.text
    assert c.get_object(Bucket=bucket, Key="keep")["Body"].read() == b"k"


def test_complete_multipart_limits(limited: Admin, bucket: str) -> None:
    c = s3_client(limited, ROOT_KEY, ROOT_SECRET)
    up = c.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    path = f"/{bucket}/mp?uploadId={up}"
    junk = "<Part><PartNumber>1</PartNumber><ETag>x</ETag></Part>" * 30_000
    r = s3_request(limited, "POST", path,
                   f"<CompleteMultipartUpload>{junk}</CompleteMultipartUpload>".encode())
    assert (r.status_code, s3_code(r)) == (400, "MalformedXML")
    r = s3_request(limited, "POST", path, b"<CompleteMultipartUpload><Part>")
    assert (r.status_code, s3_code(r)) == (400, "MalformedXML")
    c.abort_multipart_upload(Bucket=bucket, Key="mp", UploadId=up)


def test_listing_max_keys_is_clamped(limited: Admin, bucket: str) -> None:
    c = s3_client(limited, ROOT_KEY, ROOT_SECRET)
    assert c.list_objects_v2(Bucket=bucket, MaxKeys=5000)["MaxKeys"] == 1000
    assert c.list_objects(Bucket=bucket, MaxKeys=100000)["MaxKeys"] == 1000
    r = s3_request(limited, "GET", f"/{bucket}?list-type=2&max-keys=-1")
    assert (r.status_code, s3_code(r)) == (400, "InvalidArgument")
    r = s3_request(limited, "GET", f"/{bucket}?list-type=2&max-keys={'9' * 5000}")
    assert (r.status_code, s3_code(r)) == (400, "InvalidArgument")


def test_admin_body_limit(limited: Admin) -> None:
    status, doc = limited.call("POST", "/v1/users", body=b"{" + b" " * (2 << 20) + b"}")
    assert status == 413 and doc["error"] == "too_large"
    status, doc = limited.call("POST", "/v1/users", body=b"[" * 100_000)
    assert status == 400 and doc["error"] == "invalid"
