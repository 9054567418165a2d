"""What a node's kernel cached about a file is dropped when another node changes it.

The FUSE door gives the kernel entries and attributes for 300 s; on a cluster the change
feed of the shared database (tierd.meta.pg_changes, tierd.namespace.remote) tells every
node what the others changed, and each node's door invalidates its kernel's entries,
attributes and kept pages.  Each test first makes n2's kernel cache the old state, then
changes it through n1, and polls n2: without the feed n2 would see the old state for five
minutes; with it, within the feed's delay (measured: under a second here)."""

from __future__ import annotations

import errno
import os
import stat

from .clusterlib import Cluster, poll

BUCKET = "kcache"
LIMIT = 5.0  # seconds: far under the kernel's 300 s timeouts


def _mode(p: os.PathLike[str]) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def _missing(p: os.PathLike[str]) -> bool:
    try:
        os.stat(p)
    except OSError as e:
        return e.errno == errno.ENOENT
    return False


def test_another_nodes_chmod_rename_and_rewrite_reach_this_nodes_kernel(
        cluster: Cluster) -> None:
    cluster[1].s3().create_bucket(Bucket=BUCKET)
    a1, a2 = cluster[1].path(BUCKET, "f"), cluster[2].path(BUCKET, "f")
    a1.write_bytes(b"one" * 1000)
    assert a2.read_bytes() == b"one" * 1000  # n2's kernel: entry, attributes, pages
    assert _mode(a2) == 0o644
    os.chmod(a1, 0o600)
    took = poll(lambda: _mode(a2) == 0o600, LIMIT)
    assert took < LIMIT
    # a rewrite in place through n1 (same inode, new version): n2 reads the new bytes
    with open(a1, "r+b") as f:
        f.write(b"TWO")
    poll(lambda: a2.read_bytes()[:6] == b"TWOone", LIMIT)
    # a rename through n1: n2's cached name goes, the new one is there
    os.rename(a1, cluster[1].path(BUCKET, "g"))
    poll(lambda: _missing(a2), LIMIT)
    assert cluster[2].path(BUCKET, "g").read_bytes()[:6] == b"TWOone"
    # an S3 delete through n3: gone from n2's mount
    cluster[3].s3().delete_object(Bucket=BUCKET, Key="g")
    poll(lambda: _missing(cluster[2].path(BUCKET, "g")), LIMIT)


def _hot_file(node: object, ino: int) -> os.PathLike[str]:
    h = f"{ino:016x}"
    return node.data_dir / "hot" / h[-2:] / h  # type: ignore[attr-defined, no-any-return]


def test_a_file_deleted_through_another_node_leaves_no_copy_on_any_hot_tier(
        cluster: Cluster) -> None:
    """The home (n1) holds the bytes it wrote, n2 a copy it read; a delete through n3 writes
    a garbage key for each, and each node reclaims its own file when the change feed brings
    the key (not only at its next start)."""
    cluster[1].s3().create_bucket(Bucket=BUCKET + "-gc")
    cluster[1].s3().put_object(Bucket=BUCKET + "-gc", Key="obj", Body=b"z" * 300_000)
    ino = os.stat(cluster[1].path(BUCKET + "-gc", "obj")).st_ino
    assert cluster[2].s3().get_object(Bucket=BUCKET + "-gc",
                                      Key="obj")["Body"].read() == b"z" * 300_000
    on1, on2 = _hot_file(cluster[1], ino), _hot_file(cluster[2], ino)
    assert os.path.exists(on1) and os.path.exists(on2)
    cluster[3].s3().delete_object(Bucket=BUCKET + "-gc", Key="obj")
    poll(lambda: not os.path.exists(on1) and not os.path.exists(on2), LIMIT)
