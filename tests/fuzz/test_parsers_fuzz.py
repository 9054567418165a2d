"""Property fuzzing of the parsers that see untrusted bytes first: SigV4 headers and presigned
queries, the Range header, the XML request bodies, object keys and bucket names.

The property each time: the parser answers or raises its module's own error type
(:class:`~tierd.s3.errors.S3Error`, :class:`~tierd.errors.FsError`) -- never anything else,
which the S3 door would turn into a 500.  Inputs mix pure noise with near-valid structure
(right field names, wrong values), which is where parsers break.  Bounded: a few hundred
examples each, no deadline flakiness on a shared CI machine.
"""

from __future__ import annotations

import string
import time
from typing import Any
from urllib.parse import quote

from aiohttp.test_utils import make_mocked_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from tierd.acl.keys import KeyStore
from tierd.acl.users import Directory
from tierd.errors import FsError
from tierd.meta import MetaStore
from tierd.namespace.names import check_bucket_name, check_name, split_key
from tierd.s3 import xmlio
from tierd.s3.auth import ALGORITHM, Auth, Authenticator, parse_amz_date
from tierd.s3.common import parse_copy_source, parse_range
from tierd.s3.errors import S3Error
from tierd.s3.multipart import _parse_complete

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# header values as aiohttp hands them over: decoded bytes without CR/LF
header_text = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)),
                      max_size=200)
token = st.text(string.ascii_letters + string.digits + "-_/.;=,+% ", max_size=60)


def _authenticator() -> tuple[Authenticator, str]:
    meta = MetaStore.open_memory()
    keys = KeyStore(meta)
    d = Directory(keys)
    d.add_user("fuzz", 4000)
    new = d.add_key("fuzz")
    return Authenticator(keys, "us-east-1", 900.0), new.key.access_key


AUTH, ACCESS = _authenticator()

def _now() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


# a valid-looking request (right key, date, scope and fields; only the signature is random)
# of which hypothesis replaces any subset of fields with noise: the deep paths (credential
# scope, clock skew, key lookup, canonical request) are reached, not only the first check
HEADER_FIELDS = ("algorithm", "access", "date", "region", "service", "terminal",
                 "signed_headers", "signature", "separator", "x-amz-date", "sha")
QUERY_FIELDS = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-SignedHeaders",
                "X-Amz-Signature", "X-Amz-Date", "X-Amz-Expires", "X-Amz-Content-Sha256",
                "extra")
noise = st.one_of(header_text, token, st.just(""), st.integers(-10**30, 10**30).map(str),
                  st.sampled_from([ALGORITHM, "aws4_request", "s3", "us-east-1", "host",
                                   "UNSIGNED-PAYLOAD", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
                                   "STREAMING-UNSIGNED-PAYLOAD-TRAILER", "604801", "-1"]))


def _signed_header_request(over: dict[str, str]) -> dict[str, str]:
    now = _now()
    f = {"algorithm": ALGORITHM, "access": ACCESS, "date": now[:8], "region": "us-east-1",
         "service": "s3", "terminal": "aws4_request",
         "signed_headers": "host;x-amz-content-sha256;x-amz-date", "signature": "ab" * 32,
         "separator": ", ", "x-amz-date": now, "sha": "UNSIGNED-PAYLOAD", **over}
    sep = f["separator"]
    return {"Host": "127.0.0.1:9000", "X-Amz-Date": f["x-amz-date"],
            "X-Amz-Content-SHA256": f["sha"],
            "Authorization": f"{f['algorithm']} Credential={f['access']}/{f['date']}/"
                             f"{f['region']}/{f['service']}/{f['terminal']}{sep}"
                             f"SignedHeaders={f['signed_headers']}{sep}"
                             f"Signature={f['signature']}"}


def _presigned_query(over: dict[str, str]) -> list[tuple[str, str]]:
    now = _now()
    q = {"X-Amz-Algorithm": ALGORITHM,
         "X-Amz-Credential": f"{ACCESS}/{now[:8]}/us-east-1/s3/aws4_request",
         "X-Amz-SignedHeaders": "host", "X-Amz-Signature": "cd" * 32, "X-Amz-Date": now,
         "X-Amz-Expires": "3600", **over}
    return list(q.items())


def _request(method: str, path: str, headers: dict[str, str]) -> Any:
    return make_mocked_request(method, path, headers=CIMultiDict(headers))


def _check(request: Any) -> None:
    try:
        got = AUTH.authenticate(request)
    except S3Error as e:
        assert e.status in (400, 403), e
        return
    assert got is None or isinstance(got, Auth)


def _qs(params: list[tuple[str, str]]) -> str:
    return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in params)


path_text = st.text(string.printable.replace("?", "").replace("#", ""), max_size=40)


@FUZZ
@given(method=st.sampled_from(["GET", "PUT", "POST", "DELETE", "HEAD"]), path=path_text,
       over=st.dictionaries(st.sampled_from(HEADER_FIELDS), noise, max_size=4),
       extra=st.lists(st.tuples(token, token), max_size=4))
def test_sigv4_header_parser(method: str, path: str, over: dict[str, str],
                             extra: list[tuple[str, str]]) -> None:
    qs = _qs(extra)
    target = "/" + quote(path, safe="/") + ("?" + qs if qs else "")
    _check(_request(method, target, _signed_header_request(over)))


@FUZZ
@given(method=st.sampled_from(["GET", "PUT", "HEAD"]), path=path_text,
       over=st.dictionaries(st.sampled_from(QUERY_FIELDS), noise, max_size=4),
       drop=st.sets(st.sampled_from(QUERY_FIELDS), max_size=2),
       header=st.none() | header_text)
def test_sigv4_presigned_parser(method: str, path: str, over: dict[str, str],
                                drop: set[str], header: str | None) -> None:
    params = [(k, v) for k, v in _presigned_query(over) if k not in drop]
    headers = {"Host": "127.0.0.1:9000"}
    if header is not None:
        headers["X-Amz-Content-SHA256"] = header
    _check(_request(method, "/" + quote(path, safe="/") + "?" + _qs(params), headers))


@FUZZ
@given(authorization=header_text, date=st.none() | header_text, params=st.lists(
    st.tuples(st.sampled_from(QUERY_FIELDS) | token, noise), max_size=6))
def test_sigv4_noise(authorization: str, date: str | None,
                     params: list[tuple[str, str]]) -> None:
    headers = {"Host": "h", "Authorization": authorization}
    if date is not None:
        headers["X-Amz-Date"] = date
    qs = _qs(params)
    _check(_request("GET", "/b/k" + ("?" + qs if qs else ""), headers))
    del headers["Authorization"]
    _check(_request("GET", "/b/k" + ("?" + qs if qs else ""), headers))


@FUZZ
@given(value=header_text)
def test_amz_date_parser(value: str) -> None:
    ts = parse_amz_date(value)
    assert ts is None or isinstance(ts, float)


@FUZZ
@given(value=st.one_of(header_text, st.builds(
    lambda unit, a, b: f"{unit}={a}-{b}",
    st.sampled_from(["bytes", "BYTES", " bytes", "items"]),
    st.one_of(st.integers(-10, 10**20).map(str), st.just(""), token),
    st.one_of(st.integers(-10, 10**20).map(str), st.just(""), token))),
    size=st.integers(0, 10**12))
def test_range_parser(value: str, size: int) -> None:
    try:
        got = parse_range(value, size)
    except S3Error as e:
        assert e.code == "InvalidRange"
        return
    if got is not None:
        first, last = got
        assert 0 <= first <= last < size


@FUZZ
@given(value=header_text)
def test_copy_source_parser(value: str) -> None:
    try:
        bucket, key = parse_copy_source(value)
    except S3Error as e:
        assert e.code == "InvalidArgument"
        return
    assert bucket and key


# -- XML bodies --------------------------------------------------------------------------

xml_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
element = st.recursive(
    st.builds(lambda tag, text: f"<{tag}>{text}</{tag}>",
              st.sampled_from(["Object", "Key", "VersionId", "Quiet", "Part", "PartNumber",
                               "ETag", "ChecksumCRC32", "LocationConstraint", "x"]),
              xml_text.map(lambda s: s.replace("<", "&lt;").replace("&", "&amp;"))),
    lambda children: st.builds(lambda tag, kids: f"<{tag}>{''.join(kids)}</{tag}>",
                               st.sampled_from(["Object", "Part", "Delete",
                                                "CompleteMultipartUpload"]),
                               st.lists(children, max_size=5)),
    max_leaves=20)
xml_body = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda root, kids, decl: (decl + f"<{root}>{''.join(kids)}</{root}>").encode(),
              st.sampled_from(["Delete", "CompleteMultipartUpload",
                               "CreateBucketConfiguration", "Other"]),
              st.lists(element, max_size=6),
              st.sampled_from(["", '<?xml version="1.0" encoding="UTF-8"?>',
                               '<?xml version="1.0" encoding="latin-1"?>',
                               '<?xml version="1.0" encoding="nope"?>',
                               '<!DOCTYPE x [<!ENTITY e "zz">]>'])),
)


@FUZZ
@given(body=xml_body)
def test_delete_objects_body(body: bytes) -> None:
    """What DeleteObjects does with its body: parse, then walk Objects/Key/VersionId."""
    try:
        doc = xmlio.parse(body, "Delete")
    except S3Error as e:
        assert e.code == "MalformedXML"
        return
    for obj in xmlio.children(doc, "Object"):
        assert isinstance(xmlio.child_text(obj, "Key", ""), str)
        xmlio.child_text(obj, "VersionId")
    xmlio.child_text(doc, "Quiet", "false")


@FUZZ
@given(body=xml_body)
def test_complete_multipart_body(body: bytes) -> None:
    try:
        parts = _parse_complete(body)
    except S3Error as e:
        assert e.code == "MalformedXML"
        return
    assert parts and all(isinstance(n, int) and isinstance(etag, str) for n, etag, _ in parts)


@FUZZ
@given(body=xml_body)
def test_create_bucket_configuration_body(body: bytes) -> None:
    try:
        doc = xmlio.parse(body, "CreateBucketConfiguration")
    except S3Error as e:
        assert e.code == "MalformedXML"
        return
    xmlio.child_text(doc, "LocationConstraint")


# -- keys and names ----------------------------------------------------------------------

# keys as the S3 door produces them: URL bytes decoded as UTF-8 with surrogateescape
door_key = st.one_of(
    st.binary(max_size=1100).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.lists(st.sampled_from(["a", "..", ".", "", "b" * 256, "é", "\x00", "x/"]),
             max_size=6).map("/".join),
)


@FUZZ
@given(key=door_key)
def test_key_validation(key: str) -> None:
    try:
        segments, marker = split_key(key)
    except FsError as e:
        assert e.errno is not None
        return
    raw = key.encode("utf-8", "surrogateescape")
    assert b"/".join(segments) + (b"/" if marker else b"") == raw
    for seg in segments:
        assert seg not in (b"", b".", b"..") and b"\0" not in seg and len(seg) <= 255
        check_name(seg)


@FUZZ
@given(name=st.one_of(st.text(max_size=70), st.from_regex(r"[a-z0-9.-]{1,70}",
                                                         fullmatch=True)))
def test_bucket_name_validation(name: str) -> None:
    try:
        check_bucket_name(name)
    except FsError:
        return
    assert 3 <= len(name) <= 63 and ".." not in name and "/" not in name
