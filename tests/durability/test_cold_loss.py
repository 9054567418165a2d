"""A cold store that comes back empty, or loses objects, never makes tierd drop its own
copies: a file whose bytes are whole on a local tier is uploaded again (and a warning says
so); only a file whose content exists nowhere local is dropped as "deleted outside tierd",
with the evidence in the log.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from moto_server import MotoServer

from .coldlib import COLD_BUCKET, Cold, Tierd, running

BUCKET = "closs"
DATA = {f"d/f{i}": bytes([i]) * (100_000 + i) for i in range(5)}


def _fill(t: Tierd) -> None:
    s3 = t.s3()
    s3.create_bucket(Bucket=BUCKET)
    for k, v in DATA.items():
        s3.put_object(Bucket=BUCKET, Key=k, Body=v)
    s3.put_object(Bucket=BUCKET, Key="evicted", Body=b"only in cold")
    assert t.persist_wait(BUCKET + "/")["persisted"]
    doc = t.admin("POST", "/v1/placement/evict", {"prefix": f"{BUCKET}/evicted",
                                                   "tier": "all"})
    assert doc["evicted"] >= 1  # its only copy is now the cold one


def _check_after_loss(t: Tierd) -> None:
    """Listings re-list cold (import_ttl 1 s): what is whole locally stays and goes back
    to cold; the evicted file's content is gone everywhere: dropped, with the evidence."""
    time.sleep(1.2)
    s3 = t.s3()
    assert t.listing(BUCKET) == set(DATA)
    for k, v in DATA.items():
        assert s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() == v
    assert t.persist_wait(BUCKET + "/")["persisted"]
    assert {k for k in t.cold.objects() if k.startswith(BUCKET + "/")} == {
        f"{BUCKET}/{k}" for k in DATA}
    for k, v in DATA.items():
        assert t.cold.get(f"{BUCKET}/{k}") == v
    log = t.log
    assert log.count("uploading it again from the complete local copy") >= len(DATA)
    assert "deleted from the cold store outside tierd" in log
    line = next(x for x in log.splitlines() if "outside tierd" in x and "evicted" in x)
    assert "lacks" in line and "0 of 1 blocks local" in line  # the evidence
    assert "Traceback" not in log


def test_cold_restarted_empty_reuploads_local_copies(tmp_path: Path) -> None:
    server = MotoServer().start()
    try:
        server.client().create_bucket(Bucket=COLD_BUCKET)
        cold = Cold("s3", tmp_path, server)
        t = Tierd(tmp_path, cold, TIERD_IMPORT_TTL="1")
        with running(t):
            _fill(t)
            server.restart()  # moto keeps nothing: the store comes back empty
            server.client().create_bucket(Bucket=COLD_BUCKET)
            _check_after_loss(t)
    finally:
        server.close()


def test_cold_directory_wiped_reuploads_local_copies(tmp_path: Path) -> None:
    cold = Cold("file", tmp_path)
    t = Tierd(tmp_path, cold, TIERD_IMPORT_TTL="1")
    with running(t):
        _fill(t)
        shutil.rmtree(cold.root / BUCKET)  # an operator's mistake, a restored backup...
        _check_after_loss(t)
