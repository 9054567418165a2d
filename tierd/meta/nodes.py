"""What one node of a cluster sees of records that hold per-node state.

Several nodes share one namespace (one database: docs/cluster.md), but each has its own hot
and warm tiers.  So two kinds of metadata describe *a node's local files*, not the shared
file system, and must carry the node's name:

* **Keys about a node's data files**: ``O`` (orphans: unlinked files this node still has
  open), ``V`` (in-place write intentions on this node's hot file), ``G`` (this node's data
  file to reclaim) and ``W`` (the small-write log of this node's data file).  A node lists
  and recovers only its own; another node restarting must never bump the version of a file
  this node is writing, or reap an inode it has open.  With the node name ``""`` (a single
  node, the default) the keys are exactly the old ones, so existing stores need nothing.
* **Residency bitmaps** (``Inode.blocks``): which blocks of the current version are on a
  tier.  The placement code works with the *local view*, ``blocks["hot"]`` and
  ``blocks["warm"]`` of this node, as on a single node; the stored record keeps one entry
  per node, ``"hot@NODE"`` and ``"warm@NODE"``.  On a single node nothing is translated.

The rules of the stored form:

* ``Inode.home`` is the node that wrote the current version (it holds the bytes on its hot
  tier until they are in cold): every new version written through a node makes it the home.
* A missing hot entry means "the whole file" only for the home (as a missing ``"hot"`` did
  on a single node: a file written here and never evicted); for every other node it means
  "none of it".
* A new version drops every other node's entries: their copies are of the old content.
"""

from __future__ import annotations

import dataclasses
import struct

from tierd.meta.records import Inode

_U64 = struct.Struct(">Q")
#: the tiers whose residency is per node
LOCAL_TIERS = ("hot", "warm")


def scoped_prefix(kind: bytes, node: str) -> bytes:
    """The key prefix of a node's ``kind`` keys (``O``, ``V``, ``G``, ``W``): the old one
    for the single node ``""``."""
    return kind if not node else kind + node.encode() + b"\x00"


def scoped_key(kind: bytes, node: str, ino: int) -> bytes:
    return scoped_prefix(kind, node) + _U64.pack(ino)


def scoped_ino(key: bytes, prefix: bytes) -> int:
    """The inode number at the end of a scoped key listed under ``prefix``."""
    return int(_U64.unpack(key[len(prefix):len(prefix) + 8])[0])


def local_view(inode: Inode, node: str) -> Inode:
    """``inode`` as decoded from the store, turned (in place) into ``node``'s view: its own
    residency entries under the plain tier names, the other nodes' dropped."""
    if not node:
        return inode
    stored = inode.blocks
    view: dict[str, bytes] = {}
    for tier in LOCAL_TIERS:
        bm = stored.get(f"{tier}@{node}")
        if bm is not None:
            view[tier] = bm
        elif tier == "hot" and inode.home != node:
            view[tier] = b""  # not the home: nothing of it is here
    inode.blocks = view
    return inode


def stored_form(inode: Inode, old: Inode | None, node: str) -> Inode:
    """What ``node`` writes for ``inode`` (its local view), given the record it replaces
    (``old``, as stored): other nodes' entries kept while the version is the same, this
    node made the home of a new version.  ``inode`` itself is updated only in ``home``."""
    if not node:
        return inode
    same = old is not None and old.version == inode.version
    if not same and inode.is_reg:
        inode.home = node  # a new version is written here: its bytes are on this node
    elif old is not None and not inode.home:
        inode.home = old.home
    merged: dict[str, bytes] = {}
    if same and old is not None:
        merged = {k: v for k, v in old.blocks.items()
                  if "@" in k and k.rpartition("@")[2] != node}
    for tier in LOCAL_TIERS:
        bm = inode.blocks.get(tier)
        if bm is not None:
            merged[f"{tier}@{node}"] = bm
    return dataclasses.replace(inode, blocks=merged)


def holders(stored: Inode) -> set[str]:
    """The nodes that may hold a data file of the inode (from its stored record): the home
    and every node with a residency entry."""
    out = {k.rpartition("@")[2] for k in stored.blocks if "@" in k}
    if stored.home:
        out.add(stored.home)
    return out
