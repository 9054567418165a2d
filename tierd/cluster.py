"""What makes a daemon one node of a cluster (docs/cluster.md): its peer data door, its
client of the other nodes' doors, and the change feed that keeps its caches coherent.

A single node (``node_name`` empty) runs none of it.  The daemon enters :func:`cluster_node`
once its namespace is loaded and before its doors open, so the first read of a file another
node holds can already fetch it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from tierd.config import Config
from tierd.logs import get_logger
from tierd.meta import MetaStore
from tierd.namespace import Namespace
from tierd.peer import registry
from tierd.peer.client import PeerClient
from tierd.peer.door import PeerDoor
from tierd.peer.server import FileSlice, LocalReader, VersionGone
from tierd.placement import Placement
from tierd.placement.peerreads import VersionMoved

log = get_logger("cluster")


def local_reader(placement: Placement) -> LocalReader:
    """The peer door's reader: this node's bytes of one version of a file."""

    async def read(ino: int, version: int, offset: int,
                   length: int) -> bytes | memoryview | FileSlice | None:
        try:
            return await placement.read_held(ino, version, offset, length)
        except VersionMoved as e:
            raise VersionGone(str(e)) from e

    return read


def node_alive(meta: MetaStore, node: str) -> bool:
    """Whether ``node`` heart-beat within its lease (a node never registered is not)."""
    info = registry.lookup(meta, node)
    return info is not None and registry.alive(info)


@contextlib.asynccontextmanager
async def cluster_node(cfg: Config, meta: MetaStore, namespace: Namespace,
                       placement: Placement) -> AsyncIterator[PeerDoor]:
    """Run this node's part of the cluster until the block ends: the peer door (listening,
    registered, heart-beating) and the client placement reads other nodes' bytes with."""
    assert cfg.node_name and cfg.peer_listen is not None
    client = PeerClient(cfg.node_name, cfg.cluster_secret, meta)
    door = PeerDoor(node=cfg.node_name, secret=cfg.cluster_secret, listen=cfg.peer_listen,
                    meta=meta, reader=local_reader(placement),
                    url=cfg.peer_url)
    await door.start()
    placement.peer = client
    placement.home_alive = lambda node: node_alive(meta, node)
    try:
        yield door
    finally:
        placement.home_alive = None
        placement.peer = None
        await door.stop()
        await client.close()
