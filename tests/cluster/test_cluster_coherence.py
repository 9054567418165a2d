"""One namespace over three nodes: the cluster starts, every node serves, and what one node
does to the namespace is seen by the others.

Buckets and objects made through n1's doors are listed on n2 and n3, by S3 and through their
FUSE mounts; a rename and chmod through n1's mount is what n2's first lookup finds.
"""

from __future__ import annotations

import os
import stat

import pytest

from .clusterlib import Cluster

BUCKET = "coherence"


def test_every_node_serves(cluster: Cluster) -> None:
    for node in cluster.nodes:
        assert node.running, cluster.logs()
        assert node.status()
        assert node.s3().list_buckets()["Buckets"] is not None
        assert node.mnt.is_dir() and list(node.mnt.iterdir()) is not None


@pytest.fixture(scope="module")
def bucket(cluster: Cluster) -> str:
    cluster[1].s3().create_bucket(Bucket=BUCKET)
    return BUCKET


def test_a_bucket_made_on_n1_is_listed_on_n2_and_n3(cluster: Cluster) -> None:
    cluster[1].s3().create_bucket(Bucket="made-on-n1")
    for i in (2, 3):
        names = {b["Name"] for b in cluster[i].s3().list_buckets()["Buckets"]}
        assert "made-on-n1" in names, (i, names)
        assert "made-on-n1" in os.listdir(cluster[i].mnt)


def test_objects_put_on_n1_are_listed_and_stat_on_n2_and_n3(
        cluster: Cluster, bucket: str) -> None:
    """Metadata alone: the listing, HEAD and stat of n1's objects on the other nodes
    (nothing of their bytes is read)."""
    s1 = cluster[1].s3()
    sizes = {f"list/{i}": 1000 * i + 1 for i in range(5)}
    for key, size in sizes.items():
        s1.put_object(Bucket=bucket, Key=key, Body=os.urandom(size))
    for i in (2, 3):
        s3 = cluster[i].s3()
        listed = {o["Key"]: o["Size"] for o in
                  s3.list_objects_v2(Bucket=bucket, Prefix="list/").get("Contents", [])}
        assert listed == sizes, (i, listed)
        assert s3.head_object(Bucket=bucket, Key="list/3")["ContentLength"] == sizes["list/3"]
        assert sorted(os.listdir(cluster[i].path(bucket, "list"))) == sorted(
            k.split("/")[1] for k in sizes)
        assert cluster[i].path(bucket, "list/4").stat().st_size == sizes["list/4"]


def test_a_rename_on_n1_is_seen_by_n2s_first_lookup(cluster: Cluster, bucket: str) -> None:
    """n2 never looked the names up, so its kernel holds nothing about them: its first
    lookup asks its daemon, which reads the shared namespace."""
    p = cluster[1].path(bucket, "ren-a")
    p.write_bytes(b"x" * 100)
    os.rename(p, cluster[1].path(bucket, "ren-b"))
    os.chmod(cluster[1].path(bucket, "ren-b"), 0o604)
    st = cluster[2].path(bucket, "ren-b").stat()
    assert (st.st_size, stat.S_IMODE(st.st_mode)) == (100, 0o604)
    assert not cluster[2].path(bucket, "ren-a").exists()
