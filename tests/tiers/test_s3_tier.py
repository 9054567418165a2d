"""What only the s3:// engine has: outages of a real server process, botocore's retries,
error translation, the per-bucket layout, Content-MD5 checks."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import os
import signal
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from moto_server import MotoServer, running_moto

from tierd.config import load_config
from tierd.tiers import (
    ObjectChanged,
    ObjectNotFound,
    TierError,
    TierThrottled,
    TierUnavailable,
    object_tier_from_config,
    open_object_tier,
)
from tierd.tiers.health import Health
from tierd.tiers.s3_tier import S3ObjectTier

from .conftest import COLD_BUCKET, pattern, s3_settings

MIB = 1 << 20


def src(tmp_path: Path, data: bytes, name: str = "src") -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


@pytest.fixture
def own_moto() -> Iterator[MotoServer]:
    """A server of this test's own, free to be stopped and restarted."""
    with running_moto() as server:
        yield server


# --- outages of the server process ----------------------------------------------------------


async def test_unavailable_while_stopped_and_recovers_after_restart(
    own_moto: MotoServer, tmp_path: Path
) -> None:
    own_moto.client().create_bucket(Bucket="cold")
    tier = open_object_tier("s3://cold/pfx", **s3_settings(own_moto, max_attempts=2,
                                                           connect_timeout=1.0))
    try:
        data = pattern(100_000)
        await tier.put_file("bkt/k", src(tmp_path, data), len(data))
        own_moto.stop()
        big = src(tmp_path, pattern(7 * MIB), "big")
        fd = os.open(tmp_path / "dst", os.O_RDWR | os.O_CREAT)
        calls: list[Any] = [
            tier.head("bkt/k"), tier.get_range("bkt/k", 0, 10), tier.get_range("bkt/k", 0, 3 * MIB),
            tier.read_into("bkt/k", 0, 10, fd, 0), tier.put_file("bkt/new", big, 100),
            tier.put_file("bkt/new", big, 7 * MIB), tier.delete("bkt/k"),
            tier.copy("bkt/k", "bkt/k2"), tier.list("bkt/"), tier.probe(),
        ]
        started = time.monotonic()
        for call in calls:
            with pytest.raises(TierUnavailable) as e:
                await call
            assert own_moto.url in str(e.value) or "unreachable" in str(e.value)
        os.close(fd)
        assert time.monotonic() - started < 20  # a short retry budget, not a hang
        # the store comes back (empty: moto keeps state in memory)
        own_moto.restart()
        with pytest.raises(TierUnavailable, match="does not exist"):
            await tier.probe()  # the configured bucket is missing: misconfiguration, not 404
        with pytest.raises(TierUnavailable):
            await tier.put_file("bkt/k", src(tmp_path, data), len(data))
        own_moto.client().create_bucket(Bucket="cold")
        await tier.probe()
        await tier.put_file("bkt/k", src(tmp_path, data), len(data))
        assert await tier.get_range("bkt/k", 0, len(data)) == data
    finally:
        await tier.close()


async def test_hung_store_times_out_and_shows_unreachable(own_moto: MotoServer,
                                                           tmp_path: Path) -> None:
    """SIGSTOP: the server accepts connections and never answers.  A metadata call gives
    up after ``call_timeout`` (TierUnavailable, not a hang), the store reads as
    unreachable with the reason, and the first answer after SIGCONT makes it reachable."""
    own_moto.client().create_bucket(Bucket="cold")
    tier = open_object_tier("s3://cold/pfx", **s3_settings(own_moto, max_attempts=1,
                                                           read_timeout=30.0))
    tier.call_timeout = 1.5
    assert own_moto._proc is not None
    try:
        await tier.put_file("bkt/k", src(tmp_path, b"data"), 4)
        assert tier.reachable()
        os.kill(own_moto._proc.pid, signal.SIGSTOP)
        try:
            for call in (tier.head("bkt/k"), tier.list("bkt/"), tier.delete("bkt/none"),
                         tier.probe()):
                started = time.monotonic()
                with pytest.raises(TierUnavailable, match=r"did not answer within 1\.5 s"):
                    await call
                assert time.monotonic() - started < 4
            assert not tier.reachable()
            assert "did not answer" in (tier.describe_health()["reason"] or "")
        finally:
            os.kill(own_moto._proc.pid, signal.SIGCONT)
        for _ in range(100):  # the calls stuck in threads drain; then an answer
            try:
                await tier.probe()
                break
            except TierUnavailable:
                await asyncio.sleep(0.1)
        assert tier.reachable() and tier.describe_health()["reason"] is None
        assert await tier.get_range("bkt/k", 0, 4) == b"data"
    finally:
        await tier.close()


def test_hung_call_counts_as_unreachable_before_it_returns() -> None:
    """A call in flight longer than the timeout, with no answer since it began, makes the
    store unreachable even though nothing has failed yet."""
    h = Health()
    h.ok_at -= 10.0  # the last answer, 10 s ago
    call = h.begin()
    h._calls[call] -= 5.0  # a call began 5 s ago
    assert not h.reachable(2.0) and h.describe(2.0)["reason"].startswith("a call has not")
    h.progress()  # a transfer moved: the store answers
    assert h.reachable(2.0)
    h.end(call, True)
    h.end(h.begin(), False, "refused")
    assert not h.reachable(2.0) and h.describe(2.0)["reason"] == "refused"
    h.end(h.begin(), True)
    assert h.reachable(2.0)


async def test_create_bucket_recreates_it_after_restart(own_moto: MotoServer,
                                                         tmp_path: Path) -> None:
    tier = open_object_tier("s3://fresh-bucket", **s3_settings(own_moto, create_bucket=True))
    try:
        await tier.probe()  # creates it
        await tier.put_file("bkt/a", src(tmp_path, b"abc"), 3)
        own_moto.restart()
        await tier.put_file("bkt/a", src(tmp_path, b"abcd"), 4)  # NoSuchBucket -> create, retry
        assert await tier.get_range("bkt/a", 0, 10) == b"abcd"
    finally:
        await tier.close()


async def test_server_killed_mid_transfer_gives_tier_unavailable(own_moto: MotoServer,
                                                                 tmp_path: Path) -> None:
    own_moto.client().create_bucket(Bucket="cold")
    tier = open_object_tier("s3://cold", **s3_settings(
        own_moto, max_attempts=2, connect_timeout=1.0, read_timeout=2.0, concurrency=2))
    try:
        data = pattern(24 * MIB, seed=3)
        await tier.put_file("bkt/big", src(tmp_path, data), len(data))
        fd = os.open(tmp_path / "dst", os.O_RDWR | os.O_CREAT)
        try:
            task = asyncio.ensure_future(tier.read_into("bkt/big", 0, len(data), fd, 0))
            await asyncio.sleep(0.02)
            own_moto.stop(kill=True)
            try:
                n = await task
                assert n == len(data)  # finished before the kill: fine too
            except Exception as e:  # never a raw botocore/urllib3 error
                assert isinstance(e, TierUnavailable), repr(e)
        finally:
            os.close(fd)
    finally:
        await tier.close()


# --- retries with backoff (botocore's), against a flaky endpoint ----------------------------


class _Flaky(http.server.BaseHTTPRequestHandler):
    """GETs fail ``fail`` times with ``status``/``code``, then succeed; counts requests.
    PUTs are recorded in ``puts``."""

    protocol_version = "HTTP/1.1"  # answers botocore's "Expect: 100-continue" at once
    fail = 0
    status = 503
    code = "SlowDown"
    count = 0
    body = b"hello from a flaky store"

    puts: list[tuple[str, str, bytes]]

    def log_message(self, *args: object) -> None:
        pass

    def do_PUT(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n)
        type(self).puts.append((self.path, self.headers.get("Content-MD5", ""), body))
        self.send_response(200)
        self.send_header("ETag", '"' + hashlib.md5(body).hexdigest() + '"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _xml(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        cls = type(self)
        cls.count += 1
        if cls.count <= cls.fail:
            self._xml(cls.status, f"<Error><Code>{cls.code}</Code><Message>m</Message>"
                      "</Error>".encode())
            return
        b = cls.body
        self.send_response(206)
        self.send_header("Content-Length", str(len(b)))
        self.send_header("Content-Range", f"bytes 0-{len(b) - 1}/{len(b)}")
        self.send_header("ETag", '"abc"')
        self.end_headers()
        self.wfile.write(b)


@pytest.fixture
def flaky() -> Iterator[tuple[str, type[_Flaky]]]:
    handler = type("Flaky", (_Flaky,), {"fail": 0, "count": 0, "puts": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


async def test_throttling_is_retried_then_succeeds(flaky: tuple[str, type[_Flaky]]) -> None:
    url, handler = flaky
    handler.fail = 2
    handler.status, handler.code = 500, "InternalError"
    tier = S3ObjectTier("b", endpoint_url=url, region="us-east-1", access_key="k",
                        secret_key="s", addressing="path", max_attempts=4)
    try:
        assert await tier.get_range("bkt/k", 0, 100) == _Flaky.body[:100]
        assert handler.count == 3
    finally:
        await tier.close()


async def test_throttling_beyond_the_budget_is_unavailable(
    flaky: tuple[str, type[_Flaky]]
) -> None:
    url, handler = flaky
    handler.fail = 100  # SlowDown: throttling, backoff from 1 s with jitter
    tier = S3ObjectTier("b", endpoint_url=url, region="us-east-1", access_key="k",
                        secret_key="s", addressing="path", max_attempts=2,
                        retry_mode="adaptive")
    try:
        with pytest.raises(TierThrottled, match="SlowDown"):
            await tier.get_range("bkt/k", 0, 100)
        assert handler.count == 2
        # the store answered (slow down): it is up, as the persister and status see it
        assert tier.reachable() and tier.describe_health()["reason"] is None
        handler.count, handler.status, handler.code = 0, 500, "InternalError"
        with pytest.raises(TierUnavailable, match="InternalError") as e:
            await tier.get_range("bkt/k", 0, 100)
        assert not isinstance(e.value, TierThrottled) and not tier.reachable()
    finally:
        await tier.close()


class _HeadBare503(_Flaky):
    """A store that answers every HEAD with a bare 503 (no body, as S3 answers a HEAD it
    throttles) and a listing with ``status``/``code`` (200: an empty listing)."""

    def do_HEAD(self) -> None:
        type(self).count += 1
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        cls = type(self)
        cls.count += 1
        if cls.status == 200:
            body = (b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>b</Name>'
                    b"<KeyCount>0</KeyCount><MaxKeys>1</MaxKeys>"
                    b"<IsTruncated>false</IsTruncated></ListBucketResult>")
        else:
            body = f"<Error><Code>{cls.code}</Code><Message>m</Message></Error>".encode()
        self._xml(cls.status, body)


@pytest.mark.parametrize(("status", "code", "expected"), [
    (200, "", None),
    (503, "SlowDown", TierThrottled),
    (503, "ServiceUnavailable", TierUnavailable),
])
async def test_a_bare_503_to_the_probes_head_is_asked_again_by_a_listing(
    status: int, code: str, expected: type[TierError] | None,
) -> None:
    """A HEAD's 503 says nothing of why; the probe's listing does: a store that lists, or
    throttles, is up (reachable, no reason given); one that answers ServiceUnavailable is
    not."""
    handler = type("HeadBare503", (_HeadBare503,), {"count": 0, "puts": [],
                                                     "status": status, "code": code})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tier = S3ObjectTier("b", endpoint_url=f"http://127.0.0.1:{server.server_address[1]}",
                        region="us-east-1", access_key="k", secret_key="s",
                        addressing="path", max_attempts=1)
    try:
        if expected is None:
            await tier.probe()
        else:
            with pytest.raises(expected, match=code) as e:
                await tier.probe()
            assert expected is TierThrottled or not isinstance(e.value, TierThrottled)
        assert handler.count == 2  # the HEAD, then the listing
        up = expected is not TierUnavailable
        assert tier.reachable() is up
        assert (tier.describe_health()["reason"] is None) is up
    finally:
        await tier.close()
        server.shutdown()
        server.server_close()


# --- error translation ----------------------------------------------------------------------


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (_client_error("NoSuchKey", 404), ObjectNotFound),
        (_client_error("404", 404), ObjectNotFound),
        (_client_error("NoSuchBucket", 404), TierUnavailable),
        (_client_error("PreconditionFailed", 412), ObjectChanged),
        (_client_error("SlowDown", 503), TierThrottled),
        (_client_error("TooManyRequests", 429), TierThrottled),
        (_client_error("ServiceUnavailable", 503), TierUnavailable),
        (_client_error("InternalError", 500), TierUnavailable),
        (_client_error("AccessDenied", 403), TierUnavailable),
        (_client_error("InvalidArgument", 400), TierError),
        (EndpointConnectionError(endpoint_url="http://x"), TierUnavailable),
        (ConnectionResetError(104, "reset"), TierUnavailable),
    ],
)
def test_error_translation(error: Exception, expected: type[TierError]) -> None:
    tier = S3ObjectTier("b")
    got = tier._translate(error, "bkt/k", "get_object")
    assert type(got) is expected
    assert "bkt/k" in str(got) or expected is TierUnavailable


def test_per_bucket_layout_missing_bucket_is_not_found() -> None:
    got = S3ObjectTier("")._translate(_client_error("NoSuchBucket", 404), "bkt/k", "get")
    assert isinstance(got, ObjectNotFound)


async def test_puts_carry_content_md5(flaky: tuple[str, type[_Flaky]],
                                      tmp_path: Path) -> None:
    """Every single PUT and every part carries Content-MD5, so the store rejects a body
    corrupted on the way (moto does not check it; AWS, MinIO and Ceph do)."""
    url, handler = flaky
    tier = S3ObjectTier("b", endpoint_url=url, region="us-east-1", access_key="k",
                        secret_key="s", addressing="path", max_attempts=1)
    try:
        data = b"payload"
        await tier.put_file("bkt/x", src(tmp_path, data), len(data))
        md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
        assert handler.puts == [("/b/bkt/x", md5, data)]
        handler.puts.clear()
        given = hashlib.md5(b"what the caller hashed").hexdigest()
        await tier.put_file("bkt/y", src(tmp_path, data), len(data), md5_hex=given)
        assert handler.puts[0][1] == base64.b64encode(bytes.fromhex(given)).decode()
    finally:
        await tier.close()


# --- one S3 bucket per tierd bucket ---------------------------------------------------------


async def test_per_bucket_layout(moto: MotoServer, tmp_path: Path) -> None:
    tier = open_object_tier("s3://", **s3_settings(moto))
    client = moto.client()
    try:
        await tier.put_file("photos-pb/2024/cat.jpg", src(tmp_path, b"meow"), 4)
        await tier.put_file("photos-pb/dog.jpg", src(tmp_path, b"woof"), 4)
        # the tierd bucket *is* the S3 bucket
        body = client.get_object(Bucket="photos-pb", Key="2024/cat.jpg")["Body"].read()
        assert body == b"meow"
        client.create_bucket(Bucket="plain-pb")
        client.put_object(Bucket="plain-pb", Key="a/b", Body=b"outside")
        assert await tier.get_range("plain-pb/a/b", 0, 100) == b"outside"
        page = await tier.list("photos-pb/", delimiter="/")
        assert [o.key for o in page.objects] == ["photos-pb/dog.jpg"]
        assert page.common_prefixes == ["photos-pb/2024/"]
        top = await tier.list("p", delimiter="/")
        assert top.common_prefixes == ["photos-pb/", "plain-pb/"]
        flat = await tier.list("p")
        assert [o.key for o in flat.objects] == [
            "photos-pb/2024/cat.jpg", "photos-pb/dog.jpg", "plain-pb/a/b"]
        page = await tier.list("p", limit=2)
        assert page.truncated and len(page.objects) == 2
        rest = await tier.list("p", start_after=page.next_start_after)
        assert [o.key for o in rest.objects] == ["plain-pb/a/b"]
        assert await tier.head("no-such-bucket-pb/k") is None
        with pytest.raises(ObjectNotFound):
            await tier.get_range("no-such-bucket-pb/k", 0, 1)
        await tier.delete("no-such-bucket-pb/k")
        await tier.probe()
    finally:
        await tier.close()


# --- settings -------------------------------------------------------------------------------


async def test_tier_from_config(moto: MotoServer, tmp_path: Path) -> None:
    env = {
        "TIERD_DATA_DIR": str(tmp_path / "data"),
        "TIERD_COLD_URL": f"s3://{COLD_BUCKET}/from-config",
        "TIERD_COLD_S3_ENDPOINT": moto.url,
        "TIERD_COLD_S3_REGION": "us-east-1",
        "TIERD_COLD_S3_ACCESS_KEY": "testing",
        "TIERD_COLD_S3_SECRET_KEY": "testing",
        "TIERD_COLD_S3_ADDRESSING": "path",
        "TIERD_COLD_S3_MAX_ATTEMPTS": "2",
        "TIERD_COLD_PART_SIZE": "5MiB",
        "TIERD_COLD_CONCURRENCY": "3",
    }
    cfg = load_config(env=env)
    assert cfg.as_dict()["cold_s3_secret_key"] == "<redacted>"
    tier = object_tier_from_config(cfg)
    try:
        assert isinstance(tier, S3ObjectTier)
        assert tier.transfer.concurrency == 3 and tier.transfer.part_size == 5 * MIB
        await tier.put_file("bkt/c", src(tmp_path, b"cfg"), 3)
        body = moto.client().get_object(Bucket=COLD_BUCKET, Key="from-config/bkt/c")["Body"]
        assert body.read() == b"cfg"
    finally:
        await tier.close()


@pytest.mark.parametrize("checksum", ["crc32", "md5"])
async def test_multipart_part_checksums(moto: MotoServer, tmp_path: Path,
                                        checksum: str) -> None:
    """crc32 (default): the upload declares CRC32 and every part carries one, so the store
    keeps a composite checksum of the parts (S3's ``<crc>-<parts>``) and verifies each part;
    md5: Content-MD5 per part and no flexible checksum."""
    tier = open_object_tier(f"s3://{COLD_BUCKET}/ck-{checksum}",
                            **s3_settings(moto, checksum=checksum))
    data = os.urandom(12 << 20)  # three 5 MiB parts
    try:
        info = await tier.put_file("b/obj", src(tmp_path, data), len(data))
        assert info.etag.endswith("-3")
        head = moto.client().head_object(Bucket=COLD_BUCKET, Key=f"ck-{checksum}/b/obj",
                                         ChecksumMode="ENABLED")
        if checksum == "crc32":
            parts = b"".join(zlib.crc32(data[o:o + (5 << 20)]).to_bytes(4, "big")
                             for o in range(0, len(data), 5 << 20))
            want = base64.b64encode(zlib.crc32(parts).to_bytes(4, "big")).decode()
            assert head["ChecksumCRC32"] in (want, f"{want}-3")  # moto omits the "-3"
        else:
            assert "ChecksumCRC32" not in head
        assert await tier.get_range("b/obj", 0, len(data)) == data
    finally:
        await tier.close()
    with pytest.raises(ValueError, match="crc32 or md5"):
        open_object_tier("s3://x", checksum="sha1")
