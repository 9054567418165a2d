"""A node dies (SIGKILL) while every node writes: the other nodes keep serving, nothing any
node acknowledged is lost or read back wrong.

Write-back is held back (30 s), so n1 dies holding acknowledged objects only its hot tier
has.  While it is down the others list them, and a read of one on another node either fails
(a 5xx: its bytes are on the dead node alone) or returns exactly what was acknowledged --
never other bytes.  Once n1 is back on the same data directory, every object it
acknowledged reads back whole on the other nodes.
"""

from __future__ import annotations

import time

import pytest
from botocore.exceptions import ClientError

from .clusterlib import Cluster
from .traffic import Journal, digest, fuse_writer, listed, s3_writer, traffic

pytestmark = pytest.mark.usefixtures("bucket")
BUCKET = "nodedeath"


@pytest.fixture(scope="module")
def cluster_settings() -> dict[str, str]:
    return {"TIERD_PERSIST_DELAY": "30"}


def _read_or_5xx(j: Journal, cluster: Cluster, i: int) -> tuple[int, int]:
    """Read every acknowledged object of ``j`` on node ``i``: (read whole, refused)."""
    s3 = cluster[i].s3(read_timeout=30)
    whole = refused = 0
    for key, sha in j.acked.items():
        try:
            body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        except ClientError as e:
            status = e.response["ResponseMetadata"]["HTTPStatusCode"]
            assert status >= 500, f"{key} on n{i}: {status} {e}"
            refused += 1
        else:
            assert digest(body) == sha, f"{key} on n{i}: other bytes than acknowledged"
            whole += 1
    return whole, refused


def test_sigkill_of_a_node_under_writes_loses_no_acknowledged_object(
        cluster: Cluster) -> None:
    n1 = cluster[1]
    with traffic(BUCKET, [(n1, "s3-n1", s3_writer), (cluster[2], "s3-n2", s3_writer),
                          (cluster[3], "fuse-n3", fuse_writer)]) as journals:
        time.sleep(1.0)
        n1.kill9()
        killed = time.monotonic()
        time.sleep(1.5)  # the survivors write on without n1
    dead, *alive = journals
    assert dead.acked, "n1 acknowledged nothing before it died"
    for j in alive:  # the others kept serving, with no failure at all
        assert not (j.failed or j.wrong or j.broken), (j.tag, j.failed, j.wrong, j.broken)
        assert j.acked
    assert not dead.wrong, dead.wrong  # n1's own clients: acknowledged or no answer

    # while n1 is down: n2 and n3 list everything, read n1's objects whole or refuse them
    for i in (2, 3):
        for j in journals:
            missing = set(j.acked) - listed(cluster[i], BUCKET, j.tag + "/")
            assert not missing, f"n{i} does not list {sorted(missing)[:5]}"
    t0 = time.monotonic()
    whole, refused = _read_or_5xx(dead, cluster, 2)
    print(f"n1 down: {whole} of its objects read whole on n2, {refused} refused (5xx), "
          f"{time.monotonic() - t0:.2f} s for {len(dead.acked)} reads, "
          f"{t0 - killed:.1f} s after the kill")
    for j in alive:
        assert _read_or_5xx(j, cluster, 2 if j.node is not cluster[2] else 3)[1] == 0

    # n1 back on its data directory: everything it acknowledged reads whole everywhere
    n1.start(60)
    for i in (2, 3):
        assert _read_or_5xx(dead, cluster, i) == (len(dead.acked), 0)
    for j in alive:
        assert _read_or_5xx(j, cluster, 1) == (len(j.acked), 0)
