"""Hot data files have one owner, the hot tier: the namespace's open file, placement's reads
and the persister's upload all use the tier's one descriptor of the file."""

from __future__ import annotations

import os

from .conftest import ROOT, Env, MiB


def _descriptors_of(path: str) -> int:
    n = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == path:
                n += 1
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor)
    return n


async def test_an_open_file_has_one_descriptor_for_writes_reads_and_uploads(
        file_env: Env) -> None:
    ns, p = await file_env.open()
    try:
        b = await ns.create_bucket(ROOT, "onefd")
        payload = os.urandom(MiB + 5)
        inode, fh = await ns.create(ROOT, b.ino, b"f", 0o644, os.O_RDWR)
        await ns.write(fh, 0, payload)
        await ns.fsync(fh)
        assert await p.drain(timeout=30)  # the upload read the file through the tier
        assert file_env.raw_get("onefd/f") == payload
        assert await ns.read(fh, 0, len(payload)) == payload  # placement's read path
        path = p.hot.path(inode.ino)
        assert ns.hot.path(inode.ino) == path
        assert _descriptors_of(path) == 1
        await ns.release(fh)
        fh = await ns.open(ROOT, inode.ino, os.O_RDONLY)
        assert await ns.read(fh, MiB, 5) == payload[MiB:]
        assert _descriptors_of(path) == 1  # the cached one, taken again
        await ns.release(fh)
    finally:
        await file_env.close()
