"""Bytes another node of a cluster holds: fetched from its peer data door, served to it.

On a node of a cluster (docs/cluster.md) a file's current version lives where it was
written -- on its home node's hot tier -- until the persister of that node puts it in cold.
A reader on another node that misses a block of such a version cannot fetch it from cold
(cold has an older version, or nothing): it asks the home's peer data door for the range,
and keeps the bytes in its own hot file like a fill from cold (its own residency bitmap,
:mod:`tierd.meta.nodes`).  The home answers only for the version it holds, so a reader never
gets bytes of another version: when the version moved on, the fill is dropped and the
reader looks at the metadata again.

The door itself (signing, the HTTP server and client, the node registry) is
:mod:`tierd.peer`; placement only needs a :class:`PeerReader`.
"""

from __future__ import annotations

import errno
from typing import Protocol

from tierd.errors import FsError, Reason
from tierd.meta import ColdRecord
from tierd.tiers import LocalTier, fileio

#: bytes asked of a peer per request (its door caps a request; a run is split)
PEER_CHUNK = 8 << 20


class PeerReader(Protocol):
    """Reads a range of a version another node holds (:class:`tierd.peer.client.PeerClient`)."""

    async def read(self, home: str, ino: int, version: int, offset: int,
                   length: int) -> bytes:
        """The bytes; FsError EIO when the node cannot answer, :class:`VersionMoved`
        (or a subclass) when it no longer holds ``version``."""
        ...


class VersionMoved(Exception):
    """The node asked holds another version of the file than the reader's (it changed)."""


def held_elsewhere(node: str, home: str, version: int, rec: ColdRecord | None) -> bool:
    """Whether a block missing here must come from the home node rather than from cold:
    this is a node of a cluster, another node wrote the version, and cold does not have
    that version yet."""
    if not node or not home or home == node:
        return False
    return rec is None or rec.version != version or not rec.keys


async def copy_from_peer(peer: PeerReader | None, tier: LocalTier, ino: int, home: str,
                         version: int, offset: int, length: int) -> None:
    """``[offset, offset+length)`` of ``ino`` at ``version`` from ``home`` into ``tier``'s
    file of it.  FsError EIO (reason ServiceUnavailable) when no peer door is configured or
    the home does not answer; ESTALE when the home holds another version now."""
    if peer is None:
        raise FsError(errno.EIO, f"inode {ino}: version {version} is held by node {home!r} "
                      "and not yet in the cold store, and this node has no peer door",
                      reason=Reason.SERVICE_UNAVAILABLE)
    pos, end = offset, offset + length
    async with tier.fd(ino, create=True) as fd:
        while pos < end:
            n = min(PEER_CHUNK, end - pos)
            try:
                data = await peer.read(home, ino, version, pos, n)
            except VersionMoved as e:
                raise FsError(errno.ESTALE, f"inode {ino} changed on node {home!r} while it "
                              f"was read: {e}") from e
            if len(data) != n:
                raise FsError(errno.EIO, f"inode {ino}: node {home!r} answered {len(data)} "
                              f"bytes for {n} at {pos}",
                              reason=Reason.SERVICE_UNAVAILABLE)
            await fileio.pwrite(fd, data, pos)
            pos += n
