"""What makes a daemon one node of a cluster (docs/cluster.md): its peer data door, its
client of the other nodes' doors, and the change feed that keeps its caches coherent.

A single node (``node_name`` empty) runs none of it.  The daemon enters :func:`cluster_node`
once its namespace is loaded and before its doors open, so the first read of a file another
node holds can already fetch it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from tierd.config import Config
from tierd.meta import MetaStore
from tierd.namespace import Namespace
from tierd.namespace.remote import follow
from tierd.peer import registry
from tierd.peer.client import PeerClient
from tierd.peer.door import PeerDoor
from tierd.peer.server import FileSlice, LocalReader, VersionGone
from tierd.placement import Placement
from tierd.placement.peerreads import VersionMoved


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


def follow_cluster(namespace: Namespace, placement: Placement, meta: MetaStore,
                   forget_keys: Callable[[], None]) -> Callable[[], None] | None:
    """Follow the other nodes' commits (the engine's change feed): the namespace's
    subscribers hear what changed (the FUSE door drops the kernel's cached entries and
    attributes), this node reclaims its copies of files deleted elsewhere, forgets cached
    S3 credentials when users or keys changed (a key revoked through one node stops
    working on every node), reads placement policies again when they changed, and
    reclaims its multipart part files that uploads ended or re-uploaded elsewhere left."""

    def also(keys: list[bytes] | None) -> None:
        kinds = None if keys is None else {k[:1] for k in keys}
        if kinds is None or kinds & {b"K", b"N"}:
            forget_keys()
        if kinds is None or b"Y" in kinds:
            placement.reload_policies()
        if kinds is None or kinds & {b"M", b"P"}:
            namespace.uploads_changed(keys)

    return follow(namespace, meta.engine, also=also)


@contextlib.asynccontextmanager
async def cluster_node(cfg: Config, meta: MetaStore, namespace: Namespace,
                       placement: Placement) -> AsyncIterator[PeerDoor]:
    """Run this node's part of the cluster until the block ends: the peer door (listening,
    registered, heart-beating) and the client placement reads other nodes' bytes with."""
    assert cfg.node_name and cfg.peer_listen is not None
    client = PeerClient(cfg.node_name, cfg.cluster_secret, meta)
    door = PeerDoor(node=cfg.node_name, secret=cfg.cluster_secret, listen=cfg.peer_listen,
                    meta=meta, reader=local_reader(placement),
                    url=cfg.peer_url, part_reader=namespace.part_slice)
    await door.start()
    placement.peer = client
    namespace.part_peer = client
    placement.home_alive = lambda node: node_alive(meta, node)
    try:
        yield door
    finally:
        placement.home_alive = None
        placement.peer = None
        namespace.part_peer = None
        await door.stop()
        await client.close()
