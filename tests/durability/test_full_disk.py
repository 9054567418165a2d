"""Full disks: out of space is an answer, not an error (docs/durability.md, "Full disk").

Real small file systems (a tmpfs mounted here: root only) under a real ``tierd serve`` with
its FUSE mount; S3 through boto3 over HTTP, FUSE through plain ``open``/``write``/``close``.

* the hot tier full of clean (persisted) data: writes through both doors evict and succeed;
* the hot tier full of dirty data: S3 answers 507 InsufficientStorage (XML, no traceback, no
  partial object, no staging file left), FUSE ``write`` fails with ENOSPC; freeing space
  (a DELETE) brings writes back;
* the metadata store's map full (a small ``meta_map_size``): 507 / ENOSPC, never EIO, and
  deletions bring the room back;
* the whole data directory (metadata, hot tier, credentials) on a full file system: SIGKILL,
  the restart works without writing anything, reads work, a DELETE frees space, writes
  come back; a first start on a full disk stops with one clear line;
* backpressure: above ``dirty_limit`` every S3 write that adds dirty bytes (PUT,
  CopyObject, UploadPart, CompleteMultipartUpload) answers 503 SlowDown.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

MiB = 1 << 20
ACCESS_KEY = "FULLDISKROOT"
SECRET_KEY = "full-disk-root-secret-0123456789"
BUCKET = "fullbkt"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root"),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse"),
]


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A small, really full-able file system at ``where`` (unmounted afterwards)."""
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                   check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@dataclass
class Tierd:
    """One ``tierd serve --mount`` process and its doors."""

    proc: subprocess.Popen[bytes]
    data_dir: Path
    mnt: Path
    log_path: Path
    s3_url: str = ""
    admin_url: str = ""

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def s3(self) -> Any:
        return boto3.client(
            "s3", endpoint_url=self.s3_url, aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                          retries={"total_max_attempts": 1}))

    def admin(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        token = (self.data_dir / "admin-token").read_text().strip()
        req = urllib.request.Request(
            self.admin_url + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read() or b"null")

    def persist(self) -> None:
        """Wait until the cold store has every change (what makes data clean)."""
        self.admin("POST", "/v1/placement/persist", {"prefix": "", "timeout": 60})

    def dirty(self) -> int:
        return int(self.admin("GET", "/v1/status")["placement"]["dirty"]["bytes"])

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True, check=False)
        return self.proc.returncode


def start(tmp: Path, data_dir: Path, *args: str, **env: str) -> Tierd:
    """``tierd serve`` on ``data_dir`` with a mount, a ``file://`` cold store outside the
    small file systems, and ``env`` (``TIERD_*``) settings; waits for both doors."""
    mnt = tmp / "mnt"
    mnt.mkdir(exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    environ.update(TIERD_ROOT_ACCESS_KEY=ACCESS_KEY, TIERD_ROOT_SECRET_KEY=SECRET_KEY,
                   TIERD_COLD_URL=f"file://{tmp / 'cold'}", TIERD_LOG_LEVEL="info",
                   TIERD_PERSIST_DELAY="0")
    environ.update(env)
    log_path = tmp / "tierd.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tierd.cli", "serve", "--data-dir", str(data_dir),
             "--mount", str(mnt), "--s3-listen", "127.0.0.1:0", "--admin-listen",
             "127.0.0.1:0", *args], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            env=environ)
    d = Tierd(proc, data_dir, mnt, log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"tierd exited with {proc.returncode}:\n{d.log[-4000:]}")
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads((data_dir / "endpoints.json").read_text())
            if doc.get("pid") == proc.pid and "mount" in doc:
                d.s3_url, d.admin_url = doc["s3"]["url"], doc["admin"]["url"]
                return d
        time.sleep(0.05)
    d.stop(signal.SIGKILL)
    raise AssertionError(f"tierd did not start:\n{d.log[-4000:]}")


def error_of(e: ClientError) -> tuple[int, str]:
    return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"]


def fuse_write(path: Path, nbytes: int) -> None:
    """Write ``nbytes`` to a new file through the mount, 1 MiB per ``write``, and close it
    (the OSError of a failed ``write`` or ``close`` propagates)."""
    chunk = os.urandom(MiB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        while done < nbytes:
            done += os.write(fd, chunk[: min(MiB, nbytes - done)])
    finally:
        os.close(fd)


def until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def staging_files(hot: Path) -> list[Path]:
    return [p for p in (hot / "tmp").iterdir()] if (hot / "tmp").is_dir() else []


def test_hot_tier_full_of_clean_data_evicts_on_the_write_path(tmp_path: Path) -> None:
    """Three times the tier's size written through S3 (PUT, multipart, copy) and FUSE: each
    write evicts persisted data instead of failing, and every byte reads back."""
    with tmpfs(tmp_path / "hot", "64m") as hot:
        d = start(tmp_path, tmp_path / "data", "--hot-dir", str(hot))
        try:
            s3 = d.s3()
            s3.create_bucket(Bucket=BUCKET)
            blobs: dict[str, bytes] = {}
            for i in range(48):
                key, data = f"put/{i}", os.urandom(4 * MiB)
                s3.put_object(Bucket=BUCKET, Key=key, Body=data)
                blobs[key] = data
                if i % 8 == 7:  # persisted: clean, so evictable
                    d.persist()
            for i in range(4):  # a multipart upload and a copy, each 8 MiB
                mpu = s3.create_multipart_upload(Bucket=BUCKET, Key=f"mpu/{i}")
                parts, data = [], os.urandom(8 * MiB)
                for n, piece in ((1, data[:5 * MiB]), (2, data[5 * MiB:])):
                    r = s3.upload_part(Bucket=BUCKET, Key=f"mpu/{i}", PartNumber=n,
                                       UploadId=mpu["UploadId"], Body=piece)
                    parts.append({"PartNumber": n, "ETag": r["ETag"]})
                s3.complete_multipart_upload(Bucket=BUCKET, Key=f"mpu/{i}",
                                             UploadId=mpu["UploadId"],
                                             MultipartUpload={"Parts": parts})
                s3.copy_object(Bucket=BUCKET, Key=f"copy/{i}",
                               CopySource={"Bucket": BUCKET, "Key": f"mpu/{i}"})
                blobs[f"mpu/{i}"] = blobs[f"copy/{i}"] = data
                d.persist()
            (d.mnt / BUCKET / "fuse").mkdir()
            for i in range(12):
                fuse_write(d.mnt / BUCKET / "fuse" / str(i), 4 * MiB)
                if i % 4 == 3:
                    d.persist()
            stat = d.admin("GET", "/v1/status")["placement"]["stats"]
            assert stat.get("write_evicted_bytes", 0) >= 64 * MiB, stat
            for key, data in blobs.items():
                assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == data, key
            for i in range(12):
                assert (d.mnt / BUCKET / "fuse" / str(i)).stat().st_size == 4 * MiB
            assert not staging_files(hot)
        finally:
            d.stop()
        assert "Traceback" not in d.log, d.log[-4000:]


def test_hot_tier_full_of_dirty_data_is_507_and_enospc(tmp_path: Path) -> None:
    """Nothing persisted (a long persist delay): the tier fills with dirty data; S3 writes
    answer 507 InsufficientStorage, FUSE writes ENOSPC; nothing half-written remains; a
    DELETE gives the space back and writes work again."""
    with tmpfs(tmp_path / "hot", "64m") as hot:
        d = start(tmp_path, tmp_path / "data", "--hot-dir", str(hot),
                  TIERD_PERSIST_DELAY="3600")
        try:
            s3 = d.s3()
            s3.create_bucket(Bucket=BUCKET)
            stored = []
            with pytest.raises(ClientError) as ei:
                for i in range(20):
                    s3.put_object(Bucket=BUCKET, Key=f"fill/{i}", Body=os.urandom(4 * MiB))
                    stored.append(f"fill/{i}")
            assert error_of(ei.value) == (507, "InsufficientStorage")
            failed = f"fill/{len(stored)}"
            with pytest.raises(ClientError) as ei:
                s3.head_object(Bucket=BUCKET, Key=failed)
            assert error_of(ei.value)[0] == 404  # no partial object
            with pytest.raises(ClientError) as ei:
                s3.copy_object(Bucket=BUCKET, Key="copy",
                               CopySource={"Bucket": BUCKET, "Key": stored[0]})
            assert error_of(ei.value) == (507, "InsufficientStorage")
            mpu = s3.create_multipart_upload(Bucket=BUCKET, Key="mpu")
            with pytest.raises(ClientError) as ei:
                s3.upload_part(Bucket=BUCKET, Key="mpu", PartNumber=1,
                               UploadId=mpu["UploadId"], Body=os.urandom(8 * MiB))
            assert error_of(ei.value) == (507, "InsufficientStorage")
            s3.abort_multipart_upload(Bucket=BUCKET, Key="mpu", UploadId=mpu["UploadId"])
            with pytest.raises(OSError) as oe:
                fuse_write(d.mnt / BUCKET / "fuse", 8 * MiB)
            assert oe.value.errno == errno.ENOSPC
            assert not staging_files(hot)
            for key in stored:  # what was acknowledged reads back, through both doors
                assert len(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()) == 4 * MiB
            assert (d.mnt / BUCKET / stored[-1]).stat().st_size == 4 * MiB
            for key in stored[:3]:
                s3.delete_object(Bucket=BUCKET, Key=key)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(d.mnt / BUCKET / "fuse")
            data = os.urandom(4 * MiB)
            deadline = time.monotonic() + 20
            while True:  # the deleted files' space comes back once their deletion is durable
                try:
                    s3.put_object(Bucket=BUCKET, Key="after", Body=data)
                    break
                except ClientError as e:
                    assert error_of(e)[0] == 507 and time.monotonic() < deadline
                    time.sleep(0.2)
            assert s3.get_object(Bucket=BUCKET, Key="after")["Body"].read() == data
            fuse_write(d.mnt / BUCKET / "fuse2", MiB)
        finally:
            d.stop()
        log = d.log
        assert "Traceback" not in log, log[-4000:]
        assert "InsufficientStorage" in log  # one line per refusal, with the reason


def test_metadata_map_full_is_507_and_enospc_not_eio(tmp_path: Path) -> None:
    """A 2 MiB lmdb map filled with extended attributes, then with empty files: adding
    metadata fails with 507 / ENOSPC (never "Input/output error"), reads and deletions
    work, and deletions give the room back."""
    d = start(tmp_path, tmp_path / "data", TIERD_META_MAP_SIZE="2MiB")
    try:
        s3 = d.s3()
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key="kept", Body=b"kept")
        base = d.mnt / BUCKET / "x"
        base.mkdir()
        value = os.urandom(60_000)
        made: list[Path] = []
        with pytest.raises(OSError) as oe:
            for i in range(200):
                p = base / f"f{i}"
                p.write_bytes(b"")
                made.append(p)
                for j in range(4):
                    os.setxattr(p, f"user.pad{j}", value)
        assert oe.value.errno == errno.ENOSPC, oe.value
        # the room left (the store's measure of it moves by a few pages): taken through
        # S3 until it answers 507, then through FUSE until ENOSPC
        with pytest.raises(ClientError) as ei:
            for i in range(1000):
                s3.put_object(Bucket=BUCKET, Key=f"more/{i}", Body=b"x" * 60_000)
        assert error_of(ei.value) == (507, "InsufficientStorage")
        with pytest.raises(OSError) as oe:
            for i in range(100_000):
                (base / f"s{i}").write_bytes(b"")
        assert oe.value.errno == errno.ENOSPC, oe.value
        assert s3.get_object(Bucket=BUCKET, Key="kept")["Body"].read() == b"kept"
        assert (base / "f0").exists() and os.getxattr(base / "f0", "user.pad0") == value
        for p in made[: len(made) // 2]:
            p.unlink()
        until(lambda: _put_ok(s3, "after"))
        (d.mnt / BUCKET / "new-file").write_bytes(b"data")
        assert (d.mnt / BUCKET / "new-file").read_bytes() == b"data"
    finally:
        d.stop()
    log = d.log
    assert "Traceback" not in log, log[-4000:]
    assert "metadata store is full" in log and "meta_map_size" in log


def _put_ok(s3: Any, key: str) -> bool:
    try:
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"after")
        return True
    except ClientError as e:
        assert error_of(e) == (507, "InsufficientStorage")
        return False


def test_full_data_dir_sigkill_restart_reads_then_writes_after_delete(
        tmp_path: Path) -> None:
    """The whole data directory on one 64 MiB file system, filled through both doors with
    dirty data; SIGKILL; the daemon starts again on the full disk (it writes nothing it
    already has), serves reads, and takes writes again once a DELETE freed space."""
    with tmpfs(tmp_path / "data", "64m") as data_dir:
        delay = {"TIERD_PERSIST_DELAY": "3600"}
        d = start(tmp_path, data_dir, **delay)
        blobs: dict[str, bytes] = {}
        try:
            s3 = d.s3()
            s3.create_bucket(Bucket=BUCKET)
            with pytest.raises(ClientError) as ei:
                for i in range(20):
                    data = os.urandom(4 * MiB)
                    s3.put_object(Bucket=BUCKET, Key=f"s3/{i}", Body=data)
                    blobs[f"s3/{i}"] = data
            assert error_of(ei.value) == (507, "InsufficientStorage")
            with pytest.raises(OSError) as oe:
                fuse_write(d.mnt / BUCKET / "fuse", 8 * MiB)
            assert oe.value.errno == errno.ENOSPC
        finally:
            d.stop(signal.SIGKILL)
        filler = data_dir / "filler"  # whatever room is left: gone too
        with contextlib.suppress(OSError), open(filler, "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        assert os.statvfs(data_dir).f_bavail == 0
        d = start(tmp_path, data_dir, **delay)
        try:
            s3 = d.s3()
            for key, data in blobs.items():  # reads work on the full disk
                assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == data
            key = next(iter(blobs))
            assert (d.mnt / BUCKET / key).read_bytes() == blobs[key]
            with pytest.raises(ClientError) as ei:
                s3.put_object(Bucket=BUCKET, Key="more", Body=os.urandom(MiB))
            assert error_of(ei.value) == (507, "InsufficientStorage")
            for key in list(blobs)[:4]:
                s3.delete_object(Bucket=BUCKET, Key=key)
            data = os.urandom(4 * MiB)
            until(lambda: _put_data_ok(s3, "after", data))
            assert s3.get_object(Bucket=BUCKET, Key="after")["Body"].read() == data
            fuse_write(d.mnt / BUCKET / "fuse-after", MiB)
        finally:
            d.stop()
        assert "Traceback" not in d.log, d.log[-4000:]


def test_first_start_on_a_full_disk_fails_clearly(tmp_path: Path) -> None:
    """A new data directory on a file system without a free block: the daemon stops with
    one line naming the cause (lmdb used to map its new lock file and die of SIGBUS)."""
    with tmpfs(tmp_path / "fs", "1m") as fs:
        with contextlib.suppress(OSError), open(fs / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        environ = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
        r = subprocess.run(
            [sys.executable, "-m", "tierd.cli", "serve", "--data-dir", str(fs / "data"),
             "--s3-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, env=environ)
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    assert "cannot start" in r.stderr and "No space left on device" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def _put_data_ok(s3: Any, key: str, data: bytes) -> bool:
    try:
        s3.put_object(Bucket=BUCKET, Key=key, Body=data)
        return True
    except ClientError as e:
        assert error_of(e) == (507, "InsufficientStorage")
        return False


def test_every_s3_write_path_honours_dirty_limit(tmp_path: Path) -> None:
    """With 8 MiB of dirty data allowed and a cold store that takes nothing (a read-only
    file system): past the limit PUT, CopyObject, UploadPart and CompleteMultipartUpload
    all answer 503 SlowDown, so dirty data stays where the limit stopped it."""
    with tmpfs(tmp_path / "cold", "1m") as cold:
        (cold / ".tierd-tmp").mkdir()  # what the file:// store makes at start
        subprocess.run(["mount", "-o", "remount,ro", str(cold)], check=True)
        _dirty_limit_holds(start(tmp_path, tmp_path / "data", TIERD_DIRTY_LIMIT="8MiB"))


def _dirty_limit_holds(d: Tierd) -> None:
    try:
        s3 = d.s3()
        s3.create_bucket(Bucket=BUCKET)
        mpu = s3.create_multipart_upload(Bucket=BUCKET, Key="mpu")
        part = s3.upload_part(Bucket=BUCKET, Key="mpu", PartNumber=1,
                              UploadId=mpu["UploadId"], Body=os.urandom(6 * MiB))
        for i in range(3):  # 12 MiB: over the limit
            s3.put_object(Bucket=BUCKET, Key=f"put/{i}", Body=os.urandom(4 * MiB))
        dirty = d.dirty()
        assert dirty > 8 * MiB
        calls = {
            "PutObject": lambda: s3.put_object(Bucket=BUCKET, Key="put/x", Body=b"x"),
            "CopyObject": lambda: s3.copy_object(
                Bucket=BUCKET, Key="copy", CopySource={"Bucket": BUCKET, "Key": "put/0"}),
            "UploadPart": lambda: s3.upload_part(
                Bucket=BUCKET, Key="mpu", PartNumber=2, UploadId=mpu["UploadId"],
                Body=b"y" * 1024),
            "CompleteMultipartUpload": lambda: s3.complete_multipart_upload(
                Bucket=BUCKET, Key="mpu", UploadId=mpu["UploadId"],
                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}),
        }
        for name, call in calls.items():
            with pytest.raises(ClientError) as ei:
                call()
            assert error_of(ei.value) == (503, "SlowDown"), name
        assert d.dirty() == dirty
        for key in ("copy", "mpu"):
            with pytest.raises(ClientError) as ei:
                s3.head_object(Bucket=BUCKET, Key=key)
            assert error_of(ei.value)[0] == 404
    finally:
        d.stop()
