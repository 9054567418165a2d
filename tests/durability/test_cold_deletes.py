"""Cold deletions are durable intentions, and import never resurrects what tierd deleted.

Each test drives a real ``tierd serve`` through its S3 door (boto3) or its FUSE mount (real
programs: ``mv``, ``mkdir``, ``ln -s``, ``mkfifo``), over both cold engines (``file://`` and
a moto server over HTTP), re-lists the cold store (``import_ttl`` 0: every listing and
lookup asks cold) and finally checks, after ``persist --wait``, that the cold store holds
exactly the live keys with their bytes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from .coldlib import Cold, FaultProxy, Tierd, running, wait_for

BUCKET = "cdel"


@pytest.fixture(params=["file", "s3"])
def cold(request: pytest.FixtureRequest, tmp_path: Path) -> Cold:
    server = request.getfixturevalue("moto") if request.param == "s3" else None
    return Cold(request.param, tmp_path, server)


def _absent(s3: object, key: str) -> bool:
    try:
        s3.head_object(Bucket=BUCKET, Key=key)  # type: ignore[attr-defined]
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    return False


def _settled(t: Tierd, live: dict[str, bytes], symlinks: frozenset[str] = frozenset()) -> None:
    """After ``persist --wait``: the doors list exactly ``live`` (and ``symlinks``: the S3
    door lists a symlink as its target's object; cold has no copy of it) and cold holds
    exactly those keys with their bytes."""
    assert t.persist_wait(BUCKET + "/")["persisted"]
    want = {f"{BUCKET}/{k}" for k in live}
    assert {k for k in t.cold.objects() if k.startswith(BUCKET + "/")} == want
    for k, data in live.items():
        assert t.cold.get(f"{BUCKET}/{k}") == data
    assert t.listing(BUCKET) == set(live) | symlinks


def test_overwrite_then_delete_stays_deleted(cold: Cold, tmp_path: Path) -> None:
    """PUT v1, persisted; PUT v2 over it and DELETE before v2 is persisted: the cold copy
    of v1 must go, and no listing or lookup may bring it back (before and after the
    persister ran, and after a SIGKILL)."""
    t = Tierd(tmp_path, cold, TIERD_PERSIST_DELAY="2")
    with running(t):
        s3 = t.s3()
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key="k", Body=b"v1" * 1000)
        s3.put_object(Bucket=BUCKET, Key="keep", Body=b"keep")
        assert t.persist_wait(BUCKET + "/")["persisted"]
        s3.put_object(Bucket=BUCKET, Key="k", Body=b"v2" * 1000)
        s3.delete_object(Bucket=BUCKET, Key="k")
        assert "k" not in t.listing(BUCKET)  # before the persister ran
        assert _absent(s3, "k")
        _settled(t, {"keep": b"keep"})  # after it ran
        assert _absent(s3, "k") and "k" not in t.listing(BUCKET)
    assert "Traceback" not in t.log


def test_delete_then_sigkill_stays_deleted(cold: Cold, tmp_path: Path) -> None:
    """DELETE acknowledged, SIGKILL before the cold delete ran: after the restart the key
    is gone from listings and lookups, and the restarted persister deletes it from cold."""
    t = Tierd(tmp_path, cold, TIERD_PERSIST_DELAY="3")
    with running(t):
        s3 = t.s3()
        s3.create_bucket(Bucket=BUCKET)
        for k in ("a", "b", "c"):
            s3.put_object(Bucket=BUCKET, Key=k, Body=k.encode() * 100)
        assert t.persist_wait(BUCKET + "/")["persisted"]
        s3.put_object(Bucket=BUCKET, Key="b", Body=b"new b")  # an overwrite, not persisted
        s3.delete_object(Bucket=BUCKET, Key="a")
        s3.delete_object(Bucket=BUCKET, Key="b")
        t.kill9()
        t.start()
        s3 = t.s3()
        assert t.listing(BUCKET) == {"c"}
        assert _absent(s3, "a") and _absent(s3, "b")
        _settled(t, {"c": b"c" * 100})


def test_delete_during_a_slow_listing_is_not_undone(moto: object, tmp_path: Path) -> None:
    """A listing of cold that began before the cold delete and ends after it (the store
    answered, then the answer was slow to arrive) must not import the deleted key."""
    with FaultProxy(moto.url) as proxy:  # type: ignore[attr-defined]
        cold = Cold("s3", tmp_path, moto, endpoint=proxy.url)  # type: ignore[arg-type]
        t = Tierd(tmp_path, cold, TIERD_IMPORT_TTL="60")  # what a listing imports stays
        with running(t):
            s3 = t.s3()
            s3.create_bucket(Bucket=BUCKET)
            s3.put_object(Bucket=BUCKET, Key="gone", Body=b"old bytes")
            s3.put_object(Bucket=BUCKET, Key="stays", Body=b"stays")
            assert t.persist_wait(BUCKET + "/")["persisted"]
            proxy.delay_list = 2.0
            seen = proxy.listings
            result: dict[str, set[str]] = {}
            lister = threading.Thread(target=lambda: result.update(first=t.listing(BUCKET)))
            lister.start()
            wait_for(lambda: proxy.listings > seen, 10, "the listing to reach the store")
            s3.delete_object(Bucket=BUCKET, Key="gone")  # the persister deletes it now
            wait_for(lambda: "gone" not in {k.rsplit("/", 1)[-1] for k in cold.objects()}, 10,
                     "the cold delete")
            lister.join(30)
            assert _absent(s3, "gone")  # the late page imported nothing
            assert "gone" not in t.listing(BUCKET)
            proxy.delay_list = 0.0
            _settled(t, {"stays": b"stays"})


@contextlib.contextmanager
def _mounted(tmp_path: Path, cold: Cold) -> Iterator[tuple[Tierd, Path]]:
    """A daemon with a FUSE mount (persist delay 1 s) and the bucket's directory there."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    t = Tierd(tmp_path, cold, mount=True, TIERD_PERSIST_DELAY="1")
    with running(t):
        assert t.mnt is not None
        (t.mnt / BUCKET).mkdir()
        yield t, t.mnt / BUCKET


def test_renamed_temp_files_leave_nothing_in_cold(cold: Cold, tmp_path: Path) -> None:
    """Write-temp-then-rename, twice with the same temporary name; the second temp is
    still being written when the first one's rename is persisted, and renamed before it
    is persisted itself: the first temp's object must not stay in cold or come back in a
    listing (it was once tierd's ``a.tmp``)."""
    with _mounted(tmp_path, cold) as (t, d):
        (d / "a.tmp").write_bytes(b"first")
        assert t.persist_wait(BUCKET + "/")["persisted"]  # a.tmp is in cold
        subprocess.run(["mv", str(d / "a.tmp"), str(d / "a")], check=True)
        with open(d / "a.tmp", "wb") as f:  # the next temp, open with unflushed writes
            f.write(b"sec")
            f.flush()
            wait_for(lambda: f"{BUCKET}/a" in cold.objects(), 30, "the rename in cold")
            f.write(b"ond")
        subprocess.run(["mv", str(d / "a.tmp"), str(d / "b")], check=True)
        assert sorted(os.listdir(d)) == ["a", "b"]
        _settled(t, {"a": b"first", "b": b"second"})
        assert sorted(os.listdir(d)) == ["a", "b"]


@pytest.mark.parametrize("kind", ["dir", "symlink", "fifo"])
def test_non_regular_entry_over_a_persisted_name(cold: Cold, tmp_path: Path,
                                                 kind: str) -> None:
    """``rm f`` then a directory, symlink or FIFO named ``f``: the file's cold object must
    be deleted (not forgotten), so once the new entry goes too, ``f`` does not come back
    with its old bytes."""
    with _mounted(tmp_path, cold) as (t, d):
        (d / "f").write_bytes(b"old bytes of f")
        (d / "other").write_bytes(b"other")
        assert t.persist_wait(BUCKET + "/")["persisted"]
        (d / "f").unlink()
        if kind == "dir":
            (d / "f").mkdir()
            (d / "f" / "inner").write_bytes(b"inner")
        elif kind == "symlink":
            (d / "f").symlink_to("other")
        else:
            os.mkfifo(d / "f")
        live = {"other": b"other"} | ({"f/inner": b"inner"} if kind == "dir" else {})
        _settled(t, live, frozenset({"f"}) if kind == "symlink" else frozenset())
        if kind == "dir":
            (d / "f" / "inner").unlink()
            (d / "f").rmdir()
        else:
            (d / "f").unlink()
        assert sorted(os.listdir(d)) == ["other"]
        assert "f" not in t.listing(BUCKET)
        _settled(t, {"other": b"other"})
        assert sorted(os.listdir(d)) == ["other"]


def test_rotation_of_an_evicted_file_keeps_both(cold: Cold, tmp_path: Path) -> None:
    """``mv ckpt ckpt.old; mv new ckpt`` when ckpt's bytes are only in cold (evicted) and
    the newcomer is persisted first (one upload at a time, the lower inode first): the
    upload over ``ckpt`` must not destroy the only copy of what is now ``ckpt.old``."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    t = Tierd(tmp_path, cold, mount=True, TIERD_PERSIST_DELAY="1",
              TIERD_PERSIST_PARALLEL="1")
    with running(t):
        assert t.mnt is not None
        d = t.mnt / BUCKET
        d.mkdir()
        new, old = os.urandom(3 << 20), os.urandom(5 << 20)
        (d / "new").write_bytes(new)  # the lower inode number
        (d / "ckpt").write_bytes(old)
        assert t.persist_wait(BUCKET + "/")["persisted"]
        # A file the kernel wrote may be uploaded once its close (FLUSH) made it durable,
        # before the kernel's RELEASE of it is handled (asynchronous to the close); until
        # then it is open for writing and eviction skips it: evict until it goes
        wait_for(lambda: t.admin("POST", "/v1/placement/evict",
                                 {"prefix": f"{BUCKET}/ckpt", "tier": "all"})["evicted"] > 0,
                 timeout=10, what="ckpt evicted", every=0.1)
        os.rename(d / "ckpt", d / "ckpt.old")
        os.rename(d / "new", d / "ckpt")
        _settled(t, {"ckpt": new, "ckpt.old": old})
        assert (d / "ckpt.old").read_bytes() == old and (d / "ckpt").read_bytes() == new


def test_hard_links_follow_a_content_change(cold: Cold, tmp_path: Path) -> None:
    """Two names of one file, both in cold; the content changes: both keys get it."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    t = Tierd(tmp_path, cold, mount=True)
    with running(t):
        assert t.mnt is not None
        d = t.mnt / BUCKET
        d.mkdir()
        (d / "f").write_bytes(b"first version")
        os.link(d / "f", d / "g")
        _settled(t, {"f": b"first version", "g": b"first version"})
        (d / "f").write_bytes(b"second")  # O_TRUNC: the same inode, new content
        _settled(t, {"f": b"second", "g": b"second"})


def test_removed_bucket_is_not_recreated_from_cold(moto: object, tmp_path: Path) -> None:
    """A bucket emptied and removed while the store refuses deletes (503), then SIGKILL:
    the restart must not bring the bucket back from the objects still in cold, and once
    the store takes deletes again they are carried out."""
    with FaultProxy(moto.url) as proxy:  # type: ignore[attr-defined]
        cold = Cold("s3", tmp_path, moto, endpoint=proxy.url)  # type: ignore[arg-type]
        t = Tierd(tmp_path, cold)
        with running(t):
            s3 = t.s3()
            s3.create_bucket(Bucket="gone-bucket")
            s3.create_bucket(Bucket=BUCKET)
            s3.put_object(Bucket=BUCKET, Key="stays", Body=b"stays")
            for k in ("a", "b/c"):
                s3.put_object(Bucket="gone-bucket", Key=k, Body=k.encode())
            assert t.persist_wait("gone-bucket/")["persisted"]
            assert t.persist_wait(BUCKET + "/")["persisted"]
            proxy.slowdown, proxy.only = 1.0, {"DELETE", "POST"}  # POST: DeleteObjects
            for k in ("a", "b/c"):
                s3.delete_object(Bucket="gone-bucket", Key=k)
            s3.delete_bucket(Bucket="gone-bucket")
            wait_for(lambda: proxy.refused >= 2, 20, "refused cold deletes")
            t.kill9()
            t.start()
            names = {b["Name"] for b in t.s3().list_buckets()["Buckets"]}
            assert names == {BUCKET}, names
            proxy.slowdown = 0.0
            assert t.persist_wait("", timeout=60)["persisted"]
            assert cold.objects() == {f"{BUCKET}/stays"}
            assert {b["Name"] for b in t.s3().list_buckets()["Buckets"]} == {BUCKET}
