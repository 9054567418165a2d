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
from typing import Any

from tierd.acl import Identity
from tierd.checkpoint.manifest import DATA, MANIFEST, part_name, step_dir, tmp_dir
from tierd.errors import FsError
from tierd.mempool.pool import FarMemory, Region
from tierd.namespace.api import RENAME_NOREPLACE, Inode, NamespaceAPI
from tierd.tiers import fileio

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


async def _write_temp(ns: NamespaceAPI, fill: Callable[[int], Awaitable[None]]) -> str:
    path, fd = ns.staging_file()
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


async def publish(ns: NamespaceAPI, far: FarMemory, ident: Identity, bucket: str, run: str,
                  step: int, region: Region, manifest: dict[str, Any]) -> list[int]:
    """Write the step durably to the hot tier and rename it into place; its inodes."""
    size = int(manifest["size"])
    tmp = f"{run}/{tmp_dir(step)}"
    # the persister waits for the rename: one upload under the final key, not an upload
    # of the temporary name and a server-side copy
    with ns.publishing(f"{bucket}/{tmp}/"):
        return await _publish(ns, far, ident, bucket, run, step, region, manifest, tmp, size)


async def _publish(ns: NamespaceAPI, far: FarMemory, ident: Identity, bucket: str, run: str,
                   step: int, region: Region, manifest: dict[str, Any], tmp: str,
                   size: int) -> list[int]:

    async def fill_data(fd: int) -> None:
        await far.move(size, BATCH, lambda off, n: _sendfile_all(fd, region.fd, off, n))

    data_path = await _write_temp(ns, fill_data)
    data = await ns.put_file(ident, bucket, f"{tmp}/{DATA}", data_path, size)
    man = await _put_manifest(ns, ident, bucket, tmp, manifest)
    await _rename_step(ns, ident, bucket, run, step)
    return [data.ino, man.ino]


async def write_part(ns: NamespaceAPI, far: FarMemory, ident: Identity, bucket: str, run: str,
                     tmp: str, part: int, region: Region, size: int) -> int:
    """Part ``part`` of a multi-part step from its region into the step's temporary
    directory on hot: durable, not yet published.  Its inode."""

    async def fill(fd: int) -> None:
        await far.move(size, BATCH, lambda off, n: _sendfile_all(fd, region.fd, off, n))

    path = await _write_temp(ns, fill)
    node = await ns.put_file(ident, bucket, f"{run}/{tmp}/{part_name(part)}", path, size)
    return node.ino


async def publish_parts(ns: NamespaceAPI, ident: Identity, bucket: str, run: str, step: int,
                        tmp: str, manifest: dict[str, Any]) -> list[int]:
    """The step's manifest into its temporary directory (which holds the parts written
    here), then the directory renamed to ``step-N``: the step appears whole or not at all.
    The manifest's inode."""
    man = await _put_manifest(ns, ident, bucket, f"{run}/{tmp}", manifest)
    await _rename_step(ns, ident, bucket, run, step, tmp)
    return [man.ino]


async def _put_manifest(ns: NamespaceAPI, ident: Identity, bucket: str, tmp: str,
                        manifest: dict[str, Any]) -> Inode:
    body = json.dumps(manifest, indent=1, sort_keys=True).encode()

    async def fill_manifest(fd: int) -> None:
        await asyncio.to_thread(os.pwrite, fd, body, 0)

    man_path = await _write_temp(ns, fill_manifest)
    return await ns.put_file(ident, bucket, f"{tmp}/{MANIFEST}", man_path, len(body),
                             hashlib.md5(body).hexdigest(),
                             {"content-type": "application/json"})


async def _rename_step(ns: NamespaceAPI, ident: Identity, bucket: str, run: str,
                       step: int, tmp: str = "") -> None:
    """``.tierd-tmp-step-N`` → ``step-N`` in one metadata transaction.  When ``step-N``
    is there already -- the cold store's copy, written by another node that holds parts
    of the same step, listed into this namespace -- the files move in one by one (the
    manifest is the same bytes on every node: the one there stays)."""
    tmp = tmp or tmp_dir(step)
    run_dir = await ns.resolve(ident, f"{bucket}/{run}")
    try:
        await ns.rename(ident, run_dir.ino, tmp.encode(), run_dir.ino,
                        step_dir(step).encode(), RENAME_NOREPLACE)
    except FsError as e:
        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        src = await ns.resolve(ident, f"{bucket}/{run}/{tmp}")
        dst = await ns.resolve(ident, f"{bucket}/{run}/{step_dir(step)}")
        for name, _inode in await ns.listdir(ident, src.ino):
            if name.decode() == MANIFEST:
                with contextlib.suppress(FsError):
                    await ns.rename(ident, src.ino, name, dst.ino, name, RENAME_NOREPLACE)
                continue
            await ns.rename(ident, src.ino, name, dst.ino, name, 0)
        await remove_step_dir(ns, ident, bucket, run, tmp)
    await ns.sync()


#: looks a step directory's removal takes when entries keep arriving (ENOTEMPTY)
REMOVE_TRIES = 8


async def remove_step_dir(ns: NamespaceAPI, ident: Identity, bucket: str, run: str,
                          name: str) -> None:
    """Delete one step directory (or a crash's temporary one) and what it holds: the data
    file or the parts held here, and the manifest.  A part whose write was cancelled as its
    step was dropped may still land after the listing (the rmdir then finds the directory
    not empty): the directory is listed and emptied again, a few times, before giving up."""
    for attempt in range(REMOVE_TRIES):
        try:
            d = await ns.resolve(ident, f"{bucket}/{run}/{name}")
            for leaf, _inode in await ns.listdir(ident, d.ino):
                await ns.delete_object(ident, bucket, f"{run}/{name}/{leaf.decode()}")
            d = await ns.resolve(ident, f"{bucket}/{run}")
            await ns.rmdir(ident, d.ino, name.encode())
            return
        except FsError as e:  # gone already (an implicit directory goes with its last key)
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                return
            if e.errno != errno.ENOTEMPTY or attempt + 1 == REMOVE_TRIES:
                raise
        await asyncio.sleep(0.05 * 2**attempt)


async def read_manifest(ns: NamespaceAPI, ident: Identity, bucket: str, run: str,
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


async def open_data(ns: NamespaceAPI, ident: Identity, bucket: str, run: str,
                    step: int, leaf: str = DATA) -> tuple[int, int, str]:
    """(read-only fd of the whole file ``leaf`` of the step on hot, inode, where it was:
    hot or cold).  The caller owns one hold on the inode (release it with
    ``ns.release_held`` when the reader is done)."""
    inode = await ns.resolve(ident, f"{bucket}/{run}/{step_dir(step)}/{leaf}")
    await ns.access(ident, inode.ino, os.R_OK)
    fd, where = await ns.open_held(inode.ino)
    return fd, inode.ino, where


async def import_remote(ns: NamespaceAPI, ident: Identity, bucket: str, run: str, step: int,
                        leaf: str, size: int, timeout: float) -> None:
    """Make ``step-N/leaf``, written by another node, a name here: it reaches this node
    through the shared cold store (its writer's daemon persists it), so look it up there
    until it is in cold with the size the manifest gives, for up to ``timeout`` s."""
    key = f"{run}/{step_dir(step)}/{leaf}"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        with contextlib.suppress(FsError):
            if (await ns.resolve(ident, f"{bucket}/{key}")).size == size:
                return
        if await ns.cold_size(f"{bucket}/{key}") == size:
            # (the step's directory only: a listing of a few files, metadata only)
            await ns.import_prefix(f"{bucket}/{run}/{step_dir(step)}/")
            with contextlib.suppress(FsError):
                if (await ns.resolve(ident, f"{bucket}/{key}")).size == size:
                    return
        if loop.time() >= deadline:
            raise FsError(errno.ETIMEDOUT, f"{bucket}/{key} ({size} bytes) was written by "
                          "another node and is not in the cold store yet: wait for that "
                          f"node to persist the step (waited {timeout:g} s)")
        await asyncio.sleep(0.2)


async def in_cold(ns: NamespaceAPI, bucket: str, run: str, step: int, leaf: str,
                  size: int | None = None) -> bool:
    """Whether the cold store has ``step-N/leaf`` (of ``size`` bytes when given)."""
    found = await ns.cold_size(f"{bucket}/{run}/{step_dir(step)}/{leaf}")
    return found is not None and (size is None or found == size)


async def cold_manifest(ns: NamespaceAPI, bucket: str, run: str,
                        step: int) -> dict[str, Any] | None:
    """The step's manifest as the cold store has it (written by the node of the job's
    coordinator), or None."""
    key = f"{bucket}/{run}/{step_dir(step)}/{MANIFEST}"
    size = await ns.cold_size(key)
    if size is None:
        return None
    doc = json.loads(await ns.cold_read(key, 0, size))
    return doc if isinstance(doc, dict) else None
