"""Objects through real boto3: round trips, metadata, ranges, conditionals, copies, deletes."""

from __future__ import annotations

import datetime
import hashlib
import os
import threading
import time
from typing import Any

import requests

from .conftest import Daemon, assert_error


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def test_put_get_round_trip_bytes_and_etag(s3: Any, bucket: str) -> None:
    for size in (0, 1, 65535, 65536 * 3 + 7, 3 << 20):
        data = os.urandom(size)
        r = s3.put_object(Bucket=bucket, Key=f"obj-{size}", Body=data)
        assert r["ETag"] == f'"{md5(data)}"'
        g = s3.get_object(Bucket=bucket, Key=f"obj-{size}")
        assert g["Body"].read() == data
        assert g["ETag"] == f'"{md5(data)}"'
        assert g["ContentLength"] == size
        assert g["AcceptRanges"] == "bytes"
        h = s3.head_object(Bucket=bucket, Key=f"obj-{size}")
        assert h["ContentLength"] == size and h["ETag"] == r["ETag"]


def test_headers_as_aws_sends_them(daemon: Daemon, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"abc")
    g = s3.get_object(Bucket=bucket, Key="k")
    h = g["ResponseMetadata"]["HTTPHeaders"]
    assert len(h["x-amz-request-id"]) == 16
    assert h["etag"] == f'"{md5(b"abc")}"'
    assert h["content-length"] == "3"
    assert h["last-modified"].endswith(" GMT") and h["date"].endswith(" GMT")
    # RFC 1123 dates, parseable as such
    datetime.datetime.strptime(h["last-modified"], "%a, %d %b %Y %H:%M:%S GMT")
    assert h["content-type"] == "binary/octet-stream"  # the S3 default
    lm = g["LastModified"].timestamp()
    assert abs(lm - time.time()) < 60


def test_system_and_user_metadata_stored_and_returned(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="doc.json", Body=b"{}", ContentType="application/json",
                  ContentEncoding="identity", ContentDisposition='attachment; filename="x"',
                  CacheControl="max-age=60", ContentLanguage="en",
                  Metadata={"Owner-Name": "alice", "n": "1"})
    h = s3.head_object(Bucket=bucket, Key="doc.json")
    assert h["ContentType"] == "application/json"
    assert h["ContentEncoding"] == "identity"
    assert h["ContentDisposition"] == 'attachment; filename="x"'
    assert h["CacheControl"] == "max-age=60"
    assert h["ContentLanguage"] == "en"
    assert h["Metadata"] == {"owner-name": "alice", "n": "1"}
    # an overwrite replaces metadata
    s3.put_object(Bucket=bucket, Key="doc.json", Body=b"[]")
    h = s3.head_object(Bucket=bucket, Key="doc.json")
    assert h["Metadata"] == {} and h["ContentType"] == "binary/octet-stream"


def test_checksum_headers_stored_and_returned_with_checksum_mode(s3: Any, bucket: str) -> None:
    data = os.urandom(100_000)
    for alg in ("CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"):
        r = s3.put_object(Bucket=bucket, Key=f"c-{alg}", Body=data, ChecksumAlgorithm=alg)
        value = r[f"Checksum{alg}"]
        h = s3.head_object(Bucket=bucket, Key=f"c-{alg}", ChecksumMode="ENABLED")
        assert h[f"Checksum{alg}"] == value
        assert h["ChecksumType"] == "FULL_OBJECT"
        plain = s3.head_object(Bucket=bucket, Key=f"c-{alg}")
        assert f"Checksum{alg}" not in plain
        # botocore validates the returned checksum against the body
        g = s3.get_object(Bucket=bucket, Key=f"c-{alg}", ChecksumMode="ENABLED")
        assert g["Body"].read() == data and g[f"Checksum{alg}"] == value
    # a range GET carries no whole-object checksum
    g = s3.get_object(Bucket=bucket, Key="c-CRC32", Range="bytes=0-9", ChecksumMode="ENABLED")
    assert "ChecksumCRC32" not in g and g["Body"].read() == data[:10]


def test_ranges(s3: Any, bucket: str) -> None:
    data = bytes(range(256)) * 40  # 10240 bytes
    s3.put_object(Bucket=bucket, Key="r", Body=data)
    cases = {"bytes=0-0": data[:1], "bytes=10-19": data[10:20], "bytes=10000-": data[10000:],
             "bytes=-100": data[-100:], "bytes=10000-99999": data[10000:],
             "bytes=-99999": data}
    for rng, want in cases.items():
        g = s3.get_object(Bucket=bucket, Key="r", Range=rng)
        assert g["ResponseMetadata"]["HTTPStatusCode"] == 206, rng
        assert g["Body"].read() == want, rng
        assert g["ContentLength"] == len(want)
        first = len(data) - len(want) if rng.startswith("bytes=-") else int(rng[6:].split("-")[0])
        assert g["ContentRange"] == f"bytes {first}-{first + len(want) - 1}/{len(data)}"
    resp = assert_error("InvalidRange", 416, s3.get_object, Bucket=bucket, Key="r",
                        Range="bytes=10240-")
    assert resp["ResponseMetadata"]["HTTPHeaders"]["content-range"] == "bytes */10240"
    # malformed or multiple ranges are ignored: the whole object
    for rng in ("bytes=5-1", "items=0-1", "bytes=0-1,5-6"):
        g = s3.get_object(Bucket=bucket, Key="r", Range=rng)
        assert g["ResponseMetadata"]["HTTPStatusCode"] == 200 and g["Body"].read() == data


def test_conditionals(s3: Any, bucket: str) -> None:
    r = s3.put_object(Bucket=bucket, Key="c", Body=b"x")
    etag = r["ETag"]
    lm = s3.head_object(Bucket=bucket, Key="c")["LastModified"]
    before = lm - datetime.timedelta(hours=1)
    after = lm  # not modified since its own Last-Modified (future dates are ignored)
    ok = [{"IfMatch": etag}, {"IfMatch": "*"}, {"IfNoneMatch": '"other"'},
          {"IfModifiedSince": before}, {"IfUnmodifiedSince": after},
          {"IfMatch": etag, "IfUnmodifiedSince": before},  # If-Match wins
          ]
    for kw in ok:
        assert s3.get_object(Bucket=bucket, Key="c", **kw)["Body"].read() == b"x", kw
    for kw in ({"IfMatch": '"nope"'}, {"IfUnmodifiedSince": before}):
        assert_error("PreconditionFailed", 412, s3.get_object, Bucket=bucket, Key="c", **kw)
        assert_error("412", 412, s3.head_object, Bucket=bucket, Key="c", **kw)
    for kw in ({"IfNoneMatch": etag}, {"IfNoneMatch": "*"}, {"IfModifiedSince": after},
               {"IfNoneMatch": etag, "IfModifiedSince": before}):
        resp = assert_error("304", 304, s3.get_object, Bucket=bucket, Key="c", **kw)
        assert resp["ResponseMetadata"]["HTTPHeaders"]["etag"] == etag


def test_response_overrides(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="o", Body=b"x", ContentType="text/plain")
    g = s3.get_object(Bucket=bucket, Key="o", ResponseContentType="image/png",
                      ResponseContentDisposition="inline", ResponseCacheControl="no-cache",
                      ResponseContentLanguage="fr", ResponseContentEncoding="gzip",
                      ResponseExpires=datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC))
    assert g["ContentType"] == "image/png" and g["ContentDisposition"] == "inline"
    assert g["CacheControl"] == "no-cache" and g["ContentLanguage"] == "fr"
    assert g["ContentEncoding"] == "gzip"
    assert g["ResponseMetadata"]["HTTPHeaders"]["expires"].startswith("Tue, 01 Jan 2030")


def test_version_id_null_is_accepted(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="v", Body=b"1")
    g = s3.get_object(Bucket=bucket, Key="v", VersionId="null")
    assert g["Body"].read() == b"1" and g["VersionId"] == "null"
    assert s3.head_object(Bucket=bucket, Key="v", VersionId="null")["VersionId"] == "null"
    assert_error("InvalidArgument", 400, s3.get_object, Bucket=bucket, Key="v",
                 VersionId="3HL4kqtJlcpXroDTDmJ")
    s3.delete_object(Bucket=bucket, Key="v", VersionId="null")
    assert_error("NoSuchKey", 404, s3.get_object, Bucket=bucket, Key="v")


def test_delete_and_delete_objects(s3: Any, bucket: str) -> None:
    for i in range(5):
        s3.put_object(Bucket=bucket, Key=f"d/{i}", Body=b"x")
    s3.delete_object(Bucket=bucket, Key="d/0")
    s3.delete_object(Bucket=bucket, Key="d/0")  # missing: still 204
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [
        {"Key": "d/1"}, {"Key": "d/2", "VersionId": "null"}, {"Key": "missing"},
        {"Key": "bad//key"}, {"Key": "d/3", "VersionId": "nope"}]})
    assert sorted(d["Key"] for d in r["Deleted"]) == ["d/1", "d/2", "missing"]
    errors = {e["Key"]: e["Code"] for e in r["Errors"]}
    assert errors == {"bad//key": "InvalidArgument", "d/3": "NoSuchVersion"}
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "d/3"}], "Quiet": True})
    assert "Deleted" not in r and "Errors" not in r
    left = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert left == ["d/4"]


def test_delete_objects_limit_is_1000(s3: Any, bucket: str) -> None:
    objs = [{"Key": f"k{i}"} for i in range(1001)]
    assert_error("MalformedXML", 400, s3.delete_objects, Bucket=bucket,
                 Delete={"Objects": objs})
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": objs[:1000], "Quiet": True})
    assert "Errors" not in r


def test_copy_object_directives_and_conditionals(s3: Any, bucket: str) -> None:
    data = os.urandom(200_000)
    src = s3.put_object(Bucket=bucket, Key="src", Body=data, ContentType="text/x",
                        Metadata={"a": "1"})
    r = s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"})
    assert r["CopyObjectResult"]["ETag"] == src["ETag"]
    h = s3.head_object(Bucket=bucket, Key="dst")
    assert h["ContentType"] == "text/x" and h["Metadata"] == {"a": "1"}
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == data
    s3.copy_object(Bucket=bucket, Key="dst2", CopySource=f"{bucket}/src",
                   MetadataDirective="REPLACE", ContentType="text/y", Metadata={"b": "2"})
    h = s3.head_object(Bucket=bucket, Key="dst2")
    assert h["ContentType"] == "text/y" and h["Metadata"] == {"b": "2"}
    # onto itself: only with REPLACE
    assert_error("InvalidRequest", 400, s3.copy_object, Bucket=bucket, Key="src",
                 CopySource=f"{bucket}/src")
    s3.copy_object(Bucket=bucket, Key="src", CopySource=f"{bucket}/src",
                   MetadataDirective="REPLACE", Metadata={"c": "3"})
    assert s3.head_object(Bucket=bucket, Key="src")["Metadata"] == {"c": "3"}
    # copy-source conditionals answer 412 (against the source as it is now: the copy onto
    # itself above may have landed in a later second than ``h``)
    lm = s3.head_object(Bucket=bucket, Key="src")["LastModified"]
    for kw in ({"CopySourceIfMatch": '"nope"'}, {"CopySourceIfNoneMatch": src["ETag"]},
               {"CopySourceIfModifiedSince": lm},
               {"CopySourceIfUnmodifiedSince": lm - datetime.timedelta(hours=1)}):
        assert_error("PreconditionFailed", 412, s3.copy_object, Bucket=bucket, Key="dst3",
                     CopySource=f"{bucket}/src", **kw)
    s3.copy_object(Bucket=bucket, Key="dst3", CopySource=f"{bucket}/src",
                   CopySourceIfMatch=src["ETag"])
    assert_error("NoSuchKey", 404, s3.copy_object, Bucket=bucket, Key="x",
                 CopySource=f"{bucket}/missing")
    assert_error("NoSuchBucket", 404, s3.copy_object, Bucket=bucket, Key="x",
                 CopySource="no-such-bucket-zz/src")
    # copy across buckets, keys with odd characters
    s3.put_object(Bucket=bucket, Key="sp ace/ü+%?#", Body=b"odd")
    s3.copy_object(Bucket=bucket, Key="copy of odd", CopySource={"Bucket": bucket,
                                                                 "Key": "sp ace/ü+%?#"})
    assert s3.get_object(Bucket=bucket, Key="copy of odd")["Body"].read() == b"odd"


def test_failed_put_keeps_the_previous_object(daemon: Daemon, s3: Any, bucket: str) -> None:
    old = os.urandom(50_000)
    s3.put_object(Bucket=bucket, Key="keep", Body=old)
    # a wrong Content-MD5: BadDigest, nothing replaced
    import base64
    bad = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    assert_error("BadDigest", 400, s3.put_object, Bucket=bucket, Key="keep",
                 Body=os.urandom(50_000), ContentMD5=bad)
    assert s3.get_object(Bucket=bucket, Key="keep")["Body"].read() == old
    # a wrong checksum header: BadDigest
    assert_error("BadDigest", 400, s3.put_object, Bucket=bucket, Key="keep",
                 Body=os.urandom(50_000), ChecksumCRC32="AAAAAA==")
    assert s3.get_object(Bucket=bucket, Key="keep")["Body"].read() == old
    # the client disconnects half-way through the body
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "keep"})
    import socket
    from urllib.parse import urlsplit
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port)) as sock:
        sock.sendall(f"PUT {u.path}?{u.query} HTTP/1.1\r\nHost: {u.netloc}\r\n"
                     f"Content-Length: 1000000\r\n\r\n".encode() + b"x" * 300_000)
        time.sleep(0.3)
    time.sleep(0.3)
    assert s3.get_object(Bucket=bucket, Key="keep")["Body"].read() == old
    # nothing left behind in the staging directory
    staged = list((daemon.data_dir / "hot" / "tmp").iterdir())
    assert staged == []


def test_keys_that_cannot_be_paths_are_refused(s3: Any, bucket: str) -> None:
    for key in ("a//b", "a/./b", "a/../b", "./a", "a/.."):
        resp = assert_error("InvalidArgument", 400, s3.put_object, Bucket=bucket, Key=key,
                            Body=b"x")
        assert "segment" in resp["Error"]["Message"]
    assert_error("KeyTooLongError", 400, s3.put_object, Bucket=bucket, Key="k" * 1025,
                 Body=b"x")
    assert_error("KeyTooLongError", 400, s3.put_object, Bucket=bucket,
                 Key="a/" + "s" * 256, Body=b"x")
    # a and a/b cannot both exist
    s3.put_object(Bucket=bucket, Key="file", Body=b"x")
    assert_error("XTierdParentIsObject", 409, s3.put_object, Bucket=bucket,
                 Key="file/child", Body=b"x")
    s3.put_object(Bucket=bucket, Key="dir/child", Body=b"x")
    assert_error("XTierdObjectExistsAsDirectory", 409, s3.put_object, Bucket=bucket,
                 Key="dir", Body=b"x")
    # nothing was renamed: only the two keys exist
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["dir/child", "file"]


def test_directory_markers(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="empty/dir/", Body=b"")
    lst = s3.list_objects_v2(Bucket=bucket)["Contents"]
    assert [(o["Key"], o["Size"]) for o in lst] == [("empty/dir/", 0)]
    h = s3.head_object(Bucket=bucket, Key="empty/dir/")
    assert h["ContentLength"] == 0 and h["ETag"] == f'"{md5(b"")}"'
    assert s3.get_object(Bucket=bucket, Key="empty/dir/")["Body"].read() == b""
    assert_error("InvalidArgument", 400, s3.put_object, Bucket=bucket, Key="m/",
                 Body=b"data")
    s3.delete_object(Bucket=bucket, Key="empty/dir/")


def test_put_is_visible_at_once_to_list_and_get(s3: Any, bucket: str) -> None:
    """Unified namespace through a second S3 path (the mount is another door's issue)."""
    for i in range(20):
        data = os.urandom(1000 + i)
        s3.put_object(Bucket=bucket, Key=f"n/{i:02d}", Body=data)
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="n/")["Contents"]]
        assert keys[-1] == f"n/{i:02d}"
        assert s3.get_object(Bucket=bucket, Key=f"n/{i:02d}")["Body"].read() == data


def test_concurrent_puts_and_gets(daemon: Daemon, bucket: str) -> None:
    errors: list[BaseException] = []
    payloads = {f"p{i}": os.urandom(2 << 20) for i in range(6)}

    def work(key: str) -> None:
        try:
            c = daemon.client()
            c.put_object(Bucket=bucket, Key=key, Body=payloads[key])
            for _ in range(3):
                assert c.get_object(Bucket=bucket, Key=key)["Body"].read() == payloads[key]
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_conditional_put(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="once", Body=b"1", IfNoneMatch="*")
    assert_error("PreconditionFailed", 412, s3.put_object, Bucket=bucket, Key="once",
                 Body=b"2", IfNoneMatch="*")
    etag = s3.head_object(Bucket=bucket, Key="once")["ETag"]
    s3.put_object(Bucket=bucket, Key="once", Body=b"3", IfMatch=etag)
    assert_error("PreconditionFailed", 412, s3.put_object, Bucket=bucket, Key="once",
                 Body=b"4", IfMatch=etag)
    assert s3.get_object(Bucket=bucket, Key="once")["Body"].read() == b"3"


def test_presigned_get_and_put(s3: Any, bucket: str) -> None:
    put = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "pre"},
                                    ExpiresIn=60)
    r = requests.put(put, data=b"presigned body", timeout=10)
    assert r.status_code == 200, r.text
    get = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "pre"},
                                    ExpiresIn=60)
    r = requests.get(get, timeout=10)
    assert r.status_code == 200 and r.content == b"presigned body"
    assert r.headers["ETag"] == f'"{md5(b"presigned body")}"'
    r = requests.get(get, headers={"Range": "bytes=0-8"}, timeout=10)
    assert r.status_code == 206 and r.content == b"presigned"
    # tampering with the URL breaks the signature
    r = requests.get(get.replace("pre?", "prf?"), timeout=10)
    assert r.status_code == 403 and b"<Code>SignatureDoesNotMatch</Code>" in r.content


def _racing_puts(
    s3: Any, bucket: str, key: str, n: int, header: dict[str, str], round_: int
) -> list[int]:
    """``n`` conditional PUTs whose bodies are in flight at the same time: every request
    passes the gateway's early check before any of them commits, so only the check inside
    the namespace's commit can keep all but one out.  Their HTTP statuses.  Bodies differ
    from every other round's, so a winner always changes the ETag (a later If-Match round
    won by the same body would otherwise leave the ETag matching for a second writer)."""
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": key},
                                    ExpiresIn=60)
    barrier = threading.Barrier(n)
    statuses: list[int] = []

    def body(i: int) -> Any:
        yield b"x" * 1000
        barrier.wait(10)
        time.sleep(0.3)
        yield f"round {round_} writer {i}".encode() * 100

    def put(i: int) -> None:
        r = requests.put(url, data=body(i), headers=header, timeout=30)
        statuses.append(r.status_code)
        if r.status_code != 200:
            assert b"<Code>PreconditionFailed</Code>" in r.content, r.content

    threads = [threading.Thread(target=put, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return sorted(statuses)


def test_conditional_puts_are_atomic_with_the_commit(s3: Any, bucket: str) -> None:
    assert _racing_puts(s3, bucket, "race", 4, {"If-None-Match": "*"}, 1) == [200, 412, 412, 412]
    etag = s3.head_object(Bucket=bucket, Key="race")["ETag"]
    assert _racing_puts(s3, bucket, "race", 4, {"If-Match": etag}, 2) == [200, 412, 412, 412]
    assert s3.head_object(Bucket=bucket, Key="race")["ETag"] != etag
    # If-Match on a key that does not exist: NoSuchKey, as AWS
    assert_error("NoSuchKey", 404, s3.put_object, Bucket=bucket, Key="absent", Body=b"x",
                 IfMatch=etag)


def test_delete_objects_in_a_missing_bucket(s3: Any) -> None:
    assert_error("NoSuchBucket", 404, s3.delete_objects, Bucket="no-such-bucket-d",
                 Delete={"Objects": [{"Key": "k"}]})
