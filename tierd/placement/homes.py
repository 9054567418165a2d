"""Files whose home node is dead: taken over when cold has their bytes, reported when not.

On a cluster only a file's home persists it (:meth:`PlacementCore.mine`).  When the home
stops heart-beating for longer than its lease (:mod:`tierd.peer.registry`), what it queued
splits in two:

* **Reachable**: cold already has the current version (only names changed since: a rename,
  a link, an unlink the cold keys must follow).  Another node takes the file over: it
  makes itself the home in one transaction that checks the home and the version are still
  what it judged (so two nodes never both take it, and a home that came back and wrote a
  new version keeps it), with an explicit empty residency of its own (it holds none of the
  bytes), and persists the names like any of its files.
* **Stranded**: the version's bytes were only on the dead node's hot tier.  Nothing
  can persist them and no node may pretend to: they are listed by name in the status
  document (``placement.queue.stranded``) until the home comes back (with its data
  directory, it persists them as before) or an operator deletes or rewrites them.  A read
  of one meanwhile fails with EIO naming the node (:mod:`tierd.placement.peerreads`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tierd.meta import Inode, MetaStore
from tierd.placement.paths import file_keys

#: names listed per dead node in the status document
LISTED = 20
#: queued inodes read per transaction: each chunk's are read in one query over PostgreSQL
#: (a round trip each cost ~1,000 queries per node per full scan while a burst of creates
#: waited for its persist delay), below the engine's per-transaction read map
CHUNK = 1024


@dataclass
class Stranded:
    """Queued files of one dead node whose bytes no live node has."""

    node: str
    inos: set[int] = field(default_factory=set)
    keys: list[str] = field(default_factory=list)  # the first LISTED files' names

    def describe(self) -> dict[str, object]:
        return {"node": self.node, "files": len(self.inos), "first": self.keys}


def sweep(meta: MetaStore, node: str, queue: list[int],
          alive: Callable[[str], bool]) -> tuple[list[int], dict[str, Stranded]]:
    """Look at the queued files of other homes: the ones taken over (now this node's) and
    the stranded ones, by dead node.  Blocking metadata calls: a read transaction per
    :data:`CHUNK` queued files, one short write transaction per file taken over."""
    taken: list[int] = []
    stranded: dict[str, Stranded] = {}
    judged: dict[str, bool] = {}
    candidates: list[tuple[int, str, int, bool]] = []
    for at in range(0, len(queue), CHUNK):  # (each file is judged on its own: take_over
        chunk = queue[at:at + CHUNK]         # checks again what a chunk's snapshot saw)
        with meta.snapshot() as tx:
            tx.prefetch_inodes(chunk)
            dead: list[Inode] = []
            for ino in chunk:
                inode = tx.get_inode(ino)
                if inode is None or inode.home in ("", node):
                    continue
                home = inode.home
                if home not in judged:
                    judged[home] = alive(home)
                if not judged[home]:
                    dead.append(inode)
            tx.prefetch_inodes([inode.ino for inode in dead], cold=True)
            found: list[tuple[int, str, int, bool]] = []
            for inode in dead:
                ino, home = inode.ino, inode.home
                rec = tx.get_cold(ino)
                in_cold = rec is not None and rec.version == inode.version and bool(rec.keys)
                found.append((ino, home, inode.version, in_cold or inode.size == 0))
            for ino, home, _version, reachable in found:
                if not reachable:
                    s = stranded.setdefault(home, Stranded(home))
                    s.inos.add(ino)
                    if len(s.keys) < LISTED:
                        s.keys.extend(file_keys(tx, ino)[:1] or [f"(inode {ino}, no name)"])
        candidates += found
    for ino, home, version, reachable in candidates:
        if reachable and take_over(meta, ino, home, version):
            taken.append(ino)
    return taken, stranded


def take_over(meta: MetaStore, ino: int, home: str, version: int) -> bool:
    """Make this node the home of ``ino`` if it is still ``home``'s at ``version``."""
    with meta.write() as tx:
        inode = tx.get_inode(ino)
        if inode is None or inode.home != home or inode.version != version:
            return False
        inode.home = meta.node
        inode.blocks["hot"] = inode.blocks.get("hot", b"")  # holds none: reads from cold
        tx.put_inode(inode)
    return True
