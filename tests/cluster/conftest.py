"""Fixtures of the cluster tests: one PostgreSQL server and one moto server for the session,
and a three-node cluster (:mod:`tests.cluster.clusterlib`) per test module that asks for
``cluster``.  A module needing other settings (a persist delay) overrides
``cluster_settings``.

Skipped without FUSE or PostgreSQL, except under ``CI`` (dev.sh installs both), where they
fail.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from meta.pg_server import PgServer, find_bindir
from moto_server import MotoServer

from .clusterlib import Cluster, running_cluster


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
    """``TIERD_*`` settings of every node of the module's cluster (override per module)."""
    return {}


@pytest.fixture(scope="module")
def cluster(cluster_pg: PgServer, moto: MotoServer,
            cluster_settings: dict[str, str]) -> Iterator[Cluster]:
    """Three nodes n1, n2, n3 over one database and one cold store, for the module."""
    with tempfile.TemporaryDirectory(prefix="tierd-cluster-") as base, \
            running_cluster(Path(base), cluster_pg, moto, 3, **cluster_settings) as c:
        yield c


@pytest.fixture(scope="module")
def bucket(cluster: Cluster, request: pytest.FixtureRequest) -> str:
    """The module's bucket (its ``BUCKET``), made through n1's S3 door."""
    name: str = request.module.BUCKET
    cluster[1].s3().create_bucket(Bucket=name)
    return name
