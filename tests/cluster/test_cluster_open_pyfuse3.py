"""Close-to-open across nodes on the pyfuse3 backend: the rounds of
:mod:`tests.cluster.test_cluster_open` with every node's change feed stalled, on a cluster
whose nodes serve their mounts through pyfuse3 (``fuse_backend = "pyfuse3"``), where the
door's attribute invalidation at OPEN goes through libfuse (``pyfuse3.invalidate_inode``
with ``attr_only``) instead of the kernel backend's own notification."""

from __future__ import annotations

import pytest

from .clusterlib import Cluster, feeds_stalled
from .test_cluster_open import BUCKET, _run


@pytest.fixture(scope="module")
def cluster_settings() -> dict[str, str]:
    return {"TIERD_FUSE_BACKEND": "pyfuse3"}


def test_pyfuse3_close_to_open_does_not_wait_for_the_change_feed(cluster: Cluster) -> None:
    cluster[1].s3().create_bucket(Bucket=BUCKET)
    with feeds_stalled(cluster) as pids:
        assert len(pids) == len(cluster.nodes), pids
        failures = _run(cluster, "p", 2, 40)
    assert not failures, "\n".join(failures[:20])
