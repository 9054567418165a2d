"""Import changes the file tree through the namespace's own rules (tierd/namespace/imports.py):
bucket names as S3 creates them and links as a mkdir makes them (refused keys:
tests/s3/test_cold_keys.py; never resurrecting a deleted key: tests/durability)."""

from __future__ import annotations

import errno

import pytest

from tierd.errors import FsError
from tierd.meta import ROOT_INO

from .conftest import ROOT, Env


async def test_cold_prefixes_that_are_not_bucket_names_do_not_become_buckets(
        file_env: Env) -> None:
    """Neither door could create ``Bad_Name`` or ``ab`` (check_bucket_name): such a
    top-level prefix of the cold store is not imported as a bucket; a valid one is, and
    the root counts it as a subdirectory (nlink), so removing it later leaves the root's
    link count right."""
    file_env.raw_put("Bad_Name/k", b"x")
    file_env.raw_put("ab/k", b"x")
    file_env.raw_put("good-bucket/k", b"x")
    ns, _ = await file_env.open()
    try:
        names = sorted(b.name for b in await ns.list_buckets(ROOT))
        assert names == ["good-bucket"]
        with pytest.raises(FsError) as ei:
            await ns.resolve(ROOT, "Bad_Name")
        assert ei.value.errno == errno.ENOENT
        root = await ns.getattr(ROOT, ROOT_INO)
        assert root.nlink == 3  # ".", "..", and the one imported bucket
        await ns.create_bucket(ROOT, "made-here")
        assert (await ns.getattr(ROOT, ROOT_INO)).nlink == 4
        await ns.delete_object(ROOT, "good-bucket", "k")
        await ns.delete_bucket(ROOT, "good-bucket")
        assert (await ns.getattr(ROOT, ROOT_INO)).nlink == 3
    finally:
        await file_env.close()

