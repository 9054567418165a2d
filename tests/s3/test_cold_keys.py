"""Objects put straight into the cold store under keys the namespace refuses (``a//b``,
``x/../y``, ``./z``) are skipped and logged by the import, never made into entries named
``""``, ``.`` or ``..``; the valid keys next to them are imported as usual."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer

from .conftest import Daemon, start_daemon

COLD_BUCKET = "tierd-cold"
BAD = ["a//b", "x/../y", "./z", "w/./v", "dbl//"]
GOOD = ["ok/c", "x/fine", "top"]


@pytest.fixture
def imported(moto: MotoServer, tmp_path: Path) -> Iterator[tuple[Daemon, str]]:
    prefix = f"imp-{uuid.uuid4().hex[:8]}"
    cold = moto.client()
    for key in BAD + GOOD:
        cold.put_object(Bucket=COLD_BUCKET, Key=f"{prefix}/bkt/{key}", Body=key.encode())
    d = start_daemon(tmp_path / "data", "--cold-url", f"s3://{COLD_BUCKET}/{prefix}",
                     "--cold-s3-endpoint", moto.url, "--cold-s3-access-key", ACCESS_KEY,
                     "--cold-s3-secret-key", SECRET_KEY, "--cold-s3-region", REGION,
                     "--cold-s3-addressing", "path", "--import-ttl", "0")
    try:
        yield d, prefix
    finally:
        d.stop()


def _keys(client: Any, **kw: Any) -> tuple[set[str], set[str]]:
    out = client.list_objects_v2(Bucket="bkt", **kw)
    return ({o["Key"] for o in out.get("Contents", [])},
            {p["Prefix"] for p in out.get("CommonPrefixes", [])})


def test_refused_cold_keys_are_skipped_and_logged(imported: tuple[Daemon, str]) -> None:
    d, _ = imported
    s3 = d.client()
    keys, prefixes = _keys(s3, Delimiter="/")  # one level: the directory refresh
    assert keys == {"top"}, keys
    # "a/" and "dbl/" are prefixes in the cold store's own view (of "a//b", "dbl//"):
    # valid directory names, holding nothing once the refused keys are skipped
    assert prefixes == {"ok/", "x/", "w/", "a/", "dbl/"}, prefixes
    keys, prefixes = _keys(s3, Prefix="x/", Delimiter="/")
    assert keys == {"x/fine"} and not prefixes, (keys, prefixes)
    for p in ("a/", "dbl/", "w/"):
        keys, prefixes = _keys(s3, Prefix=p, Delimiter="/")
        assert keys <= {p} and not prefixes, (p, keys, prefixes)  # at most its own marker
    keys, _ = _keys(s3)  # recursive: the prefix import
    assert set(GOOD) <= keys and keys - set(GOOD) <= {"a/", "dbl/", "w/"}, keys
    for key in keys:  # no entry named "", "." or ".."
        assert not {"", ".", ".."} & set(key.rstrip("/").split("/")), key
    for key in GOOD:
        assert s3.get_object(Bucket="bkt", Key=key)["Body"].read() == key.encode()
    log = d.log.read_text(errors="replace")
    assert "x/../y" in log and "a//b" in log, log[-3000:]
    line = next(x for x in log.splitlines() if "x/../y" in x)
    assert "not imported" in line and "level=warning" in line, line
    assert "Traceback" not in log
