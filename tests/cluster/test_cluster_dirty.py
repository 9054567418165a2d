"""Bytes another node holds and has not persisted: with write-back held back (30 s), an
object PUT on n1, or a file written and closed through n1's mount, is read on n2 at once --
by S3 and through n2's mount -- from n1's hot tier over n1's peer data door, not from the
cold store (which does not have it yet: checked)."""

from __future__ import annotations

import hashlib
import os

import pytest

from .clusterlib import Cluster

pytestmark = pytest.mark.usefixtures("bucket")
BUCKET = "dirty"


@pytest.fixture(scope="module")
def cluster_settings() -> dict[str, str]:
    return {"TIERD_PERSIST_DELAY": "30"}



def _not_in_cold(cluster: Cluster, key: str) -> None:
    assert f"{BUCKET}/{key}" not in cluster.cold.objects(), "persisted already: not a dirty read"


def test_an_object_put_on_n1_reads_on_n2_at_once(cluster: Cluster) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    cluster[1].s3().put_object(Bucket=BUCKET, Key="s3/obj", Body=data)
    _not_in_cold(cluster, "s3/obj")
    body = cluster[2].s3().get_object(Bucket=BUCKET, Key="s3/obj")["Body"].read()
    assert hashlib.sha256(body).digest() == hashlib.sha256(data).digest()
    got = cluster[3].path(BUCKET, "s3/obj").read_bytes()
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    _not_in_cold(cluster, "s3/obj")


def test_a_file_closed_on_n1_opens_with_its_content_on_n2(cluster: Cluster) -> None:
    data = os.urandom(1024 * 1024 + 5)
    d = cluster[1].path(BUCKET, "fuse")
    d.mkdir()
    with open(d / "ckpt", "wb") as f:
        f.write(data)
    _not_in_cold(cluster, "fuse/ckpt")
    assert cluster[2].path(BUCKET, "fuse/ckpt").read_bytes() == data
    body = cluster[3].s3().get_object(Bucket=BUCKET, Key="fuse/ckpt")["Body"].read()
    assert body == data


def test_a_rewrite_on_n1_is_what_n2_reads_next(cluster: Cluster) -> None:
    """Close-to-open: n2 read the first version (and may hold it in its hot tier and page
    cache); after n1 rewrites and closes, n2's next open reads the new bytes."""
    p1, p2 = cluster[1].path(BUCKET, "again"), cluster[2].path(BUCKET, "again")
    p1.write_bytes(b"first version " * 1000)
    assert p2.read_bytes() == b"first version " * 1000
    p1.write_bytes(b"second, longer version " * 1000)
    assert p2.read_bytes() == b"second, longer version " * 1000
