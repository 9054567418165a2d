"""The database restarts or stalls under traffic: every operation either succeeds or fails
with a 5xx (S3) or EIO (FUSE) -- none hangs past its timeout, none answers a wrong success --
and afterwards every acknowledged object and file reads back whole, the nodes serve again
without a restart of their own, and each node lists what the others acknowledged.

Writers run on n1 and n2 (S3) and n3 (FUSE, close + fsync), each on keys of its own, while
the test restarts PostgreSQL (``pg_ctl restart -m fast``: every connection is cut) or stops
it with SIGSTOP for a few seconds (connections open, nothing answers) and lets it go on.
Files wait 30 s before write-back here: what is checked is the database's part (the names
and metadata every node sees, the bytes on the node that wrote them), not persistence.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from botocore.exceptions import ClientError

from .clusterlib import Cluster, poll
from .traffic import Journal, digest, fuse_writer, listed, s3_writer, traffic

pytestmark = pytest.mark.usefixtures("bucket")
BUCKET = "dbfaults"


def _under_traffic(cluster: Cluster, fault: Callable[[], None],
                   settle: float = 1.0) -> list[Journal]:
    """Writers on every node; ``fault()`` once they have been writing a while; they stop
    ``settle`` seconds after it returned."""
    with traffic(BUCKET, [(cluster[1], "s3-n1", s3_writer), (cluster[2], "s3-n2", s3_writer),
                          (cluster[3], "fuse-n3", fuse_writer)]) as journals:
        time.sleep(0.7)
        fault()
        time.sleep(settle)
    return journals


def _check(cluster: Cluster, journals: list[Journal]) -> None:
    for j in journals:
        bad = j.wrong + j.broken
        assert not bad, f"{j.tag}: failures that are neither 5xx nor EIO: {bad[:5]}"
        assert j.acked, f"{j.tag} acknowledged nothing"
        for key, sha in j.acked.items():
            # the node that acknowledged it reads it back (S3 and its mount alike)
            body = j.node.s3().get_object(Bucket=BUCKET, Key=key)["Body"].read()
            assert digest(body) == sha, key
            assert digest(j.node.path(BUCKET, key).read_bytes()) == sha, key
        for other in cluster.nodes:  # every node lists every acknowledged name
            missing = set(j.acked) - listed(other, BUCKET, j.tag + "/")
            assert not missing, f"{other.name} does not list {sorted(missing)[:5]}"
        print(f"{j.tag}: {len(j.acked)} acknowledged, {len(j.failed)} failed (5xx/EIO)")


def _serves_again(cluster: Cluster) -> float:
    """Seconds until a PUT succeeds on every node after the fault."""
    def put_everywhere() -> bool:
        try:
            for n in cluster.nodes:
                n.s3().put_object(Bucket=BUCKET, Key=f"after/{n.name}", Body=b"ok")
        except ClientError:
            return False
        return True
    return poll(put_everywhere, timeout=30, every=0.2)


@pytest.fixture(scope="module")
def cluster_settings() -> dict[str, str]:
    return {"TIERD_PERSIST_DELAY": "30"}



def test_a_database_restart_under_traffic_loses_no_acknowledged_write(
        cluster: Cluster) -> None:
    journals = _under_traffic(cluster, cluster.pg_restart)
    took = _serves_again(cluster)
    print(f"every node served a PUT {took:.2f} s after the restart")
    _check(cluster, journals)


def test_a_stalled_database_makes_requests_wait_or_fail_never_corrupt(
        cluster: Cluster) -> None:
    def stall() -> None:
        cluster.pg_stall()
        try:
            time.sleep(3)
        finally:
            cluster.pg_resume()

    journals = _under_traffic(cluster, stall)
    took = _serves_again(cluster)
    print(f"every node served a PUT {took:.2f} s after the stall")
    _check(cluster, journals)

