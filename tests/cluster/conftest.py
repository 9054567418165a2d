"""Fixtures of the cluster tests: one PostgreSQL server and one moto server for the session,
and three-node clusters (:mod:`tests.cluster.clusterlib`): ``cluster`` gives a module the
session's cluster for its ``cluster_settings`` (override it for other settings, e.g. a
persist delay), started the first time a module asks for those settings.

Skipped without FUSE or PostgreSQL, except under ``CI`` (dev.sh installs both), where they
fail.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from meta.pg_server import PgServer, find_bindir
from moto_server import MotoServer

from .clusterlib import Cluster, running_cluster

#: s3_complete_keepalive of the clusters with the default settings
KEEPALIVE = 2.0


def _missing() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing: no FUSE in this machine or container"
    if find_bindir() is None:
        return "PostgreSQL is not installed (`./dev.sh setup` installs it)"
    return None


@pytest.fixture(scope="session")
def cluster_pg() -> Iterator[PgServer]:
    """The PostgreSQL server of every cluster of the session (fsync off: the tests kill
    clients and the server process, never the machine)."""
    why = _missing()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    bindir = find_bindir()
    assert bindir is not None
    server = PgServer(bindir, fsync=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cluster_settings() -> dict[str, str]:
    """``TIERD_*`` settings of every node of the module's cluster (override per module).
    A CompleteMultipartUpload starts its kept-alive answer after 2 s, not 10 (the stalled
    Complete's test waits for it twice)."""
    return {"TIERD_S3_COMPLETE_KEEPALIVE": str(KEEPALIVE)}


class ClusterPool:
    """The session's clusters, one per set of settings: modules with the same
    ``cluster_settings`` share one (starting three daemons is most of a module's time), each
    in buckets of its own."""

    def __init__(self, pg: PgServer, moto: MotoServer) -> None:
        self.pg, self.moto = pg, moto
        self.stack = contextlib.ExitStack()
        self.clusters: dict[frozenset[tuple[str, str]], Cluster] = {}

    def get(self, settings: dict[str, str]) -> Cluster:
        key = frozenset(settings.items())
        c = self.clusters.get(key)
        if c is None:
            base = self.stack.enter_context(tempfile.TemporaryDirectory(prefix="tierd-cluster-"))
            c = self.clusters[key] = self.stack.enter_context(
                running_cluster(Path(base), self.pg, self.moto, 3, **settings))
        c.pg_resume()  # a module that failed half-way may leave the database stopped ...
        for node in c.nodes:  # ... or a node killed
            if not node.running:
                node.restart()
        return c


@pytest.fixture(scope="session")
def cluster_pool(cluster_pg: PgServer, moto: MotoServer) -> Iterator[ClusterPool]:
    pool = ClusterPool(cluster_pg, moto)
    with pool.stack:
        yield pool


@pytest.fixture(scope="module")
def cluster(cluster_pool: ClusterPool, cluster_settings: dict[str, str]) -> Cluster:
    """Three nodes n1, n2, n3 over one database and one cold store, shared with the other
    modules of the session that ask for the same ``cluster_settings``."""
    return cluster_pool.get(cluster_settings)


@pytest.fixture(scope="module")
def bucket(cluster: Cluster, request: pytest.FixtureRequest) -> str:
    """The module's bucket (its ``BUCKET``), made through n1's S3 door."""
    name: str = request.module.BUCKET
    cluster[1].s3().create_bucket(Bucket=name)
    return name
