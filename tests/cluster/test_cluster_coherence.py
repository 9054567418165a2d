"""One namespace over three nodes: the cluster starts, every node serves, and what one node
does to the namespace is seen by the others.

Buckets and objects made through n1's doors are listed on n2 and n3, by S3 and through their
FUSE mounts; a rename and chmod through n1's mount is what n2's first lookup finds; an object
n1 persisted reads back whole on n2 and n3 (S3 and FUSE), and after an overwrite on n1 the
next GET on n2 returns the new bytes; a rename, unlink or chmod through n1's mount reaches
n2's kernel even after it cached the entry and attributes (the change feed invalidates them:
the times are printed, ``-s`` shows them).
"""

from __future__ import annotations

import os
import stat
import threading

import pytest
from botocore.exceptions import ClientError

from .clusterlib import Cluster, poll

BUCKET = "coherence"
#: how long a change made on another node may take to reach a node's kernel caches (the
#: change feed: docs/cluster.md, "Consistency"); the tests print what it took
STALE_S = 2.0


def test_every_node_serves(cluster: Cluster) -> None:
    for node in cluster.nodes:
        assert node.running, cluster.logs()
        assert node.status()
        assert node.s3().list_buckets()["Buckets"] is not None
        assert node.mnt.is_dir() and list(node.mnt.iterdir()) is not None



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


def test_a_persisted_object_put_on_n1_reads_back_on_n2_by_s3_and_fuse(
        cluster: Cluster, bucket: str) -> None:
    data = os.urandom(300_000)
    cluster[1].s3().put_object(Bucket=bucket, Key="dir/obj", Body=data)
    cluster[1].persist_wait(bucket)
    got = cluster[2].s3().get_object(Bucket=bucket, Key="dir/obj")["Body"].read()
    assert got == data
    assert cluster[2].path(bucket, "dir/obj").read_bytes() == data
    assert cluster[3].path(bucket, "dir/obj").read_bytes() == data


def test_an_overwrite_on_n1_is_what_the_next_get_on_n2_returns(
        cluster: Cluster, bucket: str) -> None:
    s1, s2 = cluster[1].s3(), cluster[2].s3()
    for round_ in range(3):
        data = os.urandom(10_000 + round_)
        s1.put_object(Bucket=bucket, Key="over", Body=data)
        cluster[1].persist_wait(bucket)
        assert s2.get_object(Bucket=bucket, Key="over")["Body"].read() == data


def test_a_delete_on_n1_is_a_404_on_n2_and_gone_from_n3s_listing(
        cluster: Cluster, bucket: str) -> None:
    cluster[1].s3().put_object(Bucket=bucket, Key="gone/x", Body=b"short-lived")
    assert cluster[2].s3().head_object(Bucket=bucket, Key="gone/x")["ContentLength"] == 11
    cluster[1].s3().delete_object(Bucket=bucket, Key="gone/x")
    with pytest.raises(ClientError) as e:
        cluster[2].s3().head_object(Bucket=bucket, Key="gone/x")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    listed = cluster[3].s3().list_objects_v2(Bucket=bucket, Prefix="gone/")
    assert listed.get("KeyCount", 0) == 0


def test_concurrent_writers_on_two_nodes_lose_nothing_to_write_back(
        cluster: Cluster, bucket: str) -> None:
    """n1 and n2 PUT at the same time while write-back runs (no persist delay here): every
    acknowledged object stays listed on every node and reads back whole from n3 once both
    homes persisted it.  (A node's import judged another node's fresh uploads "deleted
    outside tierd" and dropped their names before only the persisting node could.)"""
    written: dict[str, bytes] = {}

    def writer(i: int, tag: str) -> None:
        s3 = cluster[i].s3()
        for k in range(20):
            data = os.urandom(2000 + k)
            s3.put_object(Bucket=bucket, Key=f"race/{tag}/{k}", Body=data)
            written[f"race/{tag}/{k}"] = data

    threads = [threading.Thread(target=writer, args=(1, "A")),
               threading.Thread(target=writer, args=(2, "B"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(written) == 40
    cluster[1].persist_wait(bucket)
    cluster[2].persist_wait(bucket)
    for node in cluster.nodes:
        listed = {o["Key"] for page in node.s3().get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix="race/") for o in page.get("Contents", [])}
        assert listed == set(written), f"{node.name} lacks {sorted(set(written) - listed)}"
    s3 = cluster[3].s3()
    for key, data in written.items():
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data, key


def _file_on_n1(cluster: Cluster, bucket: str, name: str) -> bytes:
    data = os.urandom(5000)
    p = cluster[1].path(bucket, name)
    with open(p, "wb") as f:
        f.write(data)
        os.fsync(f.fileno())
    cluster[1].persist_wait(bucket)
    return data


def test_rename_through_n1_is_seen_by_n2s_next_lookup(cluster: Cluster, bucket: str) -> None:
    data = _file_on_n1(cluster, bucket, "before")
    n2 = cluster[2]
    assert n2.path(bucket, "before").read_bytes() == data  # n2's kernel caches the entry
    os.rename(cluster[1].path(bucket, "before"), cluster[1].path(bucket, "after"))
    took = poll(lambda: not n2.path(bucket, "before").exists()
                and n2.path(bucket, "after").exists(), timeout=STALE_S)
    print(f"rename seen on n2 after {took:.3f} s")
    assert n2.path(bucket, "after").read_bytes() == data


def test_unlink_through_n1_is_seen_by_n2s_next_lookup(cluster: Cluster, bucket: str) -> None:
    _file_on_n1(cluster, bucket, "doomed")
    n2 = cluster[2]
    assert n2.path(bucket, "doomed").stat().st_size == 5000
    os.unlink(cluster[1].path(bucket, "doomed"))
    took = poll(lambda: not n2.path(bucket, "doomed").exists(), timeout=STALE_S)
    print(f"unlink seen on n2 after {took:.3f} s")
    assert "doomed" not in os.listdir(n2.path(bucket))


def test_chmod_through_n1_is_seen_by_n2s_next_stat(cluster: Cluster, bucket: str) -> None:
    _file_on_n1(cluster, bucket, "modes")
    n2 = cluster[2]
    n2.path(bucket, "modes").stat()
    os.chmod(cluster[1].path(bucket, "modes"), 0o640)
    took = poll(lambda: stat.S_IMODE(n2.path(bucket, "modes").stat().st_mode) == 0o640,
                timeout=STALE_S)
    print(f"chmod seen on n2 after {took:.3f} s")
