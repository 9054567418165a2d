"""A node's event loop never waits for the metadata database's writer lock.

Over PostgreSQL every write transaction of every node first locks the ``meta_schema`` row
(tierd/meta/pg_engine.py), so a writer waits for the whole of any other node's write
transaction.  That wait must happen off the event loop (tierd/meta/pg_async.py): while
another session holds the lock, a PUT on a node waits for it, and the same node keeps
answering reads -- S3 GET and HEAD of an existing object, a FUSE stat -- at once.  Before
the transactions began in a thread, the PUT's begin held the loop for the whole wait and
every read on the node stalled with it.

(A lookup of a name that does not exist is not among the reads: it imports what the cold
store has under the directory, a write transaction that waits for the lock too.)
"""

from __future__ import annotations

import os
import threading
import time

import psycopg
import pytest

from .clusterlib import Cluster

BUCKET = "loop"
#: how long the test's own session holds the writers' lock
HOLD_S = 2.0
#: the slowest read answer allowed while the lock is held (a stalled loop answers after HOLD_S)
READ_MAX_S = 0.75
#: objects stat once each through the mount (more than the reads can take in HOLD_S)
STATS = 400


@pytest.fixture(scope="module")
def cluster_settings() -> dict[str, str]:
    # no write-back during the test: the persister's records would be writers too
    return {"TIERD_PERSIST_DELAY": "30"}


def test_reads_are_answered_while_a_put_waits_for_the_writer_lock(
        cluster: Cluster, bucket: str) -> None:
    node = cluster[1]
    s3 = node.s3()
    body = os.urandom(5000)
    s3.put_object(Bucket=bucket, Key="there", Body=body)
    for i in range(STATS):  # names the mount has not looked up yet: one per stat below
        s3.put_object(Bucket=bucket, Key=f"stat/{i}", Body=b"s" * i)
    assert node.path(bucket, "stat").is_dir()
    assert s3.get_object(Bucket=bucket, Key="there")["Body"].read() == body

    put_s: list[float] = []
    errors: list[BaseException] = []

    def put() -> None:
        t0 = time.monotonic()
        try:
            node.s3().put_object(Bucket=bucket, Key="waits", Body=b"w" * 100)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        put_s.append(time.monotonic() - t0)

    reads: list[tuple[str, float]] = []
    with psycopg.connect(cluster.meta_url) as conn:  # not autocommit: holds the lock
        conn.execute("SELECT seq FROM meta_schema FOR UPDATE")
        locked_at = time.monotonic()
        # the lock goes at HOLD_S whatever the reads do (a stalled node answers them only then)
        release = threading.Timer(HOLD_S, conn.rollback)
        release.start()
        writer = threading.Thread(target=put)
        writer.start()
        time.sleep(0.2)  # the PUT is waiting for the lock now
        n = 0
        while time.monotonic() - locked_at < HOLD_S - 0.3 and n < STATS:
            t0 = time.monotonic()
            got = s3.get_object(Bucket=bucket, Key="there")["Body"].read()
            reads.append(("GET", time.monotonic() - t0))
            assert got == body
            t0 = time.monotonic()
            assert s3.head_object(Bucket=bucket, Key="there")["ContentLength"] == len(body)
            reads.append(("HEAD", time.monotonic() - t0))
            t0 = time.monotonic()
            # a name the kernel has not cached: a FUSE lookup (and getattr) by the daemon
            assert node.path(bucket, f"stat/{n}").stat().st_size == n
            reads.append(("stat", time.monotonic() - t0))
            n += 1
        release.join()
    writer.join(30)
    assert not errors, errors
    assert put_s and put_s[0] >= HOLD_S - 0.5, put_s  # it waited for the lock
    assert s3.get_object(Bucket=bucket, Key="waits")["Body"].read() == b"w" * 100
    worst = max(reads, key=lambda r: r[1])
    print(f"\n{len(reads)} reads while the lock was held, worst {worst[0]} "
          f"{worst[1] * 1000:.0f} ms; the PUT took {put_s[0]:.2f} s")
    assert worst[1] < READ_MAX_S, (worst, reads)
