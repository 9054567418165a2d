"""Small PUTs acknowledged through the metadata log survive SIGKILL plus lost page cache.

Real daemon, real boto3: PUT small objects, SIGKILL the daemon (no trim, no shutdown), then
destroy the data file of every object whose bytes only the log vouches for (what a power cut
can do to files that were never synced), restart, and read every object back byte for byte
with its ETag.  Persistence to cold is held off (``--persist-delay``) so the cold copy cannot
be what saves the data.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tierd.meta import MetaStore
from tierd.tiers.local_tier import LocalTier

from .conftest import start_daemon


def test_sigkill_and_lost_data_files_then_every_acknowledged_small_put(tmp_path: Path) -> None:
    data = tmp_path / "data"
    d = start_daemon(data, "--persist-delay", "3600")
    try:
        s3 = d.client()
        s3.create_bucket(Bucket="crash")
        bodies = {f"obj/{i:03d}": os.urandom(1 + 331 * i) for i in range(60)}
        for key, body in bodies.items():
            s3.put_object(Bucket="crash", Key=key, Body=body)
        d.proc.kill()
        d.proc.wait(10)
        store = MetaStore.open_lmdb(data / "meta")
        try:
            with store.snapshot() as tx:
                logged = [ino for ino, _, _ in tx.list_logged()]
        finally:
            store.close()
        # the trim runs within a second of a PUT; most of the last ones are still logged
        assert logged, "no small PUT was left in the log: the test tests nothing"
        hot = LocalTier(data / "hot", name="hot")
        for ino in logged:
            Path(hot.path(ino)).unlink(missing_ok=True)
        d = start_daemon(data, "--persist-delay", "3600")
        s3 = d.client()
        for key, body in bodies.items():
            got = s3.get_object(Bucket="crash", Key=key)
            assert got["Body"].read() == body, key
            assert got["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
        store_text = d.log.read_text(errors="replace")
        assert "written back into the hot tier" in store_text
    finally:
        d.stop()
