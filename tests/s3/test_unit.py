"""Units of the gateway checked against AWS's published examples and edge cases (no
daemon): the SigV4 seed and chunk signatures, aws-chunked decoding, ranges, checksums, XML."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import streams
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from tierd.acl.keys import canonical_user_id
from tierd.errors import FsError, Reason
from tierd.meta import AccessKey
from tierd.s3 import checksums, xmlio
from tierd.s3.auth import Auth, Authenticator, sign, signing_key
from tierd.s3.body import Body
from tierd.s3.common import encode_layout, parse_copy_source, parse_range
from tierd.s3.errors import CODES, S3Error, from_fs_error

# The example of "Signature Calculations for the Authorization Header: Transferring Payload
# in Multiple Chunks (Chunked Upload) (AWS Signature Version 4)" in the S3 API reference.
EX_ACCESS = "AKIAIOSFODNN7EXAMPLE"
EX_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
EX_SEED = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
EX_CHUNK_SIGS = ["ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
                 "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
                 "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9"]
EX_HEADERS = {
    "Host": "s3.amazonaws.com",
    "x-amz-date": "20130524T000000Z",
    "x-amz-storage-class": "REDUCED_REDUNDANCY",
    "Authorization": (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
        "SignedHeaders=content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;"
        f"x-amz-decoded-content-length;x-amz-storage-class,Signature={EX_SEED}"),
    "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    "Content-Encoding": "aws-chunked",
    "x-amz-decoded-content-length": "66560",
    "Content-Length": "66824",
}


class _Proto:
    """What aiohttp's StreamReader asks of its protocol (``connected``: while a reader
    waits for more data)."""

    _reading_paused = False
    connected = True

    def pause_reading(self, **kw: Any) -> None:
        pass

    def resume_reading(self, **kw: Any) -> None:
        pass


class _Keys:
    def lookup(self, access_key: str) -> AccessKey | None:
        if access_key == EX_ACCESS:
            return AccessKey(EX_ACCESS, EX_SECRET, 0, 0)
        return None


@dataclass
class FakeRequest:
    """What Authenticator and Body read from an aiohttp request."""

    method: str
    path: str
    headers: CIMultiDictProxy[str]
    content: Any = None
    rel_url: URL = field(init=False)

    def __post_init__(self) -> None:
        self.rel_url = URL(self.path)

    @property
    def content_length(self) -> int | None:
        v = self.headers.get("Content-Length")
        return None if v is None else int(v)


def _example_body(sigs: list[str]) -> bytes:
    out = b""
    for size, sig in zip((65536, 1024, 0), sigs, strict=True):
        out += f"{size:x};chunk-signature={sig}\r\n".encode() + b"a" * size + b"\r\n"
    return out




def _decode(body: bytes, headers: dict[str, str], auth: Auth) -> bytes:
    async def run() -> bytes:
        proto: Any = _Proto()
        reader = streams.StreamReader(proto, 1 << 16, loop=asyncio.get_running_loop())
        reader.feed_data(body)
        reader.feed_eof()
        req = FakeRequest("PUT", "/examplebucket/chunkObject.txt",
                          CIMultiDictProxy(CIMultiDict(headers)), reader)
        return b"".join([p async for p in Body(req, auth)])  # type: ignore[arg-type]
    return asyncio.run(run())


def _example_auth() -> Auth:
    authn = Authenticator(_Keys(), "us-east-1", max_skew=1e12)  # type: ignore[arg-type]
    req = FakeRequest("PUT", "/examplebucket/chunkObject.txt",
                      CIMultiDictProxy(CIMultiDict(EX_HEADERS)))
    return authn.authenticate(req)  # type: ignore[arg-type]


def test_aws_chunked_example_seed_signature() -> None:
    auth = _example_auth()
    assert auth.signature == EX_SEED and auth.key.access_key == EX_ACCESS
    assert auth.scope == "20130524/us-east-1/s3/aws4_request"


def test_aws_chunked_example_chunk_signatures() -> None:
    auth = _example_auth()
    prev = EX_SEED
    key = signing_key(EX_SECRET, "20130524", "us-east-1")
    empty = hashlib.sha256(b"").hexdigest()
    for size, want in zip((65536, 1024, 0), EX_CHUNK_SIGS, strict=True):
        sts = "\n".join(("AWS4-HMAC-SHA256-PAYLOAD", "20130524T000000Z", auth.scope, prev,
                         empty, hashlib.sha256(b"a" * size).hexdigest()))
        prev = sign(key, sts)
        assert prev == want
    assert _decode(_example_body(EX_CHUNK_SIGS), EX_HEADERS, auth) == b"a" * 66560


def test_aws_chunked_bad_chunk_signature_fails() -> None:
    auth = _example_auth()
    sigs = [EX_CHUNK_SIGS[0], "0" * 64, EX_CHUNK_SIGS[2]]
    with pytest.raises(S3Error) as e:
        _decode(_example_body(sigs), EX_HEADERS, auth)
    assert e.value.code == "SignatureDoesNotMatch"
    body = _example_body(EX_CHUNK_SIGS)
    with pytest.raises(S3Error) as e:  # one flipped data byte
        _decode(body[:200] + b"b" + body[201:], EX_HEADERS, auth)
    assert e.value.code == "SignatureDoesNotMatch"
    with pytest.raises(S3Error) as e:  # truncated
        _decode(body[:66000], EX_HEADERS, auth)
    assert e.value.code == "IncompleteBody"


def test_wrong_secret_and_unknown_key() -> None:
    class Wrong:
        def lookup(self, access_key: str) -> AccessKey | None:
            return AccessKey(EX_ACCESS, "not-the-secret", 0, 0)

    req = FakeRequest("PUT", "/examplebucket/chunkObject.txt",
                      CIMultiDictProxy(CIMultiDict(EX_HEADERS)))
    with pytest.raises(S3Error) as e:
        Authenticator(Wrong(), "us-east-1", 1e12).authenticate(req)  # type: ignore[arg-type]
    assert e.value.code == "SignatureDoesNotMatch"
    assert "CanonicalRequest" in e.value.fields and "StringToSign" in e.value.fields
    with pytest.raises(S3Error) as e:
        Authenticator(_Keys(), "eu-west-1", 1e12).authenticate(req)  # type: ignore[arg-type]
    assert e.value.code == "AuthorizationHeaderMalformed"
    with pytest.raises(S3Error) as e:
        Authenticator(_Keys(), "us-east-1", 900).authenticate(req)  # type: ignore[arg-type]
    assert e.value.code == "RequestTimeTooSkewed"


def test_parse_range() -> None:
    assert parse_range(None, 10) is None
    assert parse_range("bytes=0-", 10) == (0, 9)
    assert parse_range("bytes=-3", 10) == (7, 9)
    assert parse_range("bytes=-30", 10) == (0, 9)
    assert parse_range("bytes=2-4", 10) == (2, 4)
    assert parse_range("bytes=2-400", 10) == (2, 9)
    assert parse_range("bytes=4-2", 10) is None
    assert parse_range("bytes=a-b", 10) is None
    for bad in ("bytes=10-", "bytes=-0", "bytes=20-30"):
        with pytest.raises(S3Error) as e:
            parse_range(bad, 10)
        assert e.value.code == "InvalidRange" and e.value.status == 416
    with pytest.raises(S3Error):
        parse_range("bytes=0-", 0)
    assert parse_range("bytes=-5", 0) is None  # AWS: 200 with the empty object


def test_checksums_composite_and_full() -> None:
    import base64
    import zlib
    parts = [b"hello ", b"big ", b"world"]
    vals = [checksums.encode(zlib.crc32(p).to_bytes(4, "big")) for p in parts]
    full = checksums.combine_full("crc32", list(zip(vals, map(len, parts), strict=True)))
    assert full == base64.b64encode(zlib.crc32(b"".join(parts)).to_bytes(4, "big")).decode()
    comp = checksums.composite("crc32", vals)
    assert comp.endswith("-3")
    with pytest.raises(S3Error):
        checksums.decode("crc32", "not base64!")
    assert encode_layout([5, 5, 5, 2]) == "5*3,2*1"


def test_copy_source_parsing() -> None:
    assert parse_copy_source("/b/k%20x") == ("b", "k x")
    assert parse_copy_source("b/a/b/c?versionId=null") == ("b", "a/b/c")
    for bad in ("b", "/b/", "b/k?versionId=123"):
        with pytest.raises(S3Error):
            parse_copy_source(bad)


def test_xml_parser_refuses_entities_and_junk() -> None:
    bomb = (b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaaaaaaaa">'
            b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">]><Delete>&b;</Delete>')
    for body in (bomb, b"<Delete>", b"", b"<Other/>", b"x" * (xmlio.MAX_XML_BODY + 1)):
        with pytest.raises(S3Error) as e:
            xmlio.parse(body, "Delete")
        assert e.value.code == "MalformedXML"
    doc = xmlio.parse(b'<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                      b"<Object><Key>a&amp;b</Key></Object></Delete>", "Delete")
    assert xmlio.child_text(xmlio.children(doc, "Object")[0], "Key") == "a&b"


def test_every_reason_is_an_s3_error_code() -> None:
    """An ``FsError.reason`` is answered with the S3 error code it is named by, whatever the
    errno says (an ENOENT with NoSuchUpload is not NoSuchKey)."""
    for reason in Reason:
        assert reason.value in CODES, reason
        err = from_fs_error(FsError(2, "x", reason=reason))
        assert err.code == reason.value and err.status == CODES[reason.value][0]
    assert from_fs_error(FsError(2, "x")).code == "NoSuchKey"


def test_canonical_user_id_is_stable() -> None:
    assert canonical_user_id(1000) == canonical_user_id(1000) != canonical_user_id(1001)
    assert len(canonical_user_id(0)) == 64
