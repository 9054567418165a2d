"""What a newcomer sees first: start-up messages, and the S3 door answering clients that get
something wrong (malformed HTTP, no signature, the wrong region, SigV2) with S3 error
documents that say what to do.  Real ``tierd serve`` processes, raw sockets, boto3."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.auth import UNSIGNED_PAYLOAD as UNSIGNED
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from test_daemon import Spawn, clean_env, data_dir, run, spawn, tierd_cmd

__all__ = ["data_dir", "spawn"]  # fixtures of test_daemon, used here

ROOT_KEY = "TIERDFIRSTCONTACT"
ROOT_SECRET = "first-contact-secret-0123456789"


def root_env(**extra: str) -> dict[str, str]:
    return clean_env(TIERD_ROOT_ACCESS_KEY=ROOT_KEY, TIERD_ROOT_SECRET_KEY=ROOT_SECRET,
                     **extra)


# -- start-up ------------------------------------------------------------------------------


def test_a_data_dir_that_is_a_file_says_so(tmp_path: Path) -> None:
    a_file = tmp_path / "passwd"
    a_file.write_text("root:x:0:0\n")
    for path in (a_file, a_file / "below"):
        r = run(tierd_cmd("serve", "--data-dir", str(path), "--s3-listen", "127.0.0.1:0",
                          "--admin-listen", "127.0.0.1:0"))
        assert r.returncode == 1, r.stderr
        assert f"cannot use {path} as a directory" in r.stderr and "is a file" in r.stderr
        assert "File exists" not in r.stderr and "Not a directory" not in r.stderr
    assert a_file.read_text() == "root:x:0:0\n"


def test_startup_log_is_short_with_changed_settings_one_per_line_at_debug(
        spawn: Spawn, data_dir: Path) -> None:
    t = spawn(data_dir, "--s3-domain", "s3.example", env=clean_env(TIERD_LOG_LEVEL="debug"))
    t.wait_ready()
    lines = t.stderr.splitlines()
    (starting,) = [line for line in lines if "msg=starting" in line]
    assert len(starting) < 300, starting
    assert "pool_mem_tier_share" not in starting and "settings_changed=5" in starting
    settings = {}
    for line in lines:
        if "msg=setting " in line:
            assert "level=debug" in line
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            settings[fields["name"]] = fields["value"]
    # exactly those not at their defaults: the flags above and the variable
    assert settings == {"data_dir": str(data_dir), "s3_listen": "127.0.0.1:0",
                        "admin_listen": "127.0.0.1:0", "log_level": "debug",
                        "s3_domain": "s3.example"}


def test_a_startup_failure_is_a_short_line_right_after_the_first(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run(tierd_cmd("serve", "--data-dir", str(tmp_path / "d"), "--s3-listen",
                          f"127.0.0.1:{port}", "--admin-listen", "127.0.0.1:0"))
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    failure = [i for i, line in enumerate(lines) if "level=critical" in line]
    assert failure, r.stderr
    assert "address already in use" in lines[failure[0]]
    assert all(len(line) < 400 for line in lines), r.stderr


# -- the S3 door ---------------------------------------------------------------------------


@pytest.fixture
def s3_url(spawn: Spawn, data_dir: Path) -> str:
    t = spawn(data_dir, env=root_env())
    t.wait_ready()
    return t.url("s3")


def raw(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as is; (status, headers, body) of the answer, read until the
    server closes the connection (it must: the timeout fails the test otherwise)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), headers, body


def s3_error(headers: dict[str, str], body: bytes) -> dict[str, str]:
    assert headers["content-type"].startswith("application/xml"), (headers, body)
    root = ET.fromstring(body)
    assert root.tag == "Error"
    doc = {child.tag: child.text or "" for child in root}
    assert doc["RequestId"] == headers["x-amz-request-id"]
    return doc


def test_malformed_http_gets_an_s3_error_document(s3_url: str) -> None:
    cases = [
        (b"GET /b/k HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
         "RequestHeaderSectionTooLarge"),
        (b"GET /b/k HTTP/1.1\r\nHost: x\r\n"
         + b"".join(b"X-H%d: v\r\n" % i for i in range(150)) + b"\r\n",
         "RequestHeaderSectionTooLarge"),
        (b"GET /" + b"k" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
         "RequestHeaderSectionTooLarge"),
        (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", "InvalidRequest"),
        (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx",
         "InvalidRequest"),
        (b"G\x01T /b/k HTTP/1.1\r\nHost: x\r\n\r\n", "InvalidRequest"),
    ]
    for request, code in cases:
        status, headers, body = raw(s3_url, request)
        assert status == 400, (request[:60], status, body)
        doc = s3_error(headers, body)
        assert doc["Code"] == code, (request[:60], doc)
        assert b"aaaa" not in body and b"kkkk" not in body  # never the client's bytes back
    # and the door still serves afterwards
    with urllib.request.urlopen(s3_url + "/healthz", timeout=10) as r:
        assert r.status == 200


def test_anonymous_list_buckets_says_to_sign(s3_url: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(s3_url + "/", timeout=10)
    assert e.value.code == 403
    doc = s3_error({k.lower(): v for k, v in e.value.headers.items()}, e.value.read())
    assert doc["Code"] == "AccessDenied"
    assert "cannot list buckets" in doc["Message"] and "has none" not in doc["Message"]


def client(url: str, region: str = "us-east-1", version: str = "s3v4") -> Any:
    return boto3.client("s3", endpoint_url=url, aws_access_key_id=ROOT_KEY,
                        aws_secret_access_key=ROOT_SECRET, region_name=region,
                        config=Config(signature_version=version,
                                      s3={"addressing_style": "path"},
                                      retries={"max_attempts": 1}))


def get(url: str | urllib.request.Request) -> tuple[int, bytes, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read(), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, e.read(), {k.lower(): v for k, v in e.headers.items()}


def test_the_region_must_be_the_gateways_and_presigned_urls_work(s3_url: str) -> None:
    """docs/s3.md, "Regions" and "Presigned URLs": the documented rules, as clients meet
    them."""
    s3 = client(s3_url)
    s3.create_bucket(Bucket="regions")
    s3.put_object(Bucket="regions", Key="k", Body=b"presigned body")
    # another region in the signature: refused, naming the region to use (in the message
    # and in <Region>, from which boto3 re-signs for the right region by itself)
    req = AWSRequest("GET", f"{s3_url}/regions?list-type=2",
                     headers={"x-amz-content-sha256": UNSIGNED})
    SigV4Auth(Credentials(ROOT_KEY, ROOT_SECRET), "s3", "eu-west-1").add_auth(req)
    status, body, headers = get(urllib.request.Request(req.url, headers=dict(req.headers)))
    doc = s3_error(headers, body)
    assert (status, doc["Code"]) == (400, "AuthorizationHeaderMalformed"), doc
    assert "'eu-west-1' is wrong; expecting 'us-east-1'" in doc["Message"]
    assert doc["Region"] == "us-east-1"
    assert client(s3_url, region="eu-west-1").get_object(
        Bucket="regions", Key="k")["Body"].read() == b"presigned body"
    # presigned with SigV4: works; signed for another region: refused the same way
    status, body, _ = get(s3.generate_presigned_url(
        "get_object", Params={"Bucket": "regions", "Key": "k"}, ExpiresIn=60))
    assert (status, body) == (200, b"presigned body")
    status, body, headers = get(client(s3_url, region="eu-west-1").generate_presigned_url(
        "get_object", Params={"Bucket": "regions", "Key": "k"}, ExpiresIn=60))
    assert status == 400 and "expecting 'us-east-1'" in s3_error(headers, body)["Message"]
    # presigned with SigV2 (what boto3 makes with signature_version="s3"): taken by default
    # (s3_allow_sigv2 = presigned; tests/s3/test_sigv2.py has the rest)
    status, body, headers = get(client(s3_url, version="s3").generate_presigned_url(
        "get_object", Params={"Bucket": "regions", "Key": "k"}, ExpiresIn=60))
    assert (status, body) == (200, b"presigned body")
