"""Writers that run against a cluster while a test breaks something, each keeping a journal
of what it was told: the names acknowledged (with the SHA-256 of their bytes), the failures
of an allowed kind (S3 5xx, FUSE EIO) and any other failure.  After the fault, a test checks
the journals: every acknowledged name must read back whole."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from botocore.exceptions import ClientError

from .clusterlib import Node


@dataclass
class Journal:
    """What one writer was told."""

    node: Node
    tag: str  # the writer's names are TAG/0, TAG/1, ...
    acked: dict[str, str] = field(default_factory=dict)  # key -> sha256 hex
    failed: list[str] = field(default_factory=list)  # 5xx / EIO
    wrong: list[str] = field(default_factory=list)  # any other failure
    broken: list[str] = field(default_factory=list)  # no answer: the node's door went away


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def s3_writer(bucket: str, j: Journal, stop: threading.Event) -> None:
    """PUT TAG/i of growing sizes until ``stop``."""
    s3 = j.node.s3(read_timeout=30, connect_timeout=5)
    i = 0
    while not stop.is_set():
        key = f"{j.tag}/{i}"
        data = os.urandom(1000 + 37 * i)
        try:
            s3.put_object(Bucket=bucket, Key=key, Body=data)
        except ClientError as e:
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            (j.failed if status >= 500 else j.wrong).append(f"{key}: {status} {e}")
        except Exception as e:  # a broken connection, a timeout: the door itself failed
            j.broken.append(f"{key}: {type(e).__name__}: {e}")
        else:
            j.acked[key] = digest(data)
        i += 1
        time.sleep(0.002)


def fuse_writer(bucket: str, j: Journal, stop: threading.Event) -> None:
    """Write, fsync and close TAG/i through the node's mount until ``stop``."""
    j.node.path(bucket, j.tag).mkdir()
    i = 0
    while not stop.is_set():
        key = f"{j.tag}/{i}"
        data = os.urandom(1000 + 41 * i)
        try:
            with open(j.node.path(bucket, key), "wb") as f:
                f.write(data)
                os.fsync(f.fileno())
        except OSError as e:
            if e.errno in (errno.ENOTCONN, errno.ECONNABORTED):  # the mount's daemon died
                j.broken.append(f"{key}: {e!r}")
            else:
                (j.failed if e.errno == errno.EIO else j.wrong).append(f"{key}: {e!r}")
        else:
            j.acked[key] = digest(data)
        i += 1
        time.sleep(0.002)


Writer = Callable[[str, Journal, threading.Event], None]


@contextlib.contextmanager
def traffic(bucket: str, writers: list[tuple[Node, str, Writer]]) -> Iterator[list[Journal]]:
    """Run ``writers`` (node, tag, function) in threads for the ``with`` block; they stop and
    are joined at its end (a writer that hangs fails the test).  Tags get a unique prefix."""
    run = f"{time.monotonic_ns():x}"
    stop = threading.Event()
    journals = [Journal(node, f"{run}-{tag}") for node, tag, _ in writers]
    threads = [threading.Thread(target=fn, args=(bucket, j, stop), daemon=True)
               for j, (_, _, fn) in zip(journals, writers, strict=True)]
    for t in threads:
        t.start()
    try:
        yield journals
    finally:
        stop.set()
        for t in threads:
            t.join(60)
            assert not t.is_alive(), "a writer hung"


def listed(node: Node, bucket: str, prefix: str) -> set[str]:
    """Every key under ``prefix`` that ``node`` lists."""
    return {o["Key"] for page in node.s3().get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix) for o in page.get("Contents", [])}
