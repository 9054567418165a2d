"""Content-Encoding is object metadata to S3: a gzip object keeps its bytes, ETag and
encoding; the gateway never decompresses a request body (aiohttp would by default)."""

from __future__ import annotations

import gzip
import hashlib
import json
from typing import Any

import requests

from .conftest import Daemon


def test_gzip_object_is_stored_as_sent(s3: Any, bucket: str) -> None:
    raw = gzip.compress(b"hello world " * 1000)
    r = s3.put_object(Bucket=bucket, Key="a.txt.gz", Body=raw, ContentEncoding="gzip",
                      ContentType="text/plain")
    assert r["ETag"].strip('"') == hashlib.md5(raw).hexdigest()
    got = s3.get_object(Bucket=bucket, Key="a.txt.gz")
    assert got["Body"].read() == raw
    assert got["ContentEncoding"] == "gzip" and got["ContentLength"] == len(raw)
    # a body that is not gzip at all is still just bytes
    s3.put_object(Bucket=bucket, Key="b", Body=b"plain bytes", ContentEncoding="gzip")
    assert s3.get_object(Bucket=bucket, Key="b")["Body"].read() == b"plain bytes"


def test_admin_api_does_not_decode_bodies(daemon: Daemon) -> None:
    """A refused admin request with a bogus gzip body gets its 401, and the daemon logs no
    decoding traceback while draining the body (a fuzz test found this)."""
    admin = json.loads((daemon.data_dir / "endpoints.json").read_text())["admin"]["url"]
    r = requests.put(admin + "/v1/pool", data=b"not gzip", timeout=10,
                     headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert r.status_code == 401
    assert "Can not decode content-encoding" not in daemon.log.read_text()
