"""The reads of common namespace transactions, for their callers to have them made off the
event loop before the body runs (``warm=`` of ``meta.awrite``/``meta.asnapshot``:
:mod:`tierd.meta.atxn`, :mod:`tierd.meta.pg_warm`).

These run in another thread, on a read-only view: they read the transaction and their
arguments only, check no permission (a check may change the caller's identity: a symbolic
link turns a policy grant off) and stop wherever a record is missing.  What they read is a
hint; the body reads everything again and decides.
"""

from __future__ import annotations

from tierd.meta.store import ROOT_INO, MetaTxn

#: counters a transaction that creates or replaces a file reads (``MetaTxn.put_inode``)
FILE_COUNTERS = ("next_version", "inodes", "bytes")


def path_reads(tx: MetaTxn, bucket: str, segments: list[bytes]) -> None:
    """The bucket's record, and each entry of ``bucket/segments`` from the namespace root
    with its inode (as a path is resolved: a body whose snapshot is older than the node's
    cache reads every key from the server, however often it is read)."""
    tx.get_bucket(bucket)
    cur = tx.get_inode(ROOT_INO)
    for seg in [bucket.encode("utf-8", "surrogateescape"), *segments]:
        if cur is None or not cur.is_dir:
            return
        entry = tx.lookup(cur.ino, seg)
        cur = None if entry is None else tx.get_inode(entry.ino)


def put_reads(bucket: str, segments: list[bytes], ino: int, tx: MetaTxn) -> None:
    """A PUT's transaction (``ObjectOps._commit_put``) storing inode ``ino`` at the key."""
    for name in FILE_COUNTERS:
        tx.counter(name)
    tx.new_inode(ino, False)  # (its keys: known absent, no read)
    path_reads(tx, bucket, segments)


def entry_reads(tx: MetaTxn, parent: int, name: bytes) -> None:
    """Directory ``parent``, its entry ``name`` and the inode it names with that inode's
    queue mark.  (Not an unlink's or a rename's prefetch: their keys are mostly in the
    cache already -- the node made the file -- and the prefetch's own round trips, taken
    under the writer lock, measured slower: docs/metadata.md.)"""
    for name_ in FILE_COUNTERS:
        tx.counter(name_)
    tx.get_inode(parent)
    entry = tx.lookup(parent, name)
    if entry is not None:
        tx.get_inode(entry.ino)
        tx.queued(entry.ino)


def create_reads(tx: MetaTxn, parent: int, name: bytes) -> None:
    """A create of ``name`` in ``parent``: :func:`entry_reads`, and the inode the create
    will number (the next of ``next_ino``: exact, as the body holds the same writer lock
    and sees the same counter; and any number past the counter was never used), whose keys
    are known absent without a read (``MetaTxn.new_inode``)."""
    entry_reads(tx, parent, name)
    tx.new_inode(tx.counter("next_ino") + 1, False)
