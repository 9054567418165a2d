"""Don't persist what is gone; don't materialise holes.

Through the FUSE mount of a real daemon over a ``file://`` cold store: a 2 GiB sparse file
deleted while its upload runs is not uploaded (the delete cancels the upload), and a
sparse file that stays is stored with its holes (the cold file's allocated blocks are its
data, not its size).  An S3 object cannot have holes (docs/durability.md).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .coldlib import Cold, Tierd, running, wait_for

BUCKET = "cspr"
GiB, MiB = 1 << 30, 1 << 20


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[tuple[Tierd, Path]]:
    """A running daemon with its mount, and the bucket's directory there."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    t = Tierd(tmp_path, Cold("file", tmp_path), mount=True)
    with running(t):
        assert t.mnt is not None
        (t.mnt / BUCKET).mkdir()
        yield t, t.mnt / BUCKET


def test_sparse_file_deleted_during_its_upload_is_not_uploaded(mounted: tuple[Tierd, Path]) -> None:
    t, d = mounted
    subprocess.run(["truncate", "-s", "2G", str(d / "big")], check=True)
    tmp = t.cold.root / ".tierd-tmp"  # where a file:// upload writes before its rename
    wait_for(lambda: any(tmp.iterdir()), 20, "the upload to start", every=0.005)
    (d / "big").unlink()  # while it is being uploaded
    (d / "small").write_bytes(b"small")
    assert t.persist_wait(BUCKET + "/", timeout=60)["persisted"]
    stats = t.status()["placement"]["stats"]
    assert stats.get("uploaded_bytes", 0) < GiB, stats  # "small" only, not 2 GiB
    assert t.cold.objects() == {f"{BUCKET}/small"}
    assert not list(tmp.iterdir())


def test_sparse_file_keeps_its_holes_in_a_file_cold_store(mounted: tuple[Tierd, Path]) -> None:
    t, d = mounted
    data = os.urandom(MiB)
    with open(d / "sparse", "wb") as f:
        f.truncate(256 * MiB)
        f.seek(128 * MiB)
        f.write(data)
    assert t.persist_wait(BUCKET + "/", timeout=60)["persisted"]
    p = t.cold.root / BUCKET / "sparse"
    wait_for(p.exists, 10, "the cold object")
    st = p.stat()
    assert st.st_size == 256 * MiB
    assert st.st_blocks * 512 < 8 * MiB, st  # 1 MiB of data, not 256 MiB of zeros
    h = hashlib.md5(usedforsecurity=False)
    with open(p, "rb") as f:
        while chunk := f.read(8 * MiB):
            h.update(chunk)
    want = hashlib.md5(bytes(128 * MiB) + data + bytes(127 * MiB),
                       usedforsecurity=False)
    assert h.hexdigest() == want.hexdigest()
    # and it reads back from cold as it was written
    assert t.admin("POST", "/v1/placement/evict",
                   {"prefix": f"{BUCKET}/sparse", "tier": "all"})["evicted"] > 0
    with open(d / "sparse", "rb") as f:
        f.seek(128 * MiB)
        assert f.read(MiB) == data
