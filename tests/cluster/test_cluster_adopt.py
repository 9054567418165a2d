"""A single node grows into a cluster (``tierd meta dump`` / ``tierd meta load --node``,
tierd/meta/transfer.py) with files it has not persisted yet.

A real single node (lmdb, FUSE mount, S3 door, write-back held back) writes files through
S3 and its mount and stops with them dirty (only on its hot tier).  Its namespace is
dumped, loaded into the cluster's PostgreSQL database adopted as node n1, and a cluster of
n1 -- started on the single node's own data directory -- and n2 serves it: the dirty files
read byte-exact on n2 (S3 and mount, through n1's peer door) and on n1, an access key made
on the single node works on n2, and once write-back is released n1 persists them.
Loaded without ``--node`` (how a namespace moved before adoption existed), n2 could not
read them: they had no home."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pytest
from botocore.config import Config as BotoConfig
from durability.coldlib import Tierd
from meta.pg_server import PgServer
from moto_server import REGION, MotoServer

from .clusterlib import SECRET, Cluster

pytestmark = pytest.mark.timeout(400)
BUCKET = "grown"
HELD = {"TIERD_PERSIST_DELAY": "600", "TIERD_DIRTY_LIMIT": "16GiB"}


def tierd(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    return subprocess.run([sys.executable, "-m", "tierd.cli", *args], capture_output=True,
                          text=True, env=env, timeout=240)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def client(node: Tierd, key: str, secret: str) -> Any:
    return boto3.client("s3", endpoint_url=node.doc["s3"]["url"], aws_access_key_id=key,
                        aws_secret_access_key=secret, region_name=REGION,
                        config=BotoConfig(s3={"addressing_style": "path"},
                                          retries={"max_attempts": 1}))


def write_single_node(single: Tierd) -> tuple[dict[str, bytes], dict[str, str]]:
    """Files on the single node, all but ``clean`` dirty; and an access key made there."""
    s3 = single.s3()
    s3.create_bucket(Bucket=BUCKET)
    files = {"clean": os.urandom(200_000)}
    s3.put_object(Bucket=BUCKET, Key="clean", Body=files["clean"])
    single.persist_wait()
    files["dirty/s3"] = os.urandom(3 * 1024 * 1024 + 17)
    s3.put_object(Bucket=BUCKET, Key="dirty/s3", Body=files["dirty/s3"])
    files["dirty/small"] = b"a small object, kept in the small-write log " * 3
    s3.put_object(Bucket=BUCKET, Key="dirty/small", Body=files["dirty/small"])
    files["dirty/fuse"] = os.urandom(1024 * 1024 + 5)
    assert single.mnt is not None
    with open(single.mnt / BUCKET / "dirty" / "fuse", "wb") as f:
        f.write(files["dirty/fuse"])
    files["mpu"] = os.urandom(300_000)  # a multipart upload left open: its part stays here
    up = s3.create_multipart_upload(Bucket=BUCKET, Key="mpu")["UploadId"]
    etag = s3.upload_part(Bucket=BUCKET, Key="mpu", UploadId=up, PartNumber=1,
                          Body=files["mpu"])["ETag"]
    single.admin("POST", "/v1/users", {"name": "dora", "uid": 4343})
    made = single.admin("POST", "/v1/keys", {"user": "dora"})
    return files, {"key": made["access_key"], "secret": made["secret"], "upload": up,
                   "etag": etag}


def test_a_single_node_with_dirty_files_grows_into_a_cluster(
        cluster_pg: PgServer, moto: MotoServer, tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, cluster_pg, moto, 2, **HELD)
    n1, n2 = cluster[1], cluster[2]
    single = Tierd(n1.base, cluster.cold, mount=True, **HELD)  # n1's data directory
    assert single.data_dir == n1.data_dir
    single.start(60)
    try:
        files, key = write_single_node(single)
    finally:
        single.stop()
    in_cold = cluster.cold.objects()
    assert f"{BUCKET}/clean" in in_cold
    dirty = [k for k in files if k.startswith("dirty/")]
    mpu = files.pop("mpu")
    assert not {f"{BUCKET}/{k}" for k in dirty} & in_cold, "persisted already: not dirty"

    dump = tmp_path / "ns.dump"
    data = ["--data-dir", str(n1.data_dir)]
    r = tierd("meta", "dump", str(dump), *data)
    assert r.returncode == 0, r.stderr
    with psycopg.connect(cluster_pg.admin_url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {cluster.db}")
    into_pg = [*data, "--meta-url", cluster.meta_url, "--cluster-secret", SECRET]

    # refused, nothing written: a bad name; adopting into lmdb (the reverse of a single
    # node's dump); no secret to seal the access keys with
    r = tierd("meta", "load", str(dump), "--node", "N_1", *into_pg)
    assert r.returncode == 2 and "not a node name" in r.stderr, r.stderr
    r = tierd("meta", "load", str(dump), "--node", "n1", "--data-dir", str(tmp_path / "x"))
    assert r.returncode == 1 and "single node's already" in r.stderr, r.stderr
    r = tierd("meta", "load", str(dump), "--node", "n1", *data, "--meta-url", cluster.meta_url)
    assert r.returncode == 1 and "cluster_secret" in r.stderr, r.stderr

    r = tierd("meta", "load", str(dump), "--node", "n1", *into_pg)
    assert r.returncode == 0, r.stderr
    assert "as node n1" in r.stdout
    r = tierd("meta", "load", str(dump), "--node", "n1", *into_pg)  # twice: refused
    assert r.returncode == 1 and "not empty" in r.stderr, r.stderr

    n1.start(60)
    try:
        n2.start(60)
        for k in dirty:  # on n2 through n1's peer door, by S3 and the mount; and on n1
            body = n2.s3().get_object(Bucket=BUCKET, Key=k)["Body"].read()
            assert digest(body) == digest(files[k]), k
            assert digest(n2.path(BUCKET, k).read_bytes()) == digest(files[k]), k
            assert digest(n1.path(BUCKET, k).read_bytes()) == digest(files[k]), k
        assert digest(n2.path(BUCKET, "clean").read_bytes()) == digest(files["clean"])
        assert not {f"{BUCKET}/{k}" for k in dirty} & cluster.cold.objects()
        # the key made on the single node opens on every node (its secret resealed)
        client(n2, key["key"], key["secret"]).list_buckets()
        # the open multipart upload completes on n1, which holds its part
        n1.s3().complete_multipart_upload(
            Bucket=BUCKET, Key="mpu", UploadId=key["upload"],
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": key["etag"]}]})
        assert n2.s3().get_object(Bucket=BUCKET, Key="mpu")["Body"].read() == mpu

        n1.persist_wait(timeout=120)  # write-back released: n1, their home, persists them
        in_cold = cluster.cold.objects()
        for k in dirty:
            assert f"{BUCKET}/{k}" in in_cold, k
            assert digest(cluster.cold.get(f"{BUCKET}/{k}")) == digest(files[k]), k
        assert not n2.status()["placement"]["queue"].get("stranded")
        n1.stop()  # the others read from cold now, not from n1
        assert digest(n2.s3().get_object(Bucket=BUCKET, Key="dirty/fuse")["Body"].read()) \
            == digest(files["dirty/fuse"])
    finally:
        cluster.stop()


def test_a_cluster_node_leaves_as_a_single_node(
        cluster_pg: PgServer, moto: MotoServer, tmp_path: Path) -> None:
    """The reverse: node n1 of a cluster becomes a single lmdb node on its data directory,
    with its own dirty file; refused while n2 holds a file not yet in cold."""
    cluster = Cluster(tmp_path, cluster_pg, moto, 2, **HELD).start()
    n1, n2 = cluster[1], cluster[2]
    try:
        n1.s3().create_bucket(Bucket=BUCKET)
        mine = os.urandom(2 * 1024 * 1024 + 3)
        n1.s3().put_object(Bucket=BUCKET, Key="mine", Body=mine)
        theirs = os.urandom(100_000)
        n2.s3().put_object(Bucket=BUCKET, Key="theirs", Body=theirs)
        assert f"{BUCKET}/mine" not in cluster.cold.objects()
    finally:
        cluster.stop()
    dump, data = tmp_path / "c.dump", ["--data-dir", str(n1.data_dir)]
    r = tierd("meta", "dump", str(dump), *data, "--meta-url", cluster.meta_url)
    assert r.returncode == 0, r.stderr
    r = tierd("meta", "load", str(dump), "--node", "n1", *data, "--cluster-secret", SECRET)
    assert r.returncode == 1 and "only node 'n2' has" in r.stderr, r.stderr

    n2.start(60)  # n2 persists its file; then n1 may leave
    try:
        t0 = time.monotonic()
        doc = n2.persist_wait(timeout=120)
        # n2's own file is persisted; n1's, which only the stopped n1 holds, is stranded:
        # the wait ends once n1's lease ran out, not at its timeout (before: 120 s)
        assert doc["persisted"] is False and time.monotonic() - t0 < 60, doc
        assert cluster.cold.get(f"{BUCKET}/theirs") == theirs
    finally:
        n2.stop()
    r = tierd("meta", "dump", str(dump), *data, "--meta-url", cluster.meta_url)
    assert r.returncode == 0, r.stderr
    r = tierd("meta", "load", str(dump), "--node", "n1", *data, "--cluster-secret", SECRET)
    assert r.returncode == 0, r.stderr

    single = Tierd(n1.base, cluster.cold, mount=True, **HELD)
    single.start(60)
    try:
        assert digest(single.s3().get_object(Bucket=BUCKET, Key="mine")["Body"].read()) \
            == digest(mine)
        assert single.s3().get_object(Bucket=BUCKET, Key="theirs")["Body"].read() == theirs
        single.persist_wait(timeout=120)
        assert cluster.cold.get(f"{BUCKET}/mine") == mine
    finally:
        single.stop()
