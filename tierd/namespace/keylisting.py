"""Key listings: S3's ordered view of the directory tree, served by range scans.

A listing walks the bucket's directories in key order, pruning subtrees that cannot hold a
key after ``start_after`` with ``prefix``, and rolls a subtree into one common prefix as soon
as its key holds the delimiter -- so a page costs the keys it returns plus the directories on
the way, never a whole directory in memory.  Kept apart from :mod:`tierd.namespace.objects`
(writes and reads of whole objects), which builds on it.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from dataclasses import dataclass, field

from tierd.acl import Identity
from tierd.acl.s3map import allowed, enforce
from tierd.errors import FsError
from tierd.meta import EMPTY_MD5, Inode, MetaTxn
from tierd.namespace.files import FileOps


@dataclass
class Listing:
    """One page of a key listing: objects, common prefixes, and where to go on."""

    contents: list[tuple[str, Inode]] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    truncated: bool = False
    next_marker: str = ""


class KeyListing(FileOps):
    """``list_objects`` and the walk under it."""

    def _bucket_dir(self, tx: MetaTxn, name: str) -> Inode:
        b = tx.get_bucket(name)
        if b is None:
            raise FsError(errno.ENOENT, f"bucket {name!r} does not exist")
        return self._get(tx, b.ino)

    async def list_objects(
        self,
        ident: Identity,
        bucket: str,
        prefix: str = "",
        start_after: str = "",
        delimiter: str = "",
        limit: int = 1000,
    ) -> Listing:
        """One page of keys in S3 order, served by range scans of the sorted directory
        entries (never a whole directory in memory).  Empty directories list as markers."""
        out = Listing()
        # show what cold has (transparent import)
        await self.placement.refresh_key(bucket, prefix, recursive=not delimiter)
        p, sa, dl = prefix.encode(), start_after.encode(), delimiter.encode()

        def reads(tx: MetaTxn) -> None:  # the walk's, off the loop first (tierd.meta.atxn)
            walk = self._walk(tx, ident, self._bucket_dir(tx, bucket), b"", p, sa, dl)
            for _ in zip(range(limit + 1), walk, strict=False):
                pass
        async with self.meta.asnapshot(warm=reads) as tx:
            root = self._bucket_dir(tx, bucket)
            enforce(ident, "ListObjects", directory=root, key=bucket)
            last_cp = b""
            for key, inode in self._walk(tx, ident, root, b"", p, sa, dl):
                if dl:
                    i = key.find(dl, len(p))
                    if i >= 0:
                        cp = key[: i + len(dl)]
                        if cp == last_cp or (sa and cp <= sa):
                            continue
                        if len(out.contents) + len(out.prefixes) >= limit:
                            out.truncated = True
                            break
                        out.prefixes.append(cp.decode("utf-8", "surrogateescape"))
                        last_cp = cp
                        out.next_marker = out.prefixes[-1]
                        continue
                if len(out.contents) + len(out.prefixes) >= limit:
                    out.truncated = True
                    break
                k = key.decode("utf-8", "surrogateescape")
                out.contents.append((k, self._live(inode)))
                out.next_marker = k
        for i, (k, inode) in enumerate(out.contents):
            if inode.is_dir:
                inode.etag, inode.size = EMPTY_MD5, 0
            elif not inode.etag:
                inode.etag = await self.etag(inode.ino)
            out.contents[i] = (k, inode)
        return out

    def _walk(
        self, tx: MetaTxn, ident: Identity, d: Inode, base: bytes, prefix: bytes,
        start_after: bytes, delimiter: bytes = b"",
    ) -> Iterator[tuple[bytes, Inode]]:
        """Keys under directory ``d`` (whose keys start with ``base``) that start with
        ``prefix`` and sort after ``start_after``, in order, pruning whole subtrees.  With a
        ``delimiter``, a directory whose key already holds the delimiter past the prefix is
        yielded once (as its ``name/`` key) instead of walked: every key below it rolls up
        into the same common prefix."""
        start = b""
        if prefix.startswith(base):
            start = prefix[len(base):].split(b"/")[0]
        if start_after.startswith(base):
            start = max(start, start_after[len(base):].split(b"/")[0])
        elif start_after > base:
            return
        for _, skey, dirent in tx.list_dirents(d.ino, start=start):
            key = base + skey
            if not (key.startswith(prefix) or prefix.startswith(key)):
                if key > prefix:
                    return
                continue
            inode = tx.get_inode(dirent.ino)
            if inode is None:
                continue
            if inode.is_dir:
                if not tx.has_children(inode.ino):
                    if key.startswith(prefix) and key > start_after:
                        yield key, inode
                    continue
                if not (start_after.startswith(key) or key > start_after):
                    continue
                if not allowed(ident, "ListObjects", directory=inode):
                    continue  # like find(1): a subtree the caller cannot read is skipped
                if delimiter and key.startswith(prefix) and key.find(delimiter, len(prefix)) >= 0:
                    yield key, inode
                    continue
                yield from self._walk(tx, ident, inode, key, prefix, start_after, delimiter)
            elif (inode.is_reg or inode.is_lnk) and key > start_after and key.startswith(prefix):
                yield key, inode

