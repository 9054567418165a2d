"""Keys of inodes in the cold store, from the reverse link index (``L`` keys).

A file's cold keys are ``<bucket>/<key>`` for every name it has (hard links: several).
Directories have exactly one name, so the walk up to the root is a chain of point reads.
"""

from __future__ import annotations

from tierd.meta import ROOT_INO, MetaTxn


def dir_path(tx: MetaTxn, ino: int) -> str | None:
    """``bucket/a/b`` for a directory (``bucket`` for a bucket), None if detached."""
    parts: list[bytes] = []
    seen = 0
    while ino != ROOT_INO:
        links = tx.links(ino)
        if not links or seen > 4096:
            return None
        ino, name = links[0]
        parts.append(name)
        seen += 1
    if not parts:
        return None
    return b"/".join(reversed(parts)).decode("utf-8", "surrogateescape")


def file_keys(tx: MetaTxn, ino: int) -> list[str]:
    """Every cold key naming file ``ino``, sorted (the first is where content is uploaded)."""
    keys: list[str] = []
    for parent, name in tx.links(ino):
        if parent == ROOT_INO:
            continue
        d = dir_path(tx, parent)
        if d is not None:
            keys.append(d + "/" + name.decode("utf-8", "surrogateescape"))
    return sorted(keys)


def resolve(tx: MetaTxn, key: str) -> int | None:
    """The inode a cold key names in the namespace now (no symlinks followed)."""
    bucket, _, rest = key.partition("/")
    b = tx.get_bucket(bucket)
    if b is None:
        return None
    ino = b.ino
    for seg in rest.split("/"):
        d = tx.lookup(ino, seg.encode("utf-8", "surrogateescape"))
        if d is None:
            return None
        ino = d.ino
    return ino
