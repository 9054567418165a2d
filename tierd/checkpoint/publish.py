"""Moving a committed checkpoint out of the pool into the namespace, and back to readers.

Writing: the region's bytes go to a hot-tier staging file with ``sendfile`` (memfd to
file, no copy through Python; in batches so the far-memory emulation can pace them), one
``fdatasync``, then :meth:`Namespace.put_file` publishes it without reading it again.  The
data's MD5 ETag is left to be computed on first S3 use: hashing 2 GiB would cost more
than the copy.  The manifest follows, and one rename makes the step appear.

Reading: the reader gets a descriptor of the hot data file (after the placement engine has
made it whole on hot, from warm or cold) and maps it privately: zero-copy, and its own
writes never reach the file.  The inode is held against eviction until the reader's
connection lets go.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tierd.acl import Identity
from tierd.checkpoint.manifest import DATA, MANIFEST, step_dir, tmp_dir
from tierd.errors import FsError
from tierd.mempool.pool import FarMemory, Region
from tierd.namespace.entries import RENAME_NOREPLACE
from tierd.tiers import fileio

if TYPE_CHECKING:
    from tierd.namespace import Namespace

BATCH = 64 << 20


def _sendfile_all(out_fd: int, in_fd: int, offset: int, count: int) -> None:
    """One batch from the region into the staging file, its writeback started at once (the
    final fdatasync then finds most of the file on the device)."""
    start, total = offset, count
    while count:
        n = os.sendfile(out_fd, in_fd, offset, count)
        if n == 0:
            raise OSError(f"sendfile from the pool stopped {count} bytes short")
        offset += n
        count -= n
    fileio.start_writeback(out_fd, start, total)


async def _write_temp(ns: Namespace, fill: Callable[[int], Awaitable[None]]) -> str:
    path, fd = ns.hot.new_temp()
    try:
        await fill(fd)
        await asyncio.to_thread(os.fdatasync, fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    os.close(fd)
    return path


async def publish(ns: Namespace, far: FarMemory, ident: Identity, bucket: str, run: str,
                  step: int, region: Region, manifest: dict[str, Any]) -> list[int]:
    """Write the step durably to the hot tier and rename it into place; its inodes."""
    size = int(manifest["size"])
    tmp = f"{run}/{tmp_dir(step)}"
    p = ns.placement
    # the persister waits for the rename: one upload under the final key, not an upload
    # of the temporary name and a server-side copy
    with p.publishing(f"{bucket}/{tmp}/") if p is not None else contextlib.nullcontext():
        return await _publish(ns, far, ident, bucket, run, step, region, manifest, tmp, size)


async def _publish(ns: Namespace, far: FarMemory, ident: Identity, bucket: str, run: str,
                   step: int, region: Region, manifest: dict[str, Any], tmp: str,
                   size: int) -> list[int]:

    async def fill_data(fd: int) -> None:
        await far.move(size, BATCH, lambda off, n: _sendfile_all(fd, region.fd, off, n))

    data_path = await _write_temp(ns, fill_data)
    data = await ns.put_file(ident, bucket, f"{tmp}/{DATA}", data_path, size)
    body = json.dumps(manifest, indent=1, sort_keys=True).encode()

    async def fill_manifest(fd: int) -> None:
        await asyncio.to_thread(os.pwrite, fd, body, 0)

    man_path = await _write_temp(ns, fill_manifest)
    man = await ns.put_file(ident, bucket, f"{tmp}/{MANIFEST}", man_path, len(body),
                            hashlib.md5(body).hexdigest(), {"content-type": "application/json"})
    run_dir = await ns.resolve(ident, f"{bucket}/{run}")
    await ns.rename(ident, run_dir.ino, tmp_dir(step).encode(), run_dir.ino,
                    step_dir(step).encode(), RENAME_NOREPLACE)
    await ns.sync()
    return [data.ino, man.ino]


async def remove_step_dir(ns: Namespace, ident: Identity, bucket: str, run: str,
                          name: str) -> None:
    """Delete one step directory (or a crash's temporary one) and what it holds."""
    try:
        for leaf in (DATA, MANIFEST):
            await ns.delete_object(ident, bucket, f"{run}/{name}/{leaf}")
        d = await ns.resolve(ident, f"{bucket}/{run}")
        await ns.rmdir(ident, d.ino, name.encode())
    except FsError as e:  # gone already (an implicit directory goes with its last key)
        if e.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise


async def read_manifest(ns: Namespace, ident: Identity, bucket: str, run: str,
                        step: int) -> dict[str, Any]:
    reader = await ns.get_object(ident, bucket, f"{run}/{step_dir(step)}/{MANIFEST}")
    try:
        raw = await reader.read_all()
    finally:
        await reader.close()
    doc = json.loads(raw)
    if not isinstance(doc, dict):
        raise ValueError("manifest is not a JSON object")
    return doc


async def open_data(ns: Namespace, ident: Identity, bucket: str, run: str,
                    step: int) -> tuple[int, int, str]:
    """(read-only fd of the whole data file on hot, inode, where it was: hot or cold).
    The caller owns one placement hold on the inode (release it when the reader is done)."""
    inode = await ns.resolve(ident, f"{bucket}/{run}/{step_dir(step)}/{DATA}")
    await ns.access(ident, inode.ino, os.R_OK)
    p = ns.placement
    where = "hot"
    if p is not None:
        p.acquire(inode.ino)
        try:
            if not p.hot_complete(inode.ino):
                where = "cold"
                await p.ensure(inode.ino, 0, inode.size, touch=False)
        except BaseException:
            p.release(inode.ino)
            raise
    try:
        fd = os.open(ns.hot.path(inode.ino), os.O_RDONLY | os.O_CLOEXEC)
    except BaseException:
        if p is not None:
            p.release(inode.ino)
        raise
    return fd, inode.ino, where
