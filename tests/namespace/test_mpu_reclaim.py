"""How a node of a cluster reclaims its multipart part files when other nodes' commits left
them unneeded (tierd/namespace/mpu_remote.py Reclaimer): a real metadata store and real
upload directories; the change feed's keys are handed in as the feed hands them."""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from tierd.errors import FsError
from tierd.meta import MetaStore, MultipartUpload, UploadPart
from tierd.namespace.mpu_parts import PartStore, UploadState
from tierd.namespace.mpu_remote import Reclaimer, holder, local_parts

UP = "upload-one"


@pytest.fixture
def meta(tmp_path: Path) -> Iterator[MetaStore]:
    store = MetaStore.open_lmdb(tmp_path / "meta")
    store.node = "n2"
    try:
        yield store
    finally:
        store.close()


def _part(n: int, node: str, file: str = "", slot: int = 0) -> UploadPart:
    return UploadPart(n, f"{n:032x}", 10, 1, {}, slot, file, node)


def _pkey(upload: str, n: int) -> bytes:
    return b"P" + upload.encode() + b"\0" + struct.pack(">I", n)


def _files(parts: PartStore, upload: str) -> set[str]:
    return set(os.listdir(parts.dir(upload)))


async def _settled(r: Reclaimer) -> None:
    assert r._task is not None
    await r._task


def test_holder_defaults_to_the_upload_node() -> None:
    up = MultipartUpload(UP, "b", "k", 0, 0, 1, {}, "n1")
    # a record written before parts named their node: seven fields
    old = UploadPart.decode(msgpack.packb([1, "0" * 32, 10, 1, {}, 0, "p1-x"]))
    assert old.node == "" and holder(up, old) == "n1"
    assert [p.number for p in local_parts(up, [_part(1, ""), _part(2, "n2")], "n2")] == [2]
    assert local_parts(None, [_part(2, "n2")], "n2") == []


async def test_part_changes_reclaim_only_unneeded_files_of_those_parts(
        meta: MetaStore, tmp_path: Path) -> None:
    parts = PartStore(str(tmp_path / "mpu"))
    parts.create(UP)
    with meta.write() as tx:
        tx.put_upload(MultipartUpload(UP, "b", "k", 0, 0, 1, {}, "n1"))
        tx.put_part(UP, _part(1, "n2", "p1-keep"))
        tx.put_part(UP, _part(2, "n1"))  # uploaded again through n1: n2's copy is garbage
        tx.put_part(UP, _part(3, "n2", slot=10))
    for name in ("data", "p1-keep", "p1-old", "p2-moved", "p3-writing", "4"):
        (Path(parts.dir(UP)) / name).write_bytes(b"x")
    parts._states[UP] = UploadState(files={"p3-writing"})  # a part being written here
    r = Reclaimer(meta, parts)

    r.changed([_pkey(UP, 2)])  # part 2 changed: its files alone are looked at
    await _settled(r)
    assert _files(parts, UP) == {"data", "p1-keep", "p1-old", "p3-writing", "4"}
    r.changed(None)  # a gap in the feed: everything is reconciled
    await _settled(r)
    assert _files(parts, UP) == {"data", "p1-keep", "p3-writing"}
    assert r.removed == 3

    other = "upload-two"  # a directory of an upload that no longer exists ...
    parts.create(other)
    (Path(parts.dir(other)) / "data").write_bytes(b"y")
    with meta.write() as tx:  # ... and this one ended on another node
        tx.delete_upload(UP)
        tx.delete_parts(UP)
    r.changed([b"M" + UP.encode(), _pkey(UP, 1)])
    await _settled(r)
    assert not os.path.exists(parts.dir(UP))
    assert parts._states.get(UP) is None  # writers here are told the upload ended
    r.changed(None)
    await _settled(r)
    assert not os.path.exists(parts.dir(other))


async def test_malformed_upload_ids_never_become_paths(meta: MetaStore, tmp_path: Path) -> None:
    """Ids reach the part store from the change feed too: an empty one named the parts root
    itself, which a sweep of 'an upload with no record' would have removed whole."""
    parts = PartStore(str(tmp_path / "mpu"))
    parts.create(UP)
    (Path(parts.dir(UP)) / "data").write_bytes(b"x")
    for bad in ("", ".", "..", "../mpu", "a/b", "x" * 129):
        with pytest.raises(FsError) as e:
            parts.dir(bad)
        assert e.value.errno == errno.EINVAL
    r = Reclaimer(meta, parts)
    r.changed([b"M", b"M..", b"P\0" + struct.pack(">I", 1)])
    await _settled(r)
    assert _files(parts, UP) == {"data"}  # the other upload's directory is untouched
    assert os.path.isdir(tmp_path / "mpu")
