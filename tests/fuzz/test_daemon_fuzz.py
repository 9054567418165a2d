"""End-to-end fuzzing of a running daemon's S3 door with random requests over real HTTP.

Random methods, paths (dot segments, encoded slashes and NULs, invalid UTF-8, long
segments), sub-resources, headers (ranges, copy sources, checksums, conditionals, ACLs,
metadata) and bodies (noise and near-valid XML), signed with the root key (so the requests
reach the handlers) or not.  The properties:

* every answer is a success or a well-formed S3 ``<Error>`` document whose code is not
  ``InternalError`` (an exception that escaped a handler); HEAD answers carry no body;
* the daemon stays up and logs no traceback;
* nothing appears outside the data directory: the directories around it are unchanged.

Not sent: ``Expect`` other than ``100-continue`` (aiohttp answers ``417`` in plain text
before any handler runs, as it does for requests its parser refuses).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import string
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from s3.conftest import REGION, ROOT_KEY, ROOT_SECRET, Daemon, start_daemon

BUCKET = "fuzzb"
E2E = settings(max_examples=250, deadline=None,
               suppress_health_check=[HealthCheck.too_slow,
                                      HealthCheck.function_scoped_fixture])


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


#: all that may exist around the data directory: the daemon's log next to it
EXPECTED = {"box", "box/data", "box/data.log"}


def _outside(outer: Path) -> set[str]:
    return {p for p in _tree(outer) if not p.startswith("box/data/")}


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    """A daemon whose data directory is ``<outer>/box/data``: ``box`` (and ``outer``) must
    hold nothing the daemon did not put there (its log, ``data``)."""
    outer = tmp_path_factory.mktemp("fuzz")
    (outer / "box").mkdir()
    d = start_daemon(outer / "box" / "data")
    yield d, outer
    d.stop()
    text = d.log.read_text(errors="replace")
    assert "Traceback" not in text, text[-5000:]


segment = st.one_of(
    st.sampled_from(["a", "..", ".", "", "%2e%2e", "%2E.", "%2f", "%00", "%ff%fe", "~", "+",
                     "a%20b", "..%2f..%2fetc", "%c0%ae%c0%ae", "x" * 300, "é", "CON",
                     "?", "#", ";", "*"]),
    st.text(string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@%", max_size=20),
)
subresource = st.sampled_from([
    "", "uploads", "uploadId=x", "uploadId=", "partNumber=1&uploadId=zz", "partNumber=0",
    "partNumber=-1&uploadId=a", "partNumber=99999999999999999999&uploadId=a", "delete",
    "list-type=2", "list-type=3", "max-keys=-5", "max-keys=999999", "prefix=..%2F",
    "delimiter=%00", "continuation-token=%%%", "continuation-token=AAAA", "marker=%ff",
    "versionId=null", "versionId=1", "versions", "location", "versioning", "acl",
    "policy", "policyStatus", "tagging", "uploads&prefix=a", "start-after=%c0",
    "encoding-type=url", "encoding-type=zip", "x-id=GetObject", "fetch-owner=maybe",
    "max-parts=-1", "part-number-marker=x", "max-uploads=abc", "key-marker=%00",
    "X-Amz-Signature=zz", "X-Amz-Credential=a%2Fb",
])
header_value = st.one_of(
    # what requests lets through: no leading whitespace
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60).map(str.lstrip),
    st.sampled_from(["bytes=0-", "bytes=-0", "bytes=5-1", "bytes=0-99999999999999999999",
                     "bytes=1-2,3-4", "items=0-1", "bytes=--1", f"/{BUCKET}/a",
                     f"{BUCKET}/..%2f..%2fx", f"/{BUCKET}/a?versionId=1", "/%00/a",
                     "REPLACE", "COPY", "public-read", "private", "bogus", "*", '"etag"',
                     "Tue, 24 Nov 2026 12:00:00 GMT", "not a date", "AAAA", "====",
                     "UNSIGNED-PAYLOAD", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
                     "STREAMING-UNSIGNED-PAYLOAD-TRAILER", "aws-chunked", "gzip", "-1",
                     "18446744073709551616", "CRC32", "SHA256", "CRC64NVME", "COMPOSITE"]),
)
header_name = st.sampled_from([
    "Range", "x-amz-copy-source", "x-amz-copy-source-range", "x-amz-metadata-directive",
    "x-amz-acl", "Content-MD5", "x-amz-checksum-crc32", "x-amz-checksum-sha256",
    "x-amz-checksum-algorithm", "x-amz-sdk-checksum-algorithm", "x-amz-trailer",
    "If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since",
    "x-amz-copy-source-if-match", "Content-Type", "Content-Encoding", "x-amz-meta-a",
    "x-amz-meta-", "x-amz-tagging", "x-amz-storage-class", "x-amz-decoded-content-length",
    "x-amz-checksum-type", "x-amz-mp-object-size", "x-amz-object-ownership",
    "x-amz-grant-read",
])
xml_piece = st.sampled_from([
    "<Object><Key>a</Key></Object>", "<Object><Key>../x</Key></Object>",
    "<Object><Key></Key></Object>", "<Object><Key>a</Key><VersionId>1</VersionId></Object>",
    "<Quiet>true</Quiet>", "<Part><PartNumber>1</PartNumber><ETag>x</ETag></Part>",
    "<Part><PartNumber>x</PartNumber><ETag>x</ETag></Part>", "<Part/>",
    "<LocationConstraint>mars</LocationConstraint>", "<Status>Enabled</Status>", "&amp;",
])
body = st.one_of(
    st.just(b""),
    st.binary(max_size=200),
    st.builds(lambda root, parts: f"<{root}>{''.join(parts)}</{root}>".encode(),
              st.sampled_from(["Delete", "CompleteMultipartUpload", "CreateBucketConfiguration",
                               "VersioningConfiguration", "Tagging"]),
              st.lists(xml_piece, max_size=5)),
    st.sampled_from([b"0;chunk-signature=\xff\xfe\r\n\r\n", b"zz\r\n", b"5\r\nabc",
                     b'{"Version": "2012-10-17", "Statement": []}', b"{", b"[]"]),
)


def _send(url: str, method: str, path: str, headers: dict[str, str], data: bytes,
          sign: bool) -> requests.Response:
    full = url + path
    if sign:
        headers = {**headers}
        headers.setdefault("x-amz-content-sha256", hashlib.sha256(data).hexdigest())
        req = AWSRequest(method=method, url=full, data=data, headers=headers)
        S3SigV4Auth(Credentials(ROOT_KEY, ROOT_SECRET), "s3", REGION).add_auth(req)
        headers = dict(req.headers.items())
    return requests.request(method, full, headers=headers, data=data, timeout=30,
                            allow_redirects=False)


def check_answer(method: str, r: requests.Response) -> None:
    if r.status_code < 300 or r.status_code == 304:
        return
    where = f"{method} {r.url} -> {r.status_code}"
    if method == "HEAD":
        assert r.status_code < 500, where
        return
    assert r.headers.get("Content-Type", "").startswith("application/xml"), (where, r.text)
    doc = ET.fromstring(r.content)
    assert doc.tag == "Error", (where, r.text)
    code = doc.findtext("Code")
    assert code and code != "InternalError", (where, r.text)
    assert doc.findtext("Message") is not None, (where, r.text)


@E2E
@given(method=st.sampled_from(["GET", "PUT", "POST", "DELETE", "HEAD"]),
       bucket=st.sampled_from([BUCKET, "", "nosuchbucket", "Bad_Bucket", "..", "%2e%2e"]),
       segments=st.lists(segment, max_size=4),
       sub=subresource,
       headers=st.dictionaries(header_name, header_value, max_size=4),
       data=body,
       sign=st.booleans())
def test_random_requests(box: tuple[Daemon, Path], method: str, bucket: str,
                         segments: list[str], sub: str, headers: dict[str, str], data: bytes,
                         sign: bool) -> None:
    d, _ = box
    path = "/" + bucket + ("/" + "/".join(segments) if segments else "")
    if sub:
        path += "?" + sub
    if method == "HEAD":
        data = b""
    try:
        r = _send(d.url, method, path, headers, data, sign)
    except requests.exceptions.ConnectionError as e:  # the server closed on us: only for
        assert method != "HEAD" and data, e  # a body it refused to read to the end
        return
    check_answer(method, r)


def test_the_fuzz_left_nothing_outside(box: tuple[Daemon, Path]) -> None:
    """Run last in this module (pytest keeps file order): the daemon is healthy and the
    directories around its data directory hold only what they held before."""
    d, outer = box
    requests.get(d.url + "/healthz", timeout=10).raise_for_status()
    assert _outside(outer) == EXPECTED
    before = set(os.listdir("/tmp"))
    # a few deliberate escape attempts, signed: none may land outside
    for path in ("/fuzzb/..%2f..%2fescaped", f"/{BUCKET}/%2e%2e/%2e%2e/escaped",
                 "/..%2fescaped/x", f"/{BUCKET}/a/../../escaped"):
        r = _send(d.url, "PUT", path, {}, b"escape", True)
        check_answer("PUT", r)
    r = _send(d.url, "PUT", f"/{BUCKET}/copy-escape",
              {"x-amz-copy-source": "/../../etc/passwd"}, b"", True)
    check_answer("PUT", r)
    assert "root:" not in r.text
    assert not any("escaped" in p for p in _tree(outer) if not p.startswith("box/data/"))
    assert not {n for n in set(os.listdir("/tmp")) - before if "escaped" in n}
    assert _outside(outer) == EXPECTED


@pytest.fixture(scope="module", autouse=True)
def _bucket(box: tuple[Daemon, Path]) -> None:
    d, _ = box
    client = d.client()
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key="a", Body=b"0123456789")
    client.put_object(Bucket=BUCKET, Key="dir/b", Body=b"b")


def test_non_ascii_chunk_signature_is_a_signature_error(box: tuple[Daemon, Path]) -> None:
    """Found by fuzzing: a chunk signature with non-ASCII bytes made ``compare_digest``
    raise TypeError (a 500) instead of SignatureDoesNotMatch."""
    d, _ = box
    host = urlsplit(d.url).netloc
    payload = (b"1;chunk-signature=" + b"\xe9" * 64 + b"\r\nA\r\n"
               b"0;chunk-signature=" + b"\xe9" * 64 + b"\r\n\r\n")
    req = AWSRequest(method="PUT", url=f"{d.url}/{BUCKET}/chunked", data=b"", headers={
        "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        "Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": "1",
        "Content-Length": str(len(payload))})
    SigV4Auth(Credentials(ROOT_KEY, ROOT_SECRET), "s3", REGION).add_auth(req)
    head = "".join(f"{k}: {v}\r\n" for k, v in req.headers.items() if k.lower() != "host")
    with socket.create_connection((urlsplit(d.url).hostname, urlsplit(d.url).port),
                                  timeout=10) as s:
        s.sendall(f"PUT /{BUCKET}/chunked HTTP/1.1\r\nHost: {host}\r\n{head}\r\n".encode()
                  + payload)
        reply = s.recv(65536)
    assert reply.split(b" ", 2)[1] == b"403", reply
    assert b"<Code>SignatureDoesNotMatch</Code>" in reply


def test_non_ascii_signature_is_a_signature_error(box: tuple[Daemon, Path]) -> None:
    d, _ = box
    now = time.gmtime()
    r = requests.get(f"{d.url}/{BUCKET}", timeout=10, headers={
        "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
        "x-amz-date": time.strftime("%Y%m%dT%H%M%SZ", now),
        "Authorization": f"AWS4-HMAC-SHA256 Credential={ROOT_KEY}/"
                         f"{time.strftime('%Y%m%d', now)}/us-east-1/s3/aws4_request, "
                         "SignedHeaders=host;x-amz-date, Signature=\u00e9\u00e9"})
    assert r.status_code == 403 and "<Code>SignatureDoesNotMatch</Code>" in r.text


json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["name", "uid", "gid", "groups", "admin", "user", "access_key",
                         "secret", "prefix", "tier", "mode", "pin", "bytes", "timeout"]),
        inner, max_size=5),
    max_leaves=12)
admin_path = st.sampled_from([
    "/v1/users", "/v1/users/root", "/v1/users/%00", "/v1/users/..", "/v1/keys",
    "/v1/keys?user=root", "/v1/keys?user=%ff", "/v1/keys/NOPE/disable", "/v1/keys/%2e/enable",
    "/v1/keys/NOPE", "/v1/status", "/v1/pool", "/v1/pool/quota/x", "/v1/pool/quota/1",
    "/v1/pool/regions/-1", "/v1/ckpt?run=%00", "/v1/placement/du?prefix=..",
    "/v1/placement/policy", "/v1/placement/pin", "/v1/placement/evict", "/healthz", "/x",
])


@E2E
@given(method=st.sampled_from(["GET", "PUT", "POST", "DELETE"]), path=admin_path,
       doc=st.one_of(json_value.map(lambda v: json.dumps(v).encode()),
                     st.binary(max_size=50)),
       with_token=st.booleans())
def test_random_admin_requests(box: tuple[Daemon, Path], method: str, path: str, doc: bytes,
                               with_token: bool) -> None:
    """The admin API answers JSON errors (never a 500, never a change without the token).
    Deletions of users/keys other than the fuzzer's own cannot happen: only ``root`` exists
    and it cannot be deleted."""
    d, _ = box
    token = (d.data_dir / "admin-token").read_text().strip()
    url = json.loads((d.data_dir / "endpoints.json").read_text())["admin"]["url"]
    headers = {"Authorization": f"Bearer {token}"} if with_token else {}
    r = requests.request(method, url + path, data=doc, headers=headers, timeout=30)
    assert r.status_code < 500 or r.status_code == 503, (method, path, r.text)
    if path == "/healthz" and method == "GET":
        return
    if not with_token:
        assert r.status_code == 401, (method, path, r.status_code)
    if r.status_code >= 400:
        assert r.json()["error"], r.text
