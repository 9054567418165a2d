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

import errno
import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .clusterlib import Cluster, Node, poll

pytestmark = pytest.mark.usefixtures("bucket")
BUCKET = "dbfaults"


@dataclass
class Journal:
    """What one writer was told: acknowledged (name -> sha256) and the failures it saw."""

    acked: dict[str, str] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)  # failures of a kind that is not allowed


def _s3_writer(node: Node, tag: str, stop: threading.Event, j: Journal) -> None:
    s3 = node.s3(read_timeout=30, connect_timeout=5)
    i = 0
    while not stop.is_set():
        key = f"{tag}/{i}"
        data = os.urandom(1000 + 37 * i)
        try:
            s3.put_object(Bucket=BUCKET, Key=key, Body=data)
        except ClientError as e:
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            (j.failed if status >= 500 else j.wrong).append(f"{key}: {status} {e}")
        except Exception as e:  # a broken connection, a timeout: the door itself failed
            j.wrong.append(f"{key}: {type(e).__name__}: {e}")
        else:
            j.acked[key] = hashlib.sha256(data).hexdigest()
        i += 1
        time.sleep(0.002)


def _fuse_writer(node: Node, tag: str, stop: threading.Event, j: Journal) -> None:
    d = node.path(BUCKET, tag)
    d.mkdir()
    i = 0
    while not stop.is_set():
        key = f"{tag}/{i}"
        data = os.urandom(1000 + 41 * i)
        try:
            with open(node.path(BUCKET, key), "wb") as f:
                f.write(data)
                os.fsync(f.fileno())
        except OSError as e:
            (j.failed if e.errno == errno.EIO else j.wrong).append(f"{key}: {e!r}")
        else:
            j.acked[key] = hashlib.sha256(data).hexdigest()
        i += 1
        time.sleep(0.002)


def _under_traffic(cluster: Cluster, fault: Any, settle: float = 1.0) -> dict[str, Journal]:
    """Writers on every node; ``fault()`` once they have been writing a while; they stop
    ``settle`` seconds after it returned."""
    tags = {"s3-n1": (cluster[1], _s3_writer), "s3-n2": (cluster[2], _s3_writer),
            "fuse-n3": (cluster[3], _fuse_writer)}
    run = f"{time.monotonic_ns():x}"
    journals = {f"{run}-{t}": Journal() for t in tags}
    stop = threading.Event()
    threads = [threading.Thread(target=fn, args=(node, f"{run}-{t}", stop,
                                                 journals[f"{run}-{t}"]), daemon=True)
               for t, (node, fn) in tags.items()]
    for t in threads:
        t.start()
    time.sleep(0.7)
    fault()
    time.sleep(settle)
    stop.set()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a writer hung"
    return journals


def _check(cluster: Cluster, journals: dict[str, Journal]) -> None:
    writers = {"s3-n1": cluster[1], "s3-n2": cluster[2], "fuse-n3": cluster[3]}
    for tag, j in journals.items():
        assert not j.wrong, f"{tag}: failures that are neither 5xx nor EIO: {j.wrong[:5]}"
        assert j.acked, f"{tag} acknowledged nothing"
        node = writers[tag.split("-", 1)[1]]
        for key, digest in j.acked.items():
            # the node that acknowledged it reads it back (S3 and its mount alike)
            body = node.s3().get_object(Bucket=BUCKET, Key=key)["Body"].read()
            assert hashlib.sha256(body).hexdigest() == digest, key
            got = node.path(BUCKET, key).read_bytes()
            assert hashlib.sha256(got).hexdigest() == digest, key
        for other in cluster.nodes:  # every node lists every acknowledged name
            listed = {o["Key"] for page in other.s3().get_paginator("list_objects_v2")
                      .paginate(Bucket=BUCKET, Prefix=tag + "/") for o in page.get("Contents", [])}
            missing = set(j.acked) - listed
            assert not missing, f"{other.name} does not list {sorted(missing)[:5]}"
        print(f"{tag}: {len(j.acked)} acknowledged, {len(j.failed)} failed (5xx/EIO)")


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

