"""Keys of inodes in the cold store, from the reverse link index (``L`` keys).

A file's cold keys are ``<bucket>/<key>`` for every name it has (hard links: several).
Directories have exactly one name, so the walk up to the root is a chain of point reads.
Also the persist queue's token (the ``Q`` value), written by the hooks and the importer.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator, Sequence

from tierd.meta import ROOT_INO, Inode, MetaTxn, PlacementPolicy
from tierd.meta.kv import prefix_end

#: cold prefix of noncurrent versions: ``<bucket>/.tierd-versions/<key>/<version id>``
#: (:mod:`tierd.namespace.versions`); never imported as ordinary objects
VERSIONS_DIR = ".tierd-versions"


def is_version_key(key: str) -> bool:
    """Whether cold key ``key`` holds a noncurrent version (not a namespace entry)."""
    parts = key.split("/", 2)
    return len(parts) > 2 and parts[1] == VERSIONS_DIR


def queue_token(old: bytes | None) -> bytes:
    """A new queue token: unique (the persister's change check) but keeping the time the
    file was first queued (the persist delay and the queue's age count from then)."""
    stamp = old[:8] if old is not None else time.time_ns().to_bytes(8, "big")
    return stamp + os.urandom(4)


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


def file_keys(tx: MetaTxn, ino: int, *, named: bool = True) -> list[str]:
    """Every cold key naming file ``ino``, sorted (the first is where content is uploaded).
    ``named=False``: the caller knows ``ino`` has no name left (its last dirent went in
    this transaction, or it never had one), so the reverse index is not scanned: a scan of
    the transaction's layers for the ``L`` keys it just removed was ~30% of an unlink's
    handler time."""
    keys: list[str] = []
    for parent, name in tx.links(ino) if named else ():
        if parent == ROOT_INO:
            continue
        d = dir_path(tx, parent)
        if d is not None:
            keys.append(d + "/" + name.decode("utf-8", "surrogateescape"))
    if not keys:  # no name: a noncurrent version of a versioned bucket has its own key
        from tierd.namespace.versions import cold_keys  # here: the namespace imports us
        keys = cold_keys(tx, ino)
    return sorted(keys)


def keys_policy(keys: Sequence[str],
                policy_for: Callable[[str], PlacementPolicy]) -> PlacementPolicy | None:
    """The placement policy of a file whose cold keys are ``keys`` (:func:`file_keys`
    order): the policy of its first key; None when it has none (no name, nothing to place).

    One name decides, so a hard-linked file has one policy, not a pin from one name, a
    cache-only mode from a second and the warm tier from a third.  The first one, because it
    is the name the content is uploaded under (the other names are copies of that object)
    and the one every user of a policy took already -- the persister's mode, the read
    path's tier, the memory tier, write-through, the operator's policy change -- while
    eviction alone asked whether any name pinned the file; it follows the rule now (a file
    whose first name is not pinned is evictable, whatever its other names:
    ``tests/placement/test_file_policy.py``)."""
    return policy_for(keys[0]) if keys else None


def file_policy(tx: MetaTxn, ino: int,
                policy_for: Callable[[str], PlacementPolicy]) -> PlacementPolicy | None:
    """:func:`keys_policy` of file ``ino``'s cold keys: the one place a file's placement
    policy is decided (``policy_for``: the longest-prefix lookup of the policies set)."""
    return keys_policy(file_keys(tx, ino), policy_for)


def resolve(tx: MetaTxn, key: str) -> int | None:
    """The inode a cold key names in the namespace now (no symlinks followed)."""
    bucket, _, rest = key.partition("/")
    b = tx.get_bucket(bucket)
    if b is None:
        return None
    if is_version_key(key):
        from tierd.namespace.versions import resolve_cold  # here: the namespace imports us
        return resolve_cold(tx, bucket, rest[len(VERSIONS_DIR) + 1:])
    ino = b.ino
    for seg in rest.split("/"):
        d = tx.lookup(ino, seg.encode("utf-8", "surrogateescape"))
        if d is None:
            return None
        ino = d.ino
    return ino


def files_under(tx: MetaTxn, prefix: str, versions: bool = False) -> Iterator[Inode]:
    """Regular files with a name under ``prefix`` (``bucket/key-prefix``), each once; with
    ``versions`` the noncurrent versions of keys under it too (evict, persist --wait).

    Only the matching subtree is read: complete segments are looked up, the last, partial
    one is a range scan of its directory's entries (sorted by name), and matching
    directories are walked.  An operator command on one dataset costs that dataset, not
    the namespace."""
    seen: set[int] = set()
    if versions:
        yield from _versions_under(tx, prefix, seen)
    bucket, sep, rest = prefix.partition("/")
    if not sep:  # a bucket-name prefix ("" is everything)
        for b in tx.list_buckets():
            if b.name.startswith(bucket):
                yield from _walk(tx, b.ino, seen)
        return
    top = tx.get_bucket(bucket)
    if top is None:
        return
    *dirs, last = rest.split("/")
    ino = top.ino
    for seg in dirs:
        ent = tx.lookup(ino, seg.encode("utf-8", "surrogateescape"))
        if ent is None or not stat.S_ISDIR(ent.kind):
            return
        ino = ent.ino
    if not last:
        yield from _walk(tx, ino, seen)
        return
    start = last.encode("utf-8", "surrogateescape")
    for name, _, ent in tx.list_dirents(ino, start=start, end=prefix_end(start)):
        if not name.startswith(start):
            continue
        if stat.S_ISDIR(ent.kind):
            yield from _walk(tx, ent.ino, seen)
        else:
            yield from _file(tx, ent.ino, seen)


def _versions_under(tx: MetaTxn, prefix: str, seen: set[int]) -> Iterator[Inode]:
    from tierd.namespace import versions as vs  # here: the namespace imports us

    bucket, sep, rest = prefix.partition("/")
    for b in tx.list_buckets():
        if b.name == bucket if sep else b.name.startswith(bucket):
            for v in vs.scan(tx, b.name, rest if sep else ""):
                if v.ino:
                    yield from _file(tx, v.ino, seen)


def _walk(tx: MetaTxn, top: int, seen: set[int]) -> Iterator[Inode]:
    stack = [top]
    while stack:
        for _, _, ent in tx.list_dirents(stack.pop()):
            if stat.S_ISDIR(ent.kind):
                stack.append(ent.ino)
            else:
                yield from _file(tx, ent.ino, seen)


def _file(tx: MetaTxn, ino: int, seen: set[int]) -> Iterator[Inode]:
    if ino in seen:
        return
    seen.add(ino)
    inode = tx.get_inode(ino)
    if inode is not None and inode.is_reg and inode.nlink > 0:
        yield inode
